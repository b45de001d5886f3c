#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_image
short_description: Ensure a MODAK container image exists on an HPC front-end
version_added: "0.1.0"
description:
  - Builds a container image from a recipe rendered by MODAK with the front-end's own
    builder (C(podman build), C(ch-image build), C(apptainer build --fakeroot)), unless an
    image built from the same recipe is already there.
  - MODAK names images by the recipe's content hash, so the same recipe is never rebuilt.
    A build is recorded as complete only after the builder succeeded; a killed or failed
    build leaves no record, and the next run builds again.
  - One build per image at a time. The build runs detached on the front-end (its own
    session, its output in the build log) under a lock file holding its process id; a
    second call while it runs attaches to it instead of starting another. A build whose
    process is gone without a result (killed, or the front-end restarted) is cleaned up
    (its lock and partial file; what the builder leaves behind when its data says how to
    find it - for Podman, buildah's working containers created since that build started -
    when no other build of O(log_dir) runs) and started again. Podman's committed layers
    are kept, for the next build to reuse.
  - A failed build fails the task with the build log's end. Where the log says, on a line
    naming it, that the recipe's base image could be neither found nor pulled, the message
    names that image and says to pull or import it on the front-end first.
  - Waiting is done by the controller (an action plugin), which prints the build's current
    step and the time since it started at every poll, and gives up after O(timeout)
    seconds (the build goes on; the same task run again attaches to it).
  - Uses only the Python standard library, so that it runs with a front-end's own Python.
options:
  runtime:
    description:
      - The container runtime's name (C(podman), C(charliecloud), C(apptainer)), for
        messages and for the action plugin to fill O(builder).
    type: str
    required: true
  builder:
    description:
      - The runtime backend's image commands (the plan's C(image.builder)) - build, exists
        and remove, where the image lives, what a killed build leaves. The module knows no
        runtime itself and executes these.
      - Filled by the action plugin from O(runtime) when omitted.
    type: dict
  image:
    description:
      - The image reference MODAK planned (podman C(localhost/NAME:TAG), charliecloud
        C(NAME:TAG), apptainer the SIF file's path; a relative file path is under the
        login's home).
    type: str
    required: true
  recipe:
    description: The recipe file (Containerfile, Charliecloud Dockerfile, Apptainer definition).
    type: path
    required: true
  context:
    description: The build context directory (it may hold C(wheels/) and C(certs/)).
    type: path
    required: true
  build_args:
    description: Build arguments (C(--build-arg NAME=VALUE)).
    type: dict
    default: {}
  log_dir:
    description: Where the build log and the completion records are kept.
    type: path
    required: true
  state:
    description: V(present) builds when missing; V(absent) removes the image.
    type: str
    choices: [present, absent]
    default: present
  wait:
    description:
      - V(false) starts (or attaches to) the build and returns at once with its progress
        (RV(building), RV(step)); the action plugin calls it so every O(poll) seconds.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for a build (then it fails, the build going on).
    type: int
    default: 7200
  poll:
    description: Seconds between two looks at a running build.
    type: int
    default: 10
author:
  - MODAK developers (@modak)
notes:
  - Supports check mode; a build that would happen reports C(changed) without building.
"""

EXAMPLES = r"""
- name: Build the training image unless it exists
  modak.modak.modak_image:
    runtime: podman
    image: localhost/modak/pytorch-2.13.0-cpu:dddf966f7121
    recipe: ~/modak-images/build-dddf966f7121/Containerfile
    context: ~/modak-images/build-dddf966f7121
    log_dir: ~/modak-images
"""

RETURN = r"""
built:
  description: Whether this call built the image.
  returned: always
  type: bool
exists:
  description: Whether an image of the same recipe was there before this call (it is reused).
  returned: always
  type: bool
image:
  description: The image reference.
  returned: always
  type: str
build_log:
  description: Path of the build log on the front-end.
  returned: always
  type: str
duration_s:
  description: Seconds the build took.
  returned: when built
  type: float
building:
  description: Whether a build of the image is running now (O(wait=false)).
  returned: always
  type: bool
step:
  description: The build's current step (the builder's last C(STEP n/m) line, else its last line).
  returned: while building
  type: str
running_s:
  description: Seconds since the running build started.
  returned: while building
  type: float
cleaned:
  description: What was cleaned up after a killed build of the image.
  returned: when a killed build was found
  type: str
"""

import errno
import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modak.modak.plugins.module_utils.modak_images import (
    builder_commands, builds_running, lock_holder, marker as completion_marker, present, read,
    safe, under_home, write_record)


STEP = re.compile(r"^(STEP \d+/\d+: .*|\d+\. .*|INFO: .*)$")


def _current_step(log):
    """The builder's latest step line (podman STEP n/m, ch-image's numbered lines), else
    the log's last line, for a progress report."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except (IOError, OSError):
        return ""
    lines = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("$ ")]
    for line in reversed(lines):
        if STEP.match(line):
            return line[:160]
    return lines[-1][:160] if lines else ""


