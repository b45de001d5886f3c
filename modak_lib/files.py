"""Writing MODAK's own files safely into a directory the user named.

A directory may come from someone else's archive: a name MODAK writes may already be a
symbolic link to a file elsewhere.  Every write here creates a new temporary file inside the
directory (``O_EXCL``: never through a link), sets its mode on the open descriptor, and
renames it over the name (atomic: a killed run leaves the old file or the new one, and two
writers never share a temporary name).  A name that is a link is refused, not followed.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Union

from .errors import ModakError

PathLike = Union[str, "os.PathLike[str]"]


class UnsafePathError(ModakError):
    """A directory or file MODAK would write through is a symbolic link or not a directory."""


def ensure_dir(directory: PathLike) -> Path:
    """Create ``directory`` (and parents) unless it exists; refuse a link or a non-directory."""
    d = Path(directory)
    if d.is_symlink():
        raise UnsafePathError(f"{d}: is a symbolic link; MODAK writes only into a real directory")
    d.mkdir(parents=True, exist_ok=True)
    if not d.is_dir():
        raise UnsafePathError(f"{d}: is not a directory")
    return d


def check_targets(directory: PathLike, names) -> None:
    """Refuse before writing anything when ``directory`` or a name in it that MODAK will
    write is a symbolic link (or not a regular file): all of a plan's files or none."""
    d = Path(directory)
    if d.is_symlink():
        raise UnsafePathError(f"{d}: is a symbolic link; MODAK writes only into a real directory")
    for name in names:
        path = d / name
        if path.is_symlink():
            raise UnsafePathError(f"{path}: is a symbolic link; MODAK does not write through "
                                  "links (remove it, or choose another directory)")
        if path.exists() and not path.is_file():
            raise UnsafePathError(f"{path}: exists and is not a regular file")


def write_atomic(directory: PathLike, name: str, data: Union[str, bytes],
                 mode: int = 0o644) -> Path:
    """Write ``data`` as ``directory/name`` without following links; return the path.

    Returns without writing when the file already holds exactly ``data`` with ``mode``
    (so that re-running a plan does not touch an unchanged file).
    """
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePathError(f"{name!r}: not a plain file name")
    d = ensure_dir(directory)
    path = d / name
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"{path}: is a symbolic link; MODAK does not write through "
                                  "links (remove it, or choose another directory)")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path}: exists and is not a regular file")
        if stat.S_IMODE(st.st_mode) == mode and st.st_size == len(raw):
            with open(path, "rb") as f:
                if f.read() == raw:
                    return path
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
