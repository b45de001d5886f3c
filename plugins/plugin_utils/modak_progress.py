# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress lines of the controller's waits (job, image build)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


import os

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def say(text):
    """A progress line for people. When the play's standard output is machine-read (a JSON
    stdout callback, as xOpera uses), the line goes to standard error instead."""
    callback = str(getattr(C, "DEFAULT_STDOUT_CALLBACK", "") or "")
    display.display(text, stderr="json" in callback)


def warn(text):
    display.warning(text)


class PollingAction(ActionBase):
    """An action plugin that asks its module again and again (a wait with progress lines)."""
    TRANSFERS_FILES = False
    MODULE = None  # the module's fully qualified name

    def _query(self, args, task_vars):
        """The module's answer; a connection that failed is an answer too (unreachable)."""
        try:
            return self._execute_module(module_name=self.MODULE, module_args=args,
                                        task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            return dict(unreachable=True, msg=str(exc))


class Orphaned(Exception):
    """ansible-playbook, which started this worker, is gone (killed): stop waiting."""


class ParentWatch(object):
    """A worker whose ansible-playbook died (SIGKILL) is re-parented; a wait loop that goes
    on would poll the front-end for hours with nobody to report to."""

    def __init__(self):
        self.parent = os.getppid()

    def check(self):
        if os.getppid() != self.parent:
            raise Orphaned("ansible-playbook (process %d) is gone" % self.parent)


def clock(seconds):
    """Seconds as H:MM:SS."""
    seconds = int(max(0, seconds or 0))
    return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)
