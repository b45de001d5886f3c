# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side's link to the modak Python package (modak_lib).

The collection and the package are two halves of one release: the action plugins import the
package, and both must carry the same version. The collection's version comes from its
MANIFEST.json (an installed collection) or galaxy.yml (a checkout).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

from ansible.errors import AnsibleActionFail

# plugins/plugin_utils/ -> the collection's root
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collection_version():
    """This collection's version, or None when neither file says it."""
    manifest = os.path.join(ROOT, "MANIFEST.json")
    if os.path.isfile(manifest):
        with open(manifest) as f:
            return json.load(f).get("collection_info", {}).get("version")
    galaxy = os.path.join(ROOT, "galaxy.yml")
    if os.path.isfile(galaxy):
        with open(galaxy) as f:
            found = re.search(r"^version:\s*['\"]?([^'\"\s#]+)", f.read(), re.MULTILINE)
        return found.group(1) if found else None
    return None


def check_library(plugin):
    """Import modak_lib and check that it is this collection's version; fail saying how to
    fix it otherwise. Returns the package."""
    wanted = collection_version()
    pin = "modak==%s" % wanted if wanted else "modak"
    try:
        import modak_lib
    except ImportError as exc:
        raise AnsibleActionFail(
            "%s needs the modak Python package on the controller (%s): install it into the "
            "Python that runs ansible-playbook: pip install %s" % (plugin, exc, pin))
    have = getattr(modak_lib, "__version__", None)
    if wanted and have != wanted:
        raise AnsibleActionFail(
            "%s: the modak Python package is %s but the collection modak.modak is %s; the two "
            "halves must be one release: pip install %s (or install the collection of version "
            "%s)" % (plugin, have, wanted, pin, have))
    return modak_lib


def backend_data(plugin, args, name_key, data_key, kind):
    """``args`` with ``data_key`` filled from MODAK's registry of backends when the task
    names its backend (``name_key``) without the plan's data: the front-end modules execute
    a backend's data and know no backend themselves.  ``kind``: scheduler or runtime."""
    if args.get(data_key) or not args.get(name_key):
        return args
    check_library(plugin)
    if kind == "scheduler":
        from modak_lib.schedulers import SCHEDULERS, scheduler_name
        try:
            data = SCHEDULERS[scheduler_name(args[name_key])].job_control()
        except ValueError as exc:
            raise AnsibleActionFail("%s: %s: %s" % (plugin, name_key, exc))
    else:
        from modak_lib.runtimes import RUNTIMES
        runtime = RUNTIMES.get(args[name_key])
        data = runtime.builder() if runtime is not None else None
        if data is None:
            raise AnsibleActionFail("%s: %s: no image builder for runtime %r (one of %s)" % (
                plugin, name_key, args[name_key],
                ", ".join(n for n, r in sorted(RUNTIMES.items()) if r.builder())))
    return dict(args, **{data_key: data})
