# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_pack: a run directory's files -> one archive."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import check_library

ARGS = dict(
    files=dict(type="list", elements="dict", required=True, options=dict(
        src=dict(type="path", required=True),
        dest=dict(type="str", required=True),
        mode=dict(type="raw"),
    )),
    path=dict(type="path"),
)


def _mode(value, dest):
    """A member's mode: None (the source's), an int, or an octal string such as "0750"."""
    if value is None:
        return None
    if isinstance(value, int):  # (YAML's 0750)
        return value & 0o777
    try:
        return int(str(value), 8) & 0o777
    except ValueError:
        raise AnsibleActionFail("modak_pack: files[%s].mode: %r is not an octal mode"
                                % (dest, value))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGS)
        check_library("modak_pack")
        from modak_lib.errors import ModakError
        from modak_lib.files import pack

        path = args["path"]
        if not path:  # a new private file of the controller's, which the caller removes
            fd, path = tempfile.mkstemp(prefix="modak-stage-", suffix=".tar.gz")
            os.close(fd)
        entries = [(f["src"], f["dest"], _mode(f.get("mode"), f["dest"]))
                   for f in args["files"]]
        try:
            figures = pack(entries, path)
        except (ModakError, OSError) as exc:
            if not args["path"]:
                os.unlink(path)
            raise AnsibleActionFail("modak_pack: %s" % exc)
        result.update(figures, path=path, changed=True,
                      msg="packed %d files (%d bytes) into %s" % (figures["files"],
                                                                  figures["bytes"], path))
        return result
