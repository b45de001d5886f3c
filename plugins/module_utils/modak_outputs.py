# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The script's outputs (``application.outputs``) from its run directory to the controller.

On the front-end, :func:`pack` puts the listed files and folders of the run directory into
one gzip'd tar: regular files and folders only, each inside the run directory (a path
through a symbolic link, a link inside a folder, a device or a pipe is left out and named),
within a size limit.  On the controller, :func:`unpack` puts the archive's regular files and
folders under the results folder, and nothing else: the front-end is where the user's script
ran, and an archive it could have changed must not write outside that folder.  Standard
library only (the front-end's own Python runs it).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import posixpath
import stat
import tarfile
import tempfile


class OutputsError(Exception):
    pass


def _relative(path):
    """``path`` normalised, or None where it is not a plain relative path."""
    if not path or path.startswith("/") or "\0" in path:
        return None
    norm = posixpath.normpath(path)
    if norm in (".", "..") or norm.startswith("../"):
        return None
    return norm


def _through_link(run_dir, rel):
    """Whether a component of ``rel`` below ``run_dir`` (itself included) is a link."""
    path = run_dir
    for part in rel.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return True
    return False


def collect(run_dir, paths, max_bytes):
    """(members, missing, skipped, total bytes): ``members`` the (absolute path, name in
    the archive) of the regular files and folders that ``paths`` name in ``run_dir``;
    ``skipped`` (name, why) what was left out; raises :class:`OutputsError` past
    ``max_bytes``."""
    run_dir = os.path.realpath(run_dir)
    members, missing, skipped, seen = [], [], [], set()
    total = 0
    for given in paths:
        rel = _relative(given)
        if rel is None:
            skipped.append((given, "not a path inside the run directory"))
            continue
        full = os.path.join(run_dir, rel)
        if not os.path.lexists(full):
            missing.append(rel)
            continue
        if _through_link(run_dir, rel):
            skipped.append((rel, "a symbolic link, or inside one"))
            continue
        todo = [(full, rel)]
        while todo:
            path, name = todo.pop()
            if name in seen:
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                skipped.append((name, "a symbolic link"))
            elif stat.S_ISDIR(st.st_mode):
                seen.add(name)
                members.append((path, name))
                for entry in sorted(os.listdir(path), reverse=True):
                    todo.append((os.path.join(path, entry), name + "/" + entry))
            elif stat.S_ISREG(st.st_mode):
                seen.add(name)
                members.append((path, name))
                total += st.st_size
                if total > max_bytes:
                    raise OutputsError(
                        "the outputs come to more than %d MiB (the limit, "
                        "modak_outputs_max_mb): fetch them from %s yourself"
                        % (max_bytes // 2 ** 20, run_dir))
            else:
                skipped.append((name, "not a regular file or folder"))
    return members, missing, skipped, total


def pack(run_dir, paths, archive, max_bytes):
    """Write the archive of :func:`collect`'s members to ``archive`` (whole: a temporary
    file renamed into place); None for the archive where no member was found."""
    members, missing, skipped, total = collect(run_dir, paths, max_bytes)
    result = dict(missing=missing, skipped=[], files=[], bytes=total, archive=None)
    if members:
        fd, tmp = tempfile.mkstemp(prefix=".modak-outputs-", dir=os.path.dirname(archive))
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                for path, name in members:
                    try:  # (opened before its header is written: a failure adds nothing)
                        tar.add(path, arcname=name, recursive=False)
                    except OSError as exc:  # (unreadable, or gone since it was listed)
                        skipped.append((name, "not readable: %s" % exc.strerror))
                        continue
                    if not os.path.isdir(path):
                        result["files"].append(name)
            os.rename(tmp, archive)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        result["archive"] = archive
    result["files"].sort()
    result["skipped"] = ["%s (%s)" % (n, w) for n, w in skipped]
    return result


def _write_member(tar, member, target):
    """One member at ``target``: a folder made, a file written whole (temporary, renamed)."""
    if member.isdir():
        if not os.path.isdir(target):
            os.makedirs(target, mode=0o755)
        return
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755)
    source = tar.extractfile(member)
    fd, tmp = tempfile.mkstemp(prefix=".modak-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
        os.chmod(tmp, 0o644)
        if os.path.isdir(target):
            raise IsADirectoryError(target)
        os.rename(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def unpack(archive, dest):
    """Extract ``archive``'s regular files and folders under ``dest``; a member of any
    other kind, or whose name leads outside ``dest``, is left out and named.  Returns
    (files written, members left out)."""
    dest = os.path.realpath(dest)
    written, refused = [], []
    with tarfile.open(archive, mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = _relative(member.name)
            if rel is None or not (member.isreg() or member.isdir()):
                refused.append(member.name)
                continue
            target = os.path.join(dest, rel)
            if _through_link(dest, rel):
                refused.append(member.name)
                continue
            try:
                _write_member(tar, member, target)
            except OSError:  # (a folder where a file goes, or the other way round)
                refused.append(member.name)
                continue
            if member.isreg():
                written.append(rel)
    return written, refused
