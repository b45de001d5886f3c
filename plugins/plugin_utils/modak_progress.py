# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress lines of the controller's waits (job, image build)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


import os


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