# the recipe's base image (a Containerfile's first FROM, an Apptainer definition's From:)
BASE = re.compile(r"^\s*(?:FROM|From:)\s+(\S+)", re.M)
# a builder's words for an image it could neither find in its store nor pull
NO_IMAGE = re.compile(r"image not known|pinging container registry|initializing source|"
                      r"manifest unknown|no such host|connection refused|not found|"
                      r"unauthorized|denied", re.I)


def base_unavailable(recipe, log_tail):
    """The recipe's base image where a failed build's log says, on a line naming it, that
    it could not be found or pulled (None otherwise): the message then says what to do,
    not only the builder's words."""
    m = BASE.search(read(recipe) or "")
    if not m:
        return None
    base = m.group(1)
    for line in log_tail.splitlines():
        if base in line and NO_IMAGE.search(line) and not line.lstrip().startswith("STEP"):
            return base
    return None


RUNNER = """lock=$1 result=$2 log=$3
shift 3
echo $$ >"$lock.tmp" && mv "$lock.tmp" "$lock"
"$@" >>"$log" 2>&1 </dev/null
echo $? >"$result.tmp" && mv "$result.tmp" "$result"
"""


class Build(object):
    """The files of one image's build in log_dir: lock (pid), result (exit code), log."""

    def __init__(self, log_dir, image):
        name = safe(image)
        self.dir = os.path.join(log_dir, ".building")
        self.lock = os.path.join(self.dir, name + ".pid")
        self.result = os.path.join(self.dir, name + ".rc")
        self.started = os.path.join(self.dir, name + ".started")
        self.log = os.path.join(log_dir, "build-%s.log" % name)

    def running_pid(self):
        """The running build's process id; the lock's own writer, for the moment between
        taking the lock and the build's shell writing its id into it (-1)."""
        return lock_holder(self.lock)

    def start(self, module, argv, cwd, env):
        """Start the build detached, under the lock; False if another holds the lock."""
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir)
        try:
            fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return False
            raise
        os.write(fd, b"starting")
        os.close(fd)
        for stale in (self.result,):
            if os.path.exists(stale):
                os.unlink(stale)
        with open(self.log, "w") as out:
            out.write("$ %s\n" % " ".join(argv))
        with open(self.started, "w") as f:
            f.write("%f\n" % time.time())
        # a shell in its own session (it outlives this module and the SSH connection) puts
        # its process id into the lock, runs the builder into the log and records its exit
        # code, whoever waits for it or not
        runner = os.path.join(self.dir, os.path.basename(self.lock)[:-4] + ".sh")
        with open(runner, "w") as f:
            f.write(RUNNER)
        rc, dummy, err = module.run_command(
            ["/bin/sh", "-c", 'setsid /bin/sh "$0" "$@" </dev/null >/dev/null 2>&1 &',
             runner, self.lock, self.result, self.log] + argv, cwd=cwd, environ_update=env)
        if rc != 0:
            os.unlink(self.lock)
            module.fail_json(msg="could not start the build: %s" % err.strip())
        return True

    def finish(self):
        """The ended build's exit code (None while running), releasing the lock."""
        code = read(self.result)
        if code is None:
            return None
        for path in (self.lock, self.result):
            if os.path.exists(path):
                os.unlink(path)
        return int(code) if code.lstrip("-").isdigit() else 1

    def clear_stale(self, partial):
        """A lock whose process is gone without a result: a killed build. Remove its lock
        and partial output so that the next start builds again."""
        if os.path.exists(self.lock) and self.running_pid() is None and \
                read(self.result) is None:
            os.unlink(self.lock)
            if partial and os.path.exists(partial):
                os.unlink(partial)
            return True
        return False

    def others_running(self):
        """Whether a build of another image of this log_dir runs now."""
        return bool(builds_running(os.path.dirname(self.dir), but=self.lock))

    def started_at(self):
        try:
            return float(read(self.started))
        except (TypeError, ValueError):
            return None

    def running_s(self):
        started = self.started_at()
        return None if started is None else round(time.time() - started, 1)


def _q(text):
    return "'" + text.replace("'", "'\\''") + "'"


