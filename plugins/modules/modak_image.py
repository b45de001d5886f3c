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
  - Uses only the Python standard library, so that it runs with a front-end's own Python.
options:
  runtime:
    description: The container builder.
    type: str
    choices: [podman, charliecloud, apptainer]
    required: true
  image:
    description:
      - The image reference MODAK planned (podman C(localhost/NAME:TAG), charliecloud
        C(NAME:TAG), apptainer the SIF file's path).
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
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule


def _safe(ref):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", ref)


def builder_commands(runtime, image, recipe, context, build_args):
    args = []
    for key, value in sorted(build_args.items()):
        args += ["--build-arg", "%s=%s" % (key, value)]
    if runtime == "podman":
        return {
            "exists": ["podman", "image", "exists", image],
            "build": ["podman", "build", "--pull=never", "--network=host", "--layers=true",
                      "-f", recipe, "-t", image] + args + [context],
            "remove": ["podman", "image", "rm", "-f", image],
        }
    if runtime == "charliecloud":
        return {
            # `ch-image list REF` also asks the image's registry: list local storage only
            "exists": ["ch-image", "list"],
            "build": ["ch-image", "build", "--force", "-t", image, "-f", recipe] + args + [context],
            "remove": ["ch-image", "delete", image],
        }
    return {  # apptainer: build into a temporary file, rename when complete
        "exists": ["test", "-s", image],
        "build": ["apptainer", "build", "--fakeroot", "--force"] + args + [
            image + ".partial", recipe],
        "remove": ["rm", "-f", image],
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime=dict(type="str", required=True, choices=["podman", "charliecloud", "apptainer"]),
            image=dict(type="str", required=True),
            recipe=dict(type="path", required=True),
            context=dict(type="path", required=True),
            build_args=dict(type="dict", default={}),
            log_dir=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    cmds = builder_commands(p["runtime"], p["image"], p["recipe"], p["context"], p["build_args"])
    marker = os.path.join(p["log_dir"], ".built", _safe(p["image"]))
    log = os.path.join(p["log_dir"], "build-%s.log" % _safe(p["image"]))
    result = dict(changed=False, built=False, image=p["image"], build_log=log)
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    if p["runtime"] == "apptainer":
        cwd = os.path.dirname(p["recipe"])  # %files paths are relative to the recipe
    else:
        cwd = p["context"]

    rc, out, dummy = module.run_command(cmds["exists"], environ_update=env, cwd=cwd)
    if p["runtime"] == "charliecloud":
        rc = 0 if rc == 0 and p["image"] in out.split() else 1
    exists = rc == 0 and os.path.exists(marker)

    if p["state"] == "absent":
        if rc == 0 or os.path.exists(marker):
            result["changed"] = True
            if not module.check_mode:
                module.run_command(cmds["remove"], environ_update=env, cwd=cwd)
                if os.path.exists(marker):
                    os.unlink(marker)
        module.exit_json(msg="image %s absent" % p["image"], **result)

    if exists:
        module.exit_json(msg="image %s exists (built from the same recipe)" % p["image"], **result)
    if not os.path.isfile(p["recipe"]):
        module.fail_json(msg="recipe %s does not exist" % p["recipe"], **result)
    result["changed"] = True
    if module.check_mode:
        module.exit_json(msg="would build %s" % p["image"], **result)

    if not os.path.isdir(os.path.dirname(marker)):
        os.makedirs(os.path.dirname(marker))
    start = time.time()
    with open(log, "w") as out:  # a killed build still leaves what was started
        out.write("$ %s\n" % " ".join(cmds["build"]))
    rc, stdout, stderr = module.run_command(cmds["build"], cwd=cwd, environ_update=env)
    result["duration_s"] = round(time.time() - start, 1)
    with open(log, "a") as out:
        out.write(stdout)
        out.write(stderr)
    if rc != 0:
        tail = (stdout + stderr)[-3000:]
        module.fail_json(msg="building %s failed (exit %d); log: %s\n%s" % (p["image"], rc, log, tail),
                         **result)
    if p["runtime"] == "apptainer":
        os.rename(p["image"] + ".partial", p["image"])
    with open(marker, "w") as f:
        f.write("%s built in %.1f s from %s\n" % (p["image"], result["duration_s"], p["recipe"]))
    result["built"] = True
    module.exit_json(msg="built %s in %.1f s" % (p["image"], result["duration_s"]), **result)


if __name__ == "__main__":
    main()
