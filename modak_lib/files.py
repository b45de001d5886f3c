"""Writing MODAK's own files safely into a directory the user named.

A directory may come from someone else's archive: a name MODAK writes may already be a
symbolic link to a file elsewhere.  Every write here creates a new temporary file inside the
directory (``O_EXCL``: never through a link), sets its mode on the open descriptor, and
renames it over the name (atomic: a killed run leaves the old file or the new one, and two
writers never share a temporary name).  A name that is a link is refused, not followed.
"""
from __future__ import annotations

import contextlib
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
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # (a file, not a directory, by that name)
        raise UnsafePathError(f"{d}: is not a directory") from None
    except OSError as exc:  # (no such parent, a read-only or special file system)
        raise UnsafePathError(f"{d}: cannot create it as a directory ({exc.strerror})") from None
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
    try:
        with _replacing(d, name) as f:
            f.write(raw)
            os.fchmod(f.fileno(), mode)
    except OSError as exc:  # (no permission, a full disk)
        raise UnsafePathError(f"{path}: cannot write it ({exc.strerror})") from None
    return path


@contextlib.contextmanager
def _replacing(d: Path, name: str):
    """A new temporary file in ``d``, open for writing, renamed over ``d/name`` once the
    block ends; removed if it fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, d / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def pack(entries, path: PathLike) -> dict:
    """Write ``entries`` (``(source, name, mode)``; ``mode`` None keeps the source's) as one
    gzip'd tar at ``path``, to be unpacked into a run directory in one transfer.

    Each name must be a relative path inside that directory (no ``..``, no absolute path, each
    name once); each source must be a regular file, opened without following a link.  Members
    are plain files owned by uid 0 with no user name (unpacked as whoever unpacks them), with
    their source's modification time, in name order, in a gzip stream without a time stamp:
    the same files make the same archive.  Returns the number of files and their bytes.
    """
    import gzip
    import tarfile

    seen = set()
    files = []
    for src, name, mode in entries:
        # (an empty part is a leading "/", a "//" or a trailing "/")
        if any(p in ("", ".", "..") for p in name.split("/")):
            raise UnsafePathError(f"{name!r}: not a relative path inside the run directory")
        if name in seen:
            raise UnsafePathError(f"{name!r}: named twice")
        seen.add(name)
        files.append((name, src, mode))
    files.sort()
    out = Path(path)
    total = 0
    with _replacing(ensure_dir(out.parent), out.name) as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, src, mode in files:
            try:
                sfd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                raise UnsafePathError(f"{src}: cannot be read ({exc.strerror}); a "
                                      "symbolic link is not followed") from exc
            st = os.fstat(sfd)
            if not stat.S_ISREG(st.st_mode):
                os.close(sfd)
                raise UnsafePathError(f"{src}: is not a regular file")
            with os.fdopen(sfd, "rb") as f:
                info = tarfile.TarInfo(name)
                info.size = st.st_size
                info.mode = stat.S_IMODE(st.st_mode) & 0o777 if mode is None else mode
                info.mtime = int(st.st_mtime)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, f)
                total += st.st_size
    return {"files": len(files), "bytes": total}
