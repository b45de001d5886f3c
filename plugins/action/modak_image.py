# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_image: a build with one progress line per poll.

The module starts the build detached on the front-end (or attaches to the one running) and
returns at once; this plugin asks it again every ``poll`` seconds, printing the builder's
current step and the time since the build started, until the image exists, the build
fails, or ``timeout`` seconds have passed (the build goes on; running again attaches).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import backend_data
from ansible_collections.modak.modak.plugins.plugin_utils.modak_progress import (
    Orphaned, ParentWatch, PollingAction, clock, say, warn)

MODULE = "modak.modak.modak_image"


class ActionModule(PollingAction):
    MODULE = MODULE

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = backend_data("modak_image", dict(self._task.args), "runtime", "builder",
                            "runtime")
        if args.get("state", "present") != "present" or not args.get("wait", True):
            result.update(self._query(args, task_vars))
            return result
        timeout = int(args.get("timeout", 7200))
        poll = max(1, int(args.get("poll", 10)))
        host = (task_vars or {}).get("inventory_hostname", "front-end")
        started, failures, last_step = time.time(), 0, None
        watch = ParentWatch()
        while True:
            try:
                watch.check()
            except Orphaned as exc:
                result.update(failed=True, msg="%s: stopped waiting; the build goes on" % exc)
                return result
            answer = self._query(dict(args, wait=False), task_vars)
            if answer.get("unreachable"):
                failures += 1
                if failures > 5:
                    answer["msg"] = ("lost the front-end while building %s (%s); the build "
                                     "goes on there: run the same command again to attach "
                                     "to it" % (args.get("image"), answer.get("msg")))
                    result.update(answer)
                    return result
                warn("[%s] looking at the build failed (%s): retrying"
                     % (host, " ".join(str(answer.get("msg")).split())[:200]))
                try:
                    self._connection.reset()
                except Exception:  # pylint: disable=broad-except
                    pass
                time.sleep(poll)
                continue
            failures = 0
            if answer.get("cleaned") and answer["cleaned"] != result.get("cleaned"):
                say("[%s] %s" % (host, answer["cleaned"]))
                result["cleaned"] = answer["cleaned"]
            if answer.get("failed") or not answer.get("building"):
                if answer.get("built"):
                    say("[%s] built %s in %s" % (
                        host, args.get("image"), clock(answer.get("duration_s") or 0)))
                result.update(answer)
                return result
            step = answer.get("step") or "starting"
            say("[%s] building %s, %s: %s" % (
                host, args.get("image"), clock(answer.get("running_s") or 0),
                step if step != last_step else "(same step)"))
            last_step = step
            if time.time() - started > timeout:
                result.update(answer, failed=True, msg=(
                    "the build of %s is still running after %d s (at: %s); it goes on on the "
                    "front-end (log %s): run the same command again to attach to it"
                    % (args.get("image"), timeout, step, answer.get("build_log"))))
                return result
            time.sleep(poll)
