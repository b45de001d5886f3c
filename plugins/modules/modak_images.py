#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_images
short_description: List MODAK's images on an HPC front-end, lease them to runs, prune the unused
version_added: "0.2.0"
description:
  - MODAK builds an image once per recipe (M(modak.modak.modak_image)) and names it by the
    recipe's hash, so an image whose recipe changed (a newer MODAK, another image variant)
    stays in the front-end's storage. This module lists the images of an image directory
    with their last use and size, and removes those no run has used for a while.
  - A run that uses an image (a job, a search's trial) takes a lease on it before it builds
    or uses the image (V(leased), which says whether the image is there now), and gives it
    back once its job has ended (V(released)); the deploy's roles do both. A lease is a file under O(log_dir)C(/.used); taking or giving
    one back is the image's last use.
  - V(pruned) removes each image built by MODAK in O(log_dir) that no run holds a lease on,
    that no build is running for, and that no run has leased for O(unused_days) days,
    with the command line its build recorded (C(podman image rm), C(ch-image delete), the
    SIF file removed), then its completion record. A removal that fails keeps the image
    and fails the task, naming it, unless the image is gone already (removed by hand). A lease is taken and an image removed
    under one lock, so a run that leased the image before its removal finds it gone when
    it looks for it, and builds it again.
  - V(pruned) then runs, once each, the command that clears a builder's cache of what no
    image uses, as the images' build records give it (C(podman image prune) of the layers
    that carry MODAK's label and that no image uses - a failed or killed build's -,
    C(ch-image build-cache --gc)), unless a build in O(log_dir) is running; in check mode
    it says what it would run (RV(caches)). One that fails is a warning, not a failure.
  - An image that is no longer where its runtime keeps images (removed by hand, a reset of
    Charliecloud's storage), by its record's C(exists) command, and that no run holds, is
    listed as gone; V(pruned) drops its records (RV(forgotten)), whatever its last use.
  - A lease older than O(stale_days) (its deploy never waited for its job, or was lost) no
    longer keeps its image; the listing names it as stale.
  - An image that an older MODAK built (no record of how to remove it) is listed and kept
    until a run uses it again (its lease then records how, given O(runtime) and O(builder)).
  - Uses only the Python standard library, so that it runs with a front-end's own Python.
options:
  log_dir:
    description: The image directory (the target's C(image_dir); M(modak.modak.modak_image)'s O(log_dir)).
    type: path
    required: true
  state:
    description:
      - V(listed) only lists; V(leased) and V(released) take and give back O(run)'s lease
        on O(image); V(pruned) removes the unused images (in check mode, lists those it
        would remove).
    type: str
    choices: [listed, leased, released, pruned]
    default: listed
  image:
    description: The image reference (as M(modak.modak.modak_image) was given it), for V(leased) and V(released).
    type: str
  file:
    description: The image is a file (Apptainer's SIF); a relative path is under the login's home.
    type: bool
    default: false
  run:
    description: The run that uses the image (its run id), for V(leased) and V(released).
    type: str
  run_dir:
    description: The run's directory on the front-end, kept with its lease for the listing.
    type: str
    default: ""
  runtime:
    description: The container runtime's name, recorded for an image an older MODAK built (V(leased)).
    type: str
  builder:
    description:
      - The runtime backend's image commands (the plan's C(image.builder)), from which
        V(leased) says whether the image is there (RV(exists)) and records how to remove
        an image an older MODAK built.
    type: dict
  unused_days:
    description: V(pruned) removes an image no run has leased for this many days (a fraction is allowed).
    type: float
    default: 30
  stale_days:
    description: A lease older than this many days no longer keeps its image.
    type: float
    default: 14
author:
  - MODAK developers (@modak)
notes:
  - Supports check mode; V(pruned) then removes nothing and returns what it would remove.
"""

EXAMPLES = r"""
- name: Remove the images no run has used for 30 days
  modak.modak.modak_images:
    log_dir: ~/modak-images
    state: pruned
    unused_days: 30
"""

RETURN = r"""
images:
  description:
    - The images of O(log_dir) (before V(pruned) removed any), each with C(image),
      C(runtime), C(built_at) and C(last_used) (seconds since the epoch), C(unused_days),
      C(size_bytes) (null where the runtime has no size command), C(leases) (C(run),
      C(run_dir), C(age_days), C(stale)), C(building), C(removable), C(gone) (no longer
      where its runtime keeps images, by its record's C(exists) command, so removed outside
      MODAK) and C(why) (why it is kept, or that it would go).
  returned: always
  type: list
  elements: dict
lines:
  description:
    - The listing as text, a line an image (what V(pruned) did to it included), then a line
      a builder cache command of V(pruned) (RV(caches)).
  returned: always
  type: list
  elements: str
exists:
  description:
    - Whether the image is there now (its completion record and the builder's C(exists)),
      once O(run) holds its lease, so that no prune removes it after this answer; a run
      builds it when it is not.
  returned: with V(leased), when O(builder) has an C(exists) command
  type: bool
removed:
  description: The images V(pruned) removed (in check mode, would remove).
  returned: always
  type: list
  elements: str
forgotten:
  description:
    - The images V(pruned) found gone (removed outside MODAK) and whose records it
      dropped, with their leases (in check mode, would drop).
  returned: always
  type: list
  elements: str
caches:
  description:
    - The builders' cache commands of V(pruned) - C(argv), whether it C(ran) (not in check
      mode, nor while a build runs), its exit status C(rc), and the C(line) said of it, which
      RV(lines) ends with.
  returned: when state is pruned
  type: list
  elements: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modak.modak.plugins.module_utils.modak_images import (
    DAY_S, Leases, build_lock, builds_running, built, fill, lock_holder, marker, present,
    record_of, under_home, write_record)


def _size(module, image, record):
    if record.get("file"):
        try:
            return os.path.getsize(image)
        except OSError:
            return None
    argv = record.get("size")
    if not argv:
        return None
    rc, out, dummy = module.run_command(argv)
    out = out.strip()
    return int(out) if rc == 0 and out.isdigit() else None


def _valid_argv(argv):
    return isinstance(argv, list) and argv and all(isinstance(w, str) and w for w in argv)


def survey(module, log_dir, leases, unused_s, stale_s):
    """Every image built in ``log_dir``, with why it is kept or may go."""
    now, out = time.time(), []
    for image, record, built_at in built(log_dir):
        held = leases.held(image)
        live = [h for h in held if h[2] < stale_s]
        times = [t for t in (leases.last_use(image), built_at) if t is not None]
        last = max(times) if times else None
        # (in days, rounded once: the listing's "last used" and its "why" say the same)
        unused = round((now - last) / DAY_S, 2) if last else None
        building = lock_holder(build_lock(log_dir, image)) is not None
        record = record or {}
        # no longer in the builder's storage (removed outside MODAK: by hand, a reset of
        # Charliecloud's storage): listed so, and its records dropped at the prune
        gone = bool(record) and not building and not live and _gone(module, image, record)
        if gone:
            why = "gone: no longer where its runtime keeps images (removed outside MODAK)"
        elif not record:
            why = ("kept: built by an older MODAK, which kept no record of how to remove it "
                   "(a run that uses it records it; or remove it with modak_image "
                   "state=absent)")
        elif not _valid_argv(record.get("remove")):
            why = "kept: its record's remove command is not a list of words"
        elif building:
            why = "kept: a build of it is running"
        elif live:
            why = "kept: in use by %d run(s)" % len(live)
        elif unused is not None and unused * DAY_S < unused_s:
            why = "kept: used %.1f days ago" % unused
        else:
            why = "unused for %.1f days" % (unused or 0)
        out.append(dict(
            image=image, runtime=record.get("runtime"), built_at=built_at, last_used=last,
            unused_days=unused,
            size_bytes=_size(module, image, record) if record and not gone else None,
            leases=[dict(run=r, run_dir=d, age_days=round(a / DAY_S, 2), stale=a >= stale_s)
                    for r, d, a in held],
            building=building, removable=not why.startswith("kept"), gone=gone, why=why,
            remove=record.get("remove"), exists=record.get("exists"),
            listed=record.get("listed"), cache_gc=record.get("cache_gc")))
    return out


def clear_caches(module, log_dir, images):
    """After a prune's removals: each builder's command that clears its cache of what no
    image uses (the images' records' ``cache_gc``: Podman's layers of a failed or killed
    build, Charliecloud's unreachable build states), each once, unless a build of
    ``log_dir`` runs (its layers are not yet an image's); in check mode, what would run.
    Called under the directory's lease lock, which a run takes before it builds: no build
    of it starts meanwhile.  A command that fails is said, not an error: the images'
    removals stand."""
    commands = []
    for entry in images:
        argv = entry.get("cache_gc")
        if _valid_argv(argv) and argv not in commands:
            commands.append(argv)
    building = builds_running(log_dir) if commands else []
    out = []
    for argv in commands:
        said = " ".join(argv)
        if building:
            out.append(dict(argv=argv, ran=False, line="builder cache: %s not run: a build "
                            "is running (%s)" % (said, ", ".join(building))))
            continue
        if module.check_mode:
            out.append(dict(argv=argv, ran=False, line="builder cache: would run %s" % said))
            continue
        rc, stdout, stderr = module.run_command(argv)
        last = ((stdout or "").strip().splitlines() or [""])[-1][-200:]
        if rc == 0:
            text = "builder cache: ran %s%s" % (said, (": " + last) if last else "")
        else:
            text = "builder cache: %s failed (exit %d): %s" % (
                said, rc, ((stderr or stdout or "").strip().splitlines() or [""])[-1][-300:])
            module.warn(text)
        out.append(dict(argv=argv, ran=True, rc=rc, line=text))
    return out


def _gone(module, image, record):
    """Whether ``image`` is no longer there (removed by hand, say), by its ``record``'s
    ``exists`` command (a build record, or a listing's entry, which keeps it); False where
    the record has none."""
    return _valid_argv(record.get("exists")) and not present(
        module.run_command, record["exists"], record.get("listed"), image)


def _bytes(n):
    if n is None:
        return "size unknown"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return ("%d %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1000.0


def line(entry):
    """One image, as a person reads it."""
    last = ("last used %.1f days ago" % entry["unused_days"]
            if entry["unused_days"] is not None else "never used")
    live = [lease for lease in entry["leases"] if not lease["stale"]]
    stale = len(entry["leases"]) - len(live)
    held = "; held by %s" % ", ".join(lease["run_dir"] or lease["run"] for lease in live) \
        if live else ""
    if stale:
        held += "; %d stale lease(s), older than stale_days" % stale
    what = "%s, %s" % (entry["runtime"] or "runtime unknown", _bytes(entry["size_bytes"]))
    return "%s (%s): %s%s: %s" % (entry["image"], what, last, held, entry["why"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            log_dir=dict(type="path", required=True),
            state=dict(type="str", default="listed",
                       choices=["listed", "leased", "released", "pruned"]),
            image=dict(type="str"),
            file=dict(type="bool", default=False),
            run=dict(type="str"),
            run_dir=dict(type="str", default=""),
            runtime=dict(type="str"),
            builder=dict(type="dict"),
            unused_days=dict(type="float", default=30.0),
            stale_days=dict(type="float", default=14.0),
        ),
        required_if=[("state", "leased", ("image", "run")),
                     ("state", "released", ("image", "run"))],
        supports_check_mode=True,
    )
    p = module.params
    if p["unused_days"] < 0 or p["stale_days"] < 0:
        module.fail_json(msg="unused_days and stale_days cannot be negative")
    log_dir = p["log_dir"]
    image = p["image"] and (under_home(p["image"]) if p["file"] else p["image"])
    result = dict(changed=False, images=[], removed=[], forgotten=[], lines=[])
    if p["state"] in ("leased", "released"):
        if module.check_mode:
            result["changed"] = True
            module.exit_json(msg="would %s %s for %s" % (
                "lease" if p["state"] == "leased" else "release", image, p["run"]), **result)
        with Leases(log_dir) as leases:
            if p["state"] == "released":
                result["changed"] = leases.give_back(image, p["run"])
                module.exit_json(msg="%s released by %s" % (image, p["run"]), **result)
            leases.take(image, p["run"], p["run_dir"])
            # an image an older MODAK built: record how to remove it now (and one whose
            # record has no size command, which this MODAK's builder has: Charliecloud's)
            builder = p["builder"] or {}
            cmds = dict((what, fill(argv, image) if _valid_argv(argv) else None)
                        for what, argv in ((what, (builder.get(what) or {}).get("argv"))
                                           for what in ("remove", "size", "exists", "cache_gc")))
            listed = bool((builder.get("exists") or {}).get("listed"))
            done = os.path.exists(marker(log_dir, image))
            record = record_of(log_dir, image) if done else None
            if p["runtime"] and cmds["remove"] and done and (
                    record is None or any(cmds[what] and not record.get(what)
                                          for what in ("size", "cache_gc"))):
                write_record(log_dir, image, p["runtime"], cmds["remove"], cmds["size"],
                             p["file"], cmds["exists"], listed, cmds["cache_gc"])
            # whether the image is there now, leased: a prune removes it no more
            if cmds["exists"]:
                result["exists"] = done and present(module.run_command, cmds["exists"], listed,
                                                    image)
        result["changed"] = True
        module.exit_json(msg="%s leased by %s" % (image, p["run"]), **result)

    if not os.path.isdir(log_dir):
        result["lines"] = ["no MODAK images in %s (no such directory)" % log_dir]
        module.exit_json(msg=result["lines"][0], **result)
    with Leases(log_dir) as leases:
        images = survey(module, log_dir, leases, p["unused_days"] * DAY_S,
                        p["stale_days"] * DAY_S)
        errors = []
        if p["state"] == "pruned":
            for entry in images:
                if not entry["removable"]:
                    continue
                if module.check_mode:
                    entry["why"] = "would be %s: %s" % (
                        "forgotten" if entry["gone"] else "removed", entry["why"])
                else:
                    rc, out, err = (0, "", "") if entry["gone"] else \
                        module.run_command(entry["remove"])
                    if rc != 0 and not _gone(module, entry["image"], entry):
                        errors.append("%s: %s" % (entry["image"], (err or out).strip()[-300:]))
                        entry["why"] = "kept: its removal failed"
                        continue
                    for path in (marker(log_dir, entry["image"]),
                                 marker(log_dir, entry["image"]) + ".json"):
                        if os.path.exists(path):
                            os.unlink(path)
                    leases.forget(entry["image"])
                    entry["why"] = "%s: %s" % ("forgotten" if entry["gone"] else "removed",
                                               entry["why"])
                result["forgotten" if entry["gone"] else "removed"].append(entry["image"])
            result["caches"] = clear_caches(module, log_dir, images)
    for entry in images:
        for key in ("remove", "exists", "listed", "cache_gc"):
            entry.pop(key)
    result["lines"] = [line(e) for e in images] or ["no MODAK images in %s" % log_dir]
    result["lines"] += [c["line"] for c in result.get("caches", [])]
    result.update(images=images, changed=bool(result["removed"] or result["forgotten"])
                  and not module.check_mode)
    if errors:
        module.fail_json(msg="could not remove %d image(s): %s" % (len(errors), "; ".join(errors)),
                         **result)
    would = "would be " if module.check_mode else ""
    module.exit_json(msg="%d image(s)%s" % (len(images), ", %d %sremoved, %d %sforgotten" % (
        len(result["removed"]), would, len(result["forgotten"]), would)
        if p["state"] == "pruned" else ""), **result)


if __name__ == "__main__":
    main()
