# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_job: waits for a job with one line per poll.

States other than ``ended``/``finished`` go to the module as they are. For those two, the
module submits (once per run), then this plugin asks it for the job's status every ``poll``
seconds (sooner while the job is young: a search's trial lasts seconds, :func:`next_poll`)
and prints the job's state and the time since submission (when it changes, else at the
first poll ``poll`` seconds or more after the last line), so that a user sees what the
scheduler says instead of Ansible's retry counter. A poll that cannot reach the front-end
(or whose scheduler query fails) is retried; when the front-end stays away, the failure
says that the job keeps running and that running the same task again reattaches.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import backend_data
from ansible_collections.modak.modak.plugins.plugin_utils.modak_progress import (
    Orphaned, ParentWatch, PollingAction, clock, say, warn)

MODULE = "modak.modak.modak_job"
# The first status query comes this soon after submission, and each next one after a
# quarter of the time waited so far, up to ``poll``: a search's trial of 3 s was found
# ended 5.5 s after its submission at a fixed 5 s (most of a trial's cost to the user,
# twice per round); a job of hours is asked at ``poll`` after its first minute.
FIRST_POLL_S = 0.5
POLL_GROWTH = 0.25


def next_poll(waited, poll):
    """Seconds to the next status query, ``waited`` seconds after submission (at most
    ``poll``)."""
    return min(float(poll), max(FIRST_POLL_S, POLL_GROWTH * waited))


def progress_line(host, status, waited):
    """One poll, for people: job, scheduler state (and its reason), time since submission."""
    since = waited
    if status.get("submitted_at") and status.get("now"):
        since = status["now"] - status["submitted_at"]
    reason = status.get("reason")
    return "[%s] job %s %s%s, %s since submission" % (
        host, status.get("job_id", "?"), status.get("state", "UNKNOWN"),
        " (%s)" % reason if reason and reason not in ("None", "(null)") else "", clock(since))


class ActionModule(PollingAction):
    MODULE = MODULE

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = backend_data("modak_job", dict(self._task.args), "scheduler", "control",
                            "scheduler")
        state = args.get("state", "submitted")
        if state not in ("ended", "finished"):
            result.update(self._query(args, task_vars))
            return result
        timeout = int(args.get("timeout", 3600))
        poll = max(1, int(args.get("poll", 5)))
        retries = max(0, int(args.get("retries", 5)))
        host = (task_vars or {}).get("inventory_hostname", "front-end")

        status = self._query(dict(args, state="submitted"), task_vars)
        if status.get("failed") or status.get("unreachable") or self._play_context.check_mode:
            result.update(status)
            return result
        submitted = status.get("changed", False)
        job_submitted = bool(status.get("submitted"))  # (False: a job of the run was found)
        started = time.time()
        say(progress_line(host, status, 0))
        failures, last = 0, status
        said = (time.time(), status.get("state"))  # the last line: when, and which state
        watch = ParentWatch()
        while not status.get("terminal") and time.time() - started < timeout:
            if status.get("stuck"):
                result.update(self._cancel_stuck(args, task_vars, status),
                              waited_s=round(time.time() - started, 1))
                return result
            waited = time.time() - started
            wait = poll if failures else next_poll(waited, poll)
            time.sleep(min(wait, max(0, timeout - waited)) or 1)
            try:
                watch.check()
            except Orphaned as exc:
                result.update(last, failed=True, msg="%s: stopped waiting; job %s keeps running"
                              % (exc, last.get("job_id")))
                return result
            answer = self._query(dict(args, state="status"), task_vars)
            if answer.get("unreachable") or answer.get("failed"):
                failures += 1
                why = " ".join(str(answer.get("msg", "")).split())[:300]
                if failures > retries:
                    result.update(last, failed=True, waited_s=round(time.time() - started, 1),
                                  msg=self._lost_message(last, failures, why))
                    return result
                warn("[%s] status query %d/%d failed (%s); job %s keeps its last "
                     "known state %s, retrying in %d s"
                     % (host, failures, retries, why, last.get("job_id"),
                        last.get("state"), poll))
                try:  # a dead SSH master would fail every later poll too
                    self._connection.reset()
                except Exception:  # pylint: disable=broad-except
                    pass
                continue
            failures, status, last = 0, answer, answer
            # (a line for people at a change of state, else poll seconds or more after the last)
            if status.get("terminal") or status.get("state") != said[1] \
                    or time.time() - said[0] >= poll - 0.5 * FIRST_POLL_S:
                say(progress_line(host, status, time.time() - started))
                said = (time.time(), status.get("state"))

        result.update(status, changed=submitted, submitted=job_submitted,
                      waited_s=round(time.time() - started, 1))
        if not status.get("terminal"):
            result["msg"] = ("job %s is still %s after waiting %d s; it keeps running: run the "
                             "same command again to wait for it (the run is not submitted "
                             "again)" % (status.get("job_id"), status.get("state"), timeout))
            if state == "finished":
                result["failed"] = True
        elif state == "finished" and status.get("state") != "COMPLETED":
            result.update(failed=True, msg="job %s ended %s (exit code %s)%s" % (
                status.get("job_id"), status.get("state"),
                status.get("exit_code") if status.get("exit_code") is not None else "unknown",
                ": " + status["reason"] if status.get("reason") else ""))
        else:
            result["msg"] = "job %s ended %s" % (status.get("job_id"), status.get("state"))
        return result

    def _cancel_stuck(self, args, task_vars, status):
        """A job the scheduler holds for a reason it never starts for (a partition with
        fewer nodes than it asks for): cancelled, and the task fails saying why, rather
        than waiting for the timeout (a run of the same request would wait again)."""
        cancel = self._query(dict(args, state="cancelled"), task_vars)
        done = not (cancel.get("failed") or cancel.get("unreachable"))
        if done:  # (its state now: CANCELLED)
            status = dict(status, **dict((k, cancel[k]) for k in ("state", "terminal")
                                         if k in cancel))
        return dict(status, changed=True, failed=True, cancelled=done, msg=(
            "job %s cannot start as it is: the scheduler holds it pending for %s (%s); %s. "
            "Change the request's job options (or the target's partition) and deploy again"
            % (status.get("job_id"), status.get("reason"), status.get("stuck"),
               "MODAK cancelled it" if done else "cancelling it failed (%s): cancel it by "
               "hand" % " ".join(str(cancel.get("msg", "")).split())[:200])))

    @staticmethod
    def _lost_message(last, failures, why):
        return ("lost the front-end during the wait (%d status queries in a row failed: %s). "
                "Job %s was %s when last seen and is not cancelled: it keeps running there. "
                "Run the same command again to reattach to it (the run is never submitted "
                "twice) and fetch its results." % (failures, why, last.get("job_id"),
                                                   last.get("state")))
