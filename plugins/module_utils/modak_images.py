# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MODAK's images on an HPC front-end: what is kept of each, and which runs use it.

Runs on the front-end (old Pythons, no MODAK installed): standard library only. Under an
image directory (``log_dir``, the target's ``image_dir``):

- ``.built/SAFE``: the completion record ``modak_image`` writes once the builder
  succeeded (the image exists); ``.built/SAFE.json`` beside it, what removing the image
  takes (the runtime, its ``remove`` command line filled in, a ``size`` one where the
  runtime has it, whether the image is a file, and the command that clears the builder's
  cache of what no image uses, ``cache_gc``, where it has one): written at the build, and
  at the first use of an image that an older MODAK built;
- ``.used/SAFE/RUN``: a lease, one a run that uses the image (a job, a search's trial),
  taken before the image is built or used and released when its job has ended; a lease not
  released (a deploy that never waited for its job) stops counting after ``stale_days``;
- ``.used/SAFE.last``: touched when a lease is taken and when it is given back: the
  image's last use;
- ``.used/.lock``: taken (``flock``) while a lease is written (and the image's presence
  checked, for the run to build it when it is gone) and while an image is removed.

SAFE is the image reference with every character but letters, digits and ``_.-``
replaced (:func:`safe`).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import json
import os
import pwd
import re
import time

DAY_S = 86400.0


def safe(ref):
    """An image reference as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", ref)


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (IOError, OSError):
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def lock_holder(lock):
    """The process id of the build holding ``lock``; -1 while its writer has taken it but
    the build's shell has not written its id yet; None when no live build holds it."""
    pid = read(lock)
    if pid and pid.isdigit():
        return int(pid) if alive(int(pid)) else None
    try:
        young = time.time() - os.stat(lock).st_mtime < 120
    except OSError:
        return None
    return -1 if pid == "starting" and young else None


def _fill(words, values, build_args):
    """argv words with their {placeholders} filled; {build_args} becomes its words."""
    out = []
    for word in words:
        if word == "{build_args}":
            out += build_args
            continue
        for key, value in values.items():
            word = word.replace("{%s}" % key, value)
        out.append(word)
    return out


def builder_commands(builder, image, recipe, context, build_args):
    """The runtime backend's commands for this image (argv): build, exists, remove, and
    size and cache_gc where it has them."""
    args = []
    for key, value in sorted(dict(builder.get("build_args") or {}, **build_args).items()):
        args += [builder.get("build_arg", "--build-arg"), "%s=%s" % (key, value)]
    values = {"image": image, "recipe": recipe, "context": context, "partial": image + ".partial"}
    return dict((what, _fill(builder[what]["argv"], values, args))
                for what in ("exists", "build", "remove", "size", "cache_gc") if what in builder)


def fill(argv, image):
    """A command line of the image alone (remove, size) with its {image} filled."""
    return _fill(argv, {"image": image}, [])


def present(run_command, exists, listed, image, env=None, cwd=None):
    """Whether the builder has the image: its ``exists`` command line succeeds (``listed``:
    and its output names the image). ``run_command``: an AnsibleModule's."""
    rc, out, dummy = run_command(exists, environ_update=env, cwd=cwd)
    return rc == 0 and (not listed or image in out.split())


def under_home(path):
    """A relative path is under the login's home (a file image's, as the plan names it)."""
    return path if os.path.isabs(path) else os.path.join(pwd.getpwuid(os.getuid()).pw_dir, path)


def marker(log_dir, image):
    return os.path.join(log_dir, ".built", safe(image))


def build_lock(log_dir, image):
    return os.path.join(log_dir, ".building", safe(image) + ".pid")


def builds_running(log_dir, but=None):
    """The images of ``log_dir`` (by their SAFE names) whose build runs now, the build whose
    lock is ``but`` aside."""
    folder = os.path.join(log_dir, ".building")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [name[:-4] for name in names if name.endswith(".pid")
            and os.path.join(folder, name) != but
            and lock_holder(os.path.join(folder, name)) is not None]


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def write_record(log_dir, image, runtime, remove, size=None, is_file=False, exists=None,
                 listed=False, cache_gc=None):
    """What removing ``image`` takes, beside its completion record (replaced atomically):
    its ``remove`` and ``size`` command lines, ``exists`` (``listed``: the image is
    there when the output names it) to tell a removal that failed from an image already
    gone, and ``cache_gc``, what clears its builder's cache of what no image uses."""
    path = marker(log_dir, image) + ".json"
    record = {"image": image, "runtime": runtime, "remove": list(remove),
              "size": list(size) if size else None, "file": bool(is_file),
              "exists": list(exists) if exists else None, "listed": bool(listed),
              "cache_gc": list(cache_gc) if cache_gc else None}
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(path + ".tmp", path)


class Leases(object):
    """The leases of an image directory, under its lock (``with Leases(dir) as l:``)."""

    def __init__(self, log_dir):
        self.dir = os.path.join(log_dir, ".used")
        self._fd = None

    def __enter__(self):
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir)
        self._fd = os.open(os.path.join(self.dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def take(self, image, run, where=""):
        """Lease ``image`` for ``run`` (``where``: its run directory, for the listing)."""
        holders = os.path.join(self.dir, safe(image))
        if not os.path.isdir(holders):
            os.makedirs(holders)
        with open(os.path.join(holders, safe(run)), "w") as f:
            f.write("%s\n%s\n" % (image, where))
        self._used(image)

    def give_back(self, image, run):
        """Release ``run``'s lease of ``image`` (its job has ended: the image's last use is
        now); False where it held none."""
        try:
            os.unlink(os.path.join(self.dir, safe(image), safe(run)))
        except OSError:
            return False
        self._used(image)
        return True

    def _last(self, image):
        return os.path.join(self.dir, safe(image) + ".last")

    def _used(self, image):
        """The image's last use is now."""
        with open(self._last(image), "w") as f:
            f.write("%s\n" % image)

    def held(self, image):
        """``image``'s leases: [(run, its run directory, seconds since it was taken)]."""
        holders = os.path.join(self.dir, safe(image))
        try:
            names = sorted(os.listdir(holders))
        except OSError:
            return []
        now, out = time.time(), []
        for name in names:
            path = os.path.join(holders, name)
            lines = (read(path) or "").splitlines()
            taken = _mtime(path)
            if taken is not None:
                out.append((name, lines[1] if len(lines) > 1 else "", now - taken))
        return out

    def last_use(self, image):
        return _mtime(self._last(image))

    def forget(self, image):
        """Remove what is kept of ``image``'s use (after the image itself was removed)."""
        holders = os.path.join(self.dir, safe(image))
        for name in os.listdir(holders) if os.path.isdir(holders) else []:
            os.unlink(os.path.join(holders, name))
        if os.path.isdir(holders):
            os.rmdir(holders)
        if os.path.exists(self._last(image)):
            os.unlink(self._last(image))


def record_of(log_dir, image):
    """The image's build record in ``log_dir`` (:func:`write_record`), or None."""
    try:
        with open(marker(log_dir, image) + ".json") as f:
            record = json.load(f)
    except (IOError, OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("image") == image else None


def built(log_dir):
    """The images with a completion record in ``log_dir``: [(image, record or None,
    built at)]; the reference is the record's, else the completion line's first word."""
    folder = os.path.join(log_dir, ".built")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if name.endswith(".json") or name.endswith(".tmp"):
            continue
        path = os.path.join(folder, name)
        record = None
        try:
            with open(path + ".json") as f:
                record = json.load(f)
        except (IOError, OSError, ValueError):
            pass
        if not isinstance(record, dict) or not isinstance(record.get("image"), str) or \
                safe(record["image"]) != name:
            record = None
        words = (read(path) or "").split()
        image = record["image"] if record else (words[0] if words else name)
        out.append((image, record, _mtime(path)))
    return out