def leftovers(module, env, since, spec):
    """What a killed build left (``spec``: the builder's ``leftovers`` data), created since
    ``since``: rows of the builder's JSON listing with the given field values and a name
    matching its pattern (Podman: buildah's working containers, in storage only)."""
    rc, out, dummy = module.run_command(spec["argv"], environ_update=env)
    try:
        rows = json.loads(out or "[]") if rc == 0 else []
    except ValueError:
        rows = []
    pattern = re.compile(spec["name_pattern"])
    created, id_field = spec.get("created_field"), spec.get("id_field", "Id")
    found = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not row.get(id_field):
            continue
        names = row.get(spec["name_field"]) or []
        names = [names] if not isinstance(names, list) else names
        if all(row.get(k) == v for k, v in spec.get("where", {}).items()) and \
                any(pattern.search(str(n)) for n in names) and \
                (not created or (row.get(created) or 0) >= since - 1):
            found.append(row[id_field])
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime=dict(type="str", required=True),
            builder=dict(type="dict"),
            image=dict(type="str", required=True),
            recipe=dict(type="path", required=True),
            context=dict(type="path", required=True),
            build_args=dict(type="dict", default={}),
            log_dir=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            wait=dict(type="bool", default=True),
            timeout=dict(type="int", default=7200),
            poll=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    builder = p["builder"]
    if not builder or not all(isinstance(builder.get(k), dict) and builder[k].get("argv")
                              for k in ("exists", "build", "remove")):
        module.fail_json(msg="runtime %s: no builder data (exists, build, remove): pass the "
                         "plan's image builder" % p["runtime"])
    if builder.get("file"):  # the image is a file: a relative one is under the login's home
        p["image"] = under_home(p["image"])
    cmds = builder_commands(builder, p["image"], p["recipe"], p["context"], p["build_args"])
    marker = completion_marker(p["log_dir"], p["image"])
    build = Build(p["log_dir"], p["image"])
    partial = p["image"] + ".partial" if builder.get("file") else None
    result = dict(changed=False, built=False, building=False, image=p["image"],
                  build_log=build.log)
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    cwd = os.path.dirname(p["recipe"]) if builder["build"].get("cwd") == "recipe_dir" \
        else p["context"]

    there = present(module.run_command, cmds["exists"], builder["exists"].get("listed"),
                    p["image"], env, cwd)
    exists = there and os.path.exists(marker)
    result["exists"] = exists
    if p["state"] == "absent":
        if build.running_pid():
            module.fail_json(msg="image %s is being built now (process %d); not removed"
                             % (p["image"], build.running_pid()), **result)
        if there or os.path.exists(marker):
            result["changed"] = True
            if not module.check_mode:
                module.run_command(cmds["remove"], environ_update=env, cwd=cwd)
                for path in (marker, marker + ".json"):
                    if os.path.exists(path):
                        os.unlink(path)
        module.exit_json(msg="image %s absent" % p["image"], **result)

    if exists:
        module.exit_json(msg="image %s exists (built from the same recipe)" % p["image"], **result)
    result["changed"] = True
    if module.check_mode:  # (asked before the build context is made: no recipe yet)
        module.exit_json(msg="would build %s" % p["image"], **result)
    if not os.path.isfile(p["recipe"]):
        module.fail_json(msg="recipe %s does not exist" % p["recipe"], **result)

    def clear_killed():
        """A killed build's lock and leftovers removed; False if there was none."""
        since = build.started_at()
        if not build.clear_stale(partial):
            return False
        what = "its lock"
        spec = builder.get("leftovers")
        if spec and since and not build.others_running():
            ids = leftovers(module, env, since, spec)
            if ids:
                module.run_command(spec["remove"] + ids, environ_update=env)
                what += " and %d %s" % (len(ids), spec.get("what", "leftover(s) of the builder"))
        result["cleaned"] = "a killed build of %s was found: removed %s, building again" % (
            p["image"], what)
        return True

    if not os.path.isdir(os.path.dirname(marker)):
        os.makedirs(os.path.dirname(marker))
    clear_killed()
    deadline = time.time() + p["timeout"]
    while True:
        code = build.finish()
        if code is not None:
            break
        if build.running_pid() is None and not build.start(module, cmds["build"], cwd, env):
            if clear_killed():
                continue
        result.update(building=True, step=_current_step(build.log), running_s=build.running_s())
        if not p["wait"]:
            module.exit_json(msg="building %s: %s" % (p["image"], result["step"]), **result)
        if time.time() > deadline:
            module.fail_json(msg="building %s takes longer than %d s; it goes on (log %s): run "
                             "again to wait for it" % (p["image"], p["timeout"], build.log),
                             **result)
        time.sleep(max(1, p["poll"]))

    result.update(building=False, step=None, duration_s=build.running_s())
    if code != 0:
        with open(build.log, errors="replace") as f:
            tail = f.read()[-3000:]
        if partial and os.path.exists(partial):
            os.unlink(partial)
        base = base_unavailable(p["recipe"], tail)
        why = "" if base is None else (
            ": its base image %s is neither in the front-end's image store nor could it be "
            "pulled there; pull or import it on the front-end first (without a registry: "
            "import a root file system under that name)" % base)
        module.fail_json(msg="building %s failed (exit %d)%s; log: %s\n%s"
                         % (p["image"], code, why, build.log, tail), **result)
    if partial:
        os.rename(partial, p["image"])
    write_record(p["log_dir"], p["image"], p["runtime"], cmds["remove"], cmds.get("size"),
                 builder.get("file"), cmds["exists"], builder["exists"].get("listed"),
                 cmds.get("cache_gc"))
    with open(marker, "w") as f:
        f.write("%s built in %s s from %s\n" % (p["image"], result["duration_s"], p["recipe"]))
    result["built"] = True
    module.exit_json(msg="built %s in %s s" % (p["image"], result["duration_s"]), **result)


if __name__ == "__main__":
    main()
