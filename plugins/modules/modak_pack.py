#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_pack
short_description: Pack a run directory's files into one archive on the controller
version_added: "0.2.0"
description:
  - Runs on the controller (an action plugin). Writes the files a run directory receives (the
    job script, the plan, the application's files and MODAK's runtime) into one gzip'd tar,
    which M(ansible.builtin.unarchive) copies to the front-end and unpacks in one transfer,
    instead of one copy (and its round trips) per file.
  - Each O(files[].dest) must be a relative path inside the run directory (no C(..), no
    absolute path, no name twice), and each O(files[].src) a regular file; a symbolic link is
    not followed. Members are plain files with their source's modification time, owned by
    uid 0 with no user name (unpack them with C(--no-same-owner)); the same files make the
    same archive.
options:
  files:
    description: What to pack (modak_plan's C(app_files), with the job script and the plan).
    type: list
    elements: dict
    required: true
    suboptions:
      src:
        description: The file on the controller.
        type: path
        required: true
      dest:
        description: Its path in the run directory.
        type: str
        required: true
      mode:
        description: Its mode there (an octal string such as C("0750")); default the source's.
        type: raw
  path:
    description:
      - Where to write the archive. Default a new private file in the controller's temporary
        directory, which the caller removes once it is unpacked.
    type: path
author:
  - MODAK developers (@modak)
notes:
  - Writes the archive in check mode too (a file on the controller, so that
    M(ansible.builtin.unarchive) can say in check mode what it would change on the front-end).
"""

EXAMPLES = r"""
- name: Pack the run directory's files
  modak.modak.modak_pack:
    files: "{{ modak_plan.app_files }}"
  register: modak_packed

- name: Unpack them on the front-end
  ansible.builtin.unarchive:
    src: "{{ modak_packed.path }}"
    dest: "{{ run_dir }}"
    extra_opts: [--no-same-owner]
"""

RETURN = r"""
path:
  description: The archive on the controller.
  returned: success
  type: str
files:
  description: How many files it holds.
  returned: success
  type: int
bytes:
  description: Their size in bytes, before compression.
  returned: success
  type: int
"""
