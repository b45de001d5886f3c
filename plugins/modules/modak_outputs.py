#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_outputs
short_description: Pack a job's outputs in its run directory, and unpack them on the controller
version_added: "0.2.0"
description:
  - The files and folders a training script writes in its run directory (its checkpoints,
    its metrics), as the request lists them (C(application.outputs)), go back to the
    controller with the job's output. The role M(modak.modak.modak_results) packs them on
    the front-end (V(packed)), fetches the archive, unpacks it under the run's results
    folder (V(unpacked), on the controller) and removes it from the front-end (V(absent)).
  - V(packed) takes regular files and folders only, each inside O(run_dir), and leaves out
    and names (RV(skipped)) a path through a symbolic link, a link inside a folder, a
    device or a pipe; a path the job did not write is named in RV(missing). Past
    O(max_mb) it writes no archive and says why in RV(not_fetched), naming the run
    directory.
  - V(unpacked) writes the archive's regular files and folders under O(dest) and nothing
    else; a member of another kind, or one whose name leads outside O(dest) or through a
    symbolic link there, is left out and named (RV(refused)). The front-end is where the
    user's script ran; what it left must not write outside the results folder.
  - Uses only the Python standard library, so that it runs with a front-end's own Python.
options:
  state:
    description: V(packed) on the front-end, V(unpacked) on the controller, V(absent) removes O(archive).
    type: str
    choices: [packed, unpacked, absent]
    default: packed
  run_dir:
    description: The run directory (V(packed)).
    type: path
  paths:
    description: The outputs, relative to O(run_dir) (V(packed)).
    type: list
    elements: str
    default: []
  archive:
    description: The archive to write (V(packed)), read (V(unpacked)) or remove (V(absent)).
    type: path
    required: true
  dest:
    description: The folder to unpack into (V(unpacked)); made if missing.
    type: path
  max_mb:
    description: V(packed) writes no archive past this many MiB of files.
    type: int
    default: 2048
author:
  - MODAK developers (@modak)
"""

EXAMPLES = r"""
- name: Pack the outputs the request lists
  modak.modak.modak_outputs:
    run_dir: /home/hpcuser/modak-runs/train-r1a2b3c4d5e6
    paths: [checkpoints, metrics.json]
    archive: /home/hpcuser/modak-runs/train-r1a2b3c4d5e6/.modak-outputs-1.tgz
  register: packed
"""

RETURN = r"""
archive:
  description: The archive written (V(packed)); null where none of the outputs was found.
  returned: always
  type: str
files:
  description: The files packed (V(packed)) or written (V(unpacked)), relative to the run directory.
  returned: always
  type: list
  elements: str
bytes:
  description: Their size (V(packed)).
  returned: always
  type: int
missing:
  description: The outputs the run directory does not have (V(packed)).
  returned: always
  type: list
  elements: str
skipped:
  description: What V(packed) left out, each as its path and why (C(ckpt/key (a symbolic link))).
  returned: always
  type: list
  elements: str
not_fetched:
  description: Why V(packed) wrote no archive though the outputs are there (their size); null otherwise.
  returned: always
  type: str
refused:
  description: The archive's members V(unpacked) left out.
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modak.modak.plugins.module_utils.modak_outputs import (
    OutputsError, pack, unpack)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="packed", choices=["packed", "unpacked", "absent"]),
            run_dir=dict(type="path"),
            paths=dict(type="list", elements="str", default=[]),
            archive=dict(type="path", required=True),
            dest=dict(type="path"),
            max_mb=dict(type="int", default=2048),
        ),
        required_if=[("state", "packed", ("run_dir",)), ("state", "unpacked", ("dest",))],
    )
    p = module.params
    result = dict(changed=False, archive=None, files=[], bytes=0, missing=[], skipped=[],
                  refused=[], not_fetched=None)
    if p["state"] == "absent":
        if os.path.lexists(p["archive"]):
            os.unlink(p["archive"])
            result["changed"] = True
        module.exit_json(**result)
    if p["state"] == "packed":
        if p["max_mb"] < 1:
            module.fail_json(msg="max_mb must be at least 1", **result)
        try:
            result.update(pack(p["run_dir"], p["paths"], p["archive"], p["max_mb"] * 2 ** 20))
        except OutputsError as exc:
            result["not_fetched"] = str(exc)
        result["changed"] = result["archive"] is not None
        module.exit_json(**result)
    written, refused = unpack(p["archive"], p["dest"])
    result.update(files=written, refused=refused, changed=bool(written))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
