#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_job
short_description: Submit, watch and cancel a MODAK training job on an HPC front-end
version_added: "0.1.0"
description:
  - Submits a job script rendered by MODAK to its scheduler (Slurm C(sbatch), PBS/Torque
    C(qsub), LSF C(bsub), or any scheduler MODAK has a backend for) or runs it in the
    background without a scheduler (C(local)), and reports its state.
  - The module knows no scheduler itself. It executes the scheduler backend's job control,
    data that MODAK's plan carries (O(control)) - the submit, query and cancel commands,
    how to read their answers and how the native states map to the portable ones. Given
    only O(scheduler), the action plugin fills O(control) from MODAK's registry on the
    controller.
  - Submission is idempotent. The job's work directory keeps a record of the run id and the
    script's SHA-256; the same run is never submitted twice, and a changed script under an
    old run id is an error (ask for a new run id instead).
  - One exception - a job that ended C(COMPLETED) but left no output at all (its output
    file missing or empty, as when the disk was full) lost its result; O(state=submitted),
    V(ended) and V(finished) submit the run again (RV(lost_jobs)), at most twice.
  - Final states are C(COMPLETED), C(FAILED), C(CANCELLED), C(TIMEOUT), C(NODE_FAIL),
    C(OUT_OF_MEMORY), C(PREEMPTED), C(BOOT_FAIL) and C(DEADLINE), each with the exit code
    where the scheduler reports one.
  - V(status) and V(cancelled) need neither the job script nor the run's record. A run
    never copied to the front-end is reported not submitted, and nothing is written there.
    A run whose record was lost is found by its run id while the scheduler lists the job
    (queued or running) - in its comment under Slurm and LSF, at the end of its name under
    PBS (the job script's C(#PBS -N NAME-RUNID); C(qstat -f), the user's own jobs not
    finished) - else
    by what its work directory holds - the job's first line in its output, which names the
    job (every batch scheduler, once the job started; a job that ended long ago included),
    or a local run's PID file. Its record is then written again, a warning says so, and
    nothing is submitted twice.
  - Uses only the Python standard library, so that it runs with a front-end's own Python.
options:
  workdir:
    description: The job's work directory on the front-end; it holds the job script.
    type: path
    required: true
  script:
    description: The job script, relative to O(workdir).
    type: str
    default: job.sh
  scheduler:
    description:
      - The scheduler's name (C(slurm), C(pbs) or C(torque), C(lsf), C(local) or C(none)),
        for messages and for the action plugin to fill O(control).
    type: str
    required: true
  control:
    description:
      - The scheduler backend's job control (the plan's C(job_control)).
      - Filled by the action plugin from O(scheduler) when omitted.
    type: dict
  run_id:
    description: The run this submission belongs to (MODAK's plan run id).
    type: str
    required: true
  state:
    description:
      - V(submitted) submits unless this run was submitted already.
      - V(ended) does the same, then waits until the job ends (at most O(timeout) seconds),
        printing the job's state and the time since submission when it changes, else at
        the first status query O(poll) seconds or more after the last line, and reports
        the final state without failing.
      - The status is asked for half a second after submission, then after a quarter of
        the time waited so far, at most every O(poll) seconds (a job of a few seconds, as a
        search's trial, is seen ended within about a second of its end).
      - V(finished) is V(ended), then fails unless the job ended C(COMPLETED).
      - V(status) only reports.
      - The waiting is done by the controller (an action plugin), one short status query
        per poll; a dropped SSH connection during a poll is retried (O(retries)) and, when
        the front-end stays unreachable, the failure says that the job keeps running and
        that the same task run again reattaches to it (a run is never submitted twice).
      - A job the scheduler holds pending for a reason it never starts for as it is (Slurm's
        C(PartitionConfig) or C(PartitionNodeLimit), for one that asks for more nodes than its
        partition has, or
        C(PartitionTimeLimit), C(BadConstraints), C(InvalidAccount), a per-job limit of its
        association or QOS; PBS Professional's comment C(Can Never Run) ends the wait of
        V(ended) and V(finished) at once; the job is cancelled and the task fails, naming the
        reason.
      - V(cancelled) cancels the run's job if it is still active.
    type: str
    choices: [submitted, ended, finished, status, cancelled]
    default: submitted
  stdout:
    description: The job's standard output file, relative to O(workdir).
    type: str
    required: true
  stderr:
    description: The job's standard error file; omitted means combined with O(stdout).
    type: str
  walltime:
    description: Seconds after which a V(local) job is stopped and reported C(TIMEOUT).
    type: int
  timeout:
    description:
      - Seconds O(state=ended) and O(state=finished) wait; then the job is reported as it
        is (still active), and V(finished) fails.
    type: int
    default: 3600
  poll:
    description: The longest time in seconds between two status queries while waiting, and
      between two lines that say the job's state.
    type: int
    default: 5
  retries:
    description: Consecutive failed connections to the front-end tolerated while waiting.
    type: int
    default: 5
author:
  - MODAK developers (@modak)
notes:
  - Supports check mode; a submission that would happen reports C(changed) without
    submitting.
"""

EXAMPLES = r"""
- name: Submit the run (once)
  modak.modak.modak_job:
    workdir: ~/modak-runs/mnist-cnn-r1a2b3c4
    scheduler: slurm
    run_id: r1a2b3c4
    stdout: mnist-cnn.out

- name: Wait for it and fail unless it completed
  modak.modak.modak_job:
    workdir: ~/modak-runs/mnist-cnn-r1a2b3c4
    scheduler: slurm
    run_id: r1a2b3c4
    stdout: mnist-cnn.out
    state: finished
    timeout: 1800

- name: Cancel it
  modak.modak.modak_job:
    workdir: ~/modak-runs/mnist-cnn-r1a2b3c4
    scheduler: slurm
    run_id: r1a2b3c4
    stdout: mnist-cnn.out
    state: cancelled
"""

RETURN = r"""
lost_jobs:
  description: Earlier jobs of the run that completed without leaving any output.
  returned: when the run was submitted again for that reason
  type: list
  elements: str
job_id:
  description: The scheduler's job id (C(local-PID) without a scheduler).
  returned: when the run was submitted
  type: str
  sample: "42"
submitted:
  description: Whether this call submitted the job.
  returned: always
  type: bool
state:
  description: The job's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...).
  returned: when the run was submitted
  type: str
  sample: COMPLETED
exit_code:
  description: The job script's exit code, where known.
  returned: when the run was submitted
  type: int
terminal:
  description: Whether the state is final.
  returned: when the run was submitted
  type: bool
reason:
  description: The scheduler's reason for a pending job, or why a state was inferred.
  returned: when known
  type: str
stuck:
  description: For a pending job whose reason means that it never starts as it is, what
    that reason means (the job is then cancelled by the wait); null otherwise.
  returned: when the run was submitted
  type: str
cancelled:
  description: Whether the wait cancelled a job that could never start (see O(state)).
  returned: when the wait ended for such a job
  type: bool
stdout_path:
  description: Absolute path of the job's standard output on the front-end.
  returned: always
  type: str
stderr_path:
  description: Absolute path of the job's standard error, when separate.
  returned: always
  type: str
elapsed_s:
  description: Seconds the workload ran, from the job script's final line.
  returned: when the job script finished
  type: float
submitted_at:
  description: When the run was submitted (seconds since the epoch, the front-end's clock).
  returned: when the run was submitted
  type: float
now:
  description: The front-end's clock at this status query.
  returned: always
  type: float
waited_s:
  description: Seconds the controller waited (O(state=ended) and O(state=finished)).
  returned: when waiting
  type: float
"""

import fcntl
import hashlib
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.modak.modak.plugins.module_utils.modak_jobctl import (
    JobError, Local, job_left, job_line, output_size, scheduler as get_scheduler)

RECORD = ".modak-job.json"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(65536), b""):
            h.update(chunk)
    return h.hexdigest()


def load_record(workdir):
    try:
        with open(os.path.join(workdir, RECORD)) as f:
            return json.load(f)
    except (IOError, OSError, ValueError):
        return None


def save_record(workdir, record):
    tmp = os.path.join(workdir, RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(workdir, RECORD))


def find_job(sched, workdir, stdout, run_id):
    """The job of ``run_id`` submitted before, when the run has no record, and how it was
    found ((None, None): none was): the one its scheduler lists by the run id (Slurm's and
    LSF's comment, PBS's job name, while they list it), else the one the work directory
    shows (a local run's PID file; the job's first line in its output, which names it:
    after the scheduler has forgotten it)."""
    job_id = sched.find(run_id) if hasattr(sched, "find") else None
    if job_id is not None:
        return job_id, "its run id"
    job_id = job_left(sched, workdir, stdout, run_id)
    return job_id, None if job_id is None else "what it left in %s" % workdir


MAX_LOST = 2  # resubmissions of a run whose jobs completed without any output
ASKING = ("status", "cancelled")  # the states that submit nothing


def main():
    module = AnsibleModule(
        argument_spec=dict(
            workdir=dict(type="path", required=True),
            script=dict(type="str", default="job.sh"),
            scheduler=dict(type="str", required=True),
            control=dict(type="dict"),
            run_id=dict(type="str", required=True),
            state=dict(type="str", default="submitted",
                       choices=["submitted", "ended", "finished", "status", "cancelled"]),
            stdout=dict(type="str", required=True),
            stderr=dict(type="str"),
            walltime=dict(type="int"),
            timeout=dict(type="int", default=3600),
            poll=dict(type="int", default=5),
            retries=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    workdir = p["workdir"]
    script = os.path.join(workdir, p["script"])
    result = dict(changed=False, submitted=False,
                  stdout_path=os.path.join(workdir, p["stdout"]),
                  stderr_path=os.path.join(workdir, p["stderr"]) if p["stderr"] else None)
    staged = os.path.isfile(script)
    if not staged and p["state"] not in ASKING:
        module.fail_json(msg="job script %s does not exist" % script, **result)
    try:
        sched = get_scheduler(p["control"])
    except JobError as exc:
        module.fail_json(msg="scheduler %s: %s" % (p["scheduler"], exc), **result)
    if not staged:
        # a run never staged here (cancelling a request that was never deployed): nothing
        # is written on the front-end, and a job of the run is found by its run id
        status_of(module, p, sched, None, result, digest=None)
    digest = sha256(script)
    # one submitter per run at a time: the check, the submission and the record are one step
    # (two deploys of the same run at the same moment submit once)
    lock = open(os.path.join(workdir, RECORD + ".lock"), "a")
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    record = load_record(workdir)
    if record and record.get("run_id") == p["run_id"] and record.get("sha256") != digest:
        module.fail_json(msg="the job script of run %s changed since it was submitted as job %s;"
                         " plan a new run id to submit the new script"
                         % (p["run_id"], record.get("job_id")), **result)
    if record and record.get("run_id") != p["run_id"]:
        module.fail_json(msg="%s holds run %s, not %s: each run needs its own work directory"
                         % (workdir, record.get("run_id"), p["run_id"]), **result)

    try:
        lost, status = [], None
        if record is not None and p["state"] in ("submitted", "ended", "finished") and \
                not output_size(result["stdout_path"]):
            status = sched.status(workdir, record["job_id"], result["stdout_path"])
        if status is not None and status.state == "COMPLETED":
            # completed but left no output at all (the disk was full, the work directory was
            # cleaned): its result is lost, and submitting the run again loses nothing
            status = None
            lost = record.get("lost_jobs", []) + [record["job_id"]]
            if len(lost) > MAX_LOST:
                module.fail_json(msg="jobs %s of run %s completed without any output; not "
                                 "submitted again: look at the front-end's disk and %s"
                                 % (", ".join(lost), p["run_id"], workdir), **result)
            record = None
            result["lost_jobs"] = lost
        if record is None and p["state"] in ("submitted", "ended", "finished"):
            result["changed"] = True
            if module.check_mode:
                module.exit_json(msg="would submit run %s" % p["run_id"], **result)
            # a job of this run that the scheduler lists or this work directory shows was
            # submitted (its record was lost): adopt it
            job_id, found_by = find_job(sched, workdir, result["stdout_path"], p["run_id"])
            if job_id is None or job_id in lost:
                if isinstance(sched, Local):
                    job_id = sched.submit(workdir, p["script"], p["stdout"], p["stderr"],
                                          walltime=p["walltime"])
                else:
                    job_id = sched.submit(workdir, p["script"], p["stdout"], p["stderr"],
                                          run_id=p["run_id"])
                result["submitted"] = True
            record = {"run_id": p["run_id"], "sha256": digest, "job_id": job_id,
                      "scheduler": p["scheduler"]}
            if result["submitted"]:  # (an adopted job's submission time is not known here)
                record["submitted_at"] = time.time()
            else:
                module.warn("the record of run %s was lost; its job %s, found by %s, was "
                            "adopted, and nothing was submitted again"
                            % (p["run_id"], job_id, found_by))
            if lost:
                record["lost_jobs"] = lost
                module.warn("job %s of run %s completed without any output (its result was "
                            "lost: a full disk?); the run was submitted again as job %s"
                            % (lost[-1], p["run_id"], job_id))
            try:
                save_record(workdir, record)
            except (IOError, OSError) as exc:
                module.fail_json(
                    msg="job %s of run %s was submitted and runs, but its record could not be "
                    "written in %s (%s): free the space, then run the same command again - it "
                    "finds the job by its run id and does not submit it twice"
                    % (job_id, p["run_id"], workdir, exc), job_id=job_id, **result)
    except JobError as exc:
        module.fail_json(msg=str(exc), **result)
    status_of(module, p, sched, record, result, digest, status)


def status_of(module, p, sched, record, result, digest, status=None):
    """Report (and with O(state=cancelled), cancel) the job of ``record``; without a record
    (its run never submitted, or its record lost), the job the scheduler knows by the run
    id, if any, whose record is then written again where the run's job script is (its
    ``digest``: None where there is none), so that a deploy after the cancel finds it ended
    and does not submit the run again.  Exits the module."""
    workdir = p["workdir"]
    try:
        if record is None and p["state"] in ASKING:
            job_id = find_job(sched, workdir, result["stdout_path"], p["run_id"])[0]
            if job_id is not None:
                record = {"run_id": p["run_id"], "sha256": digest, "job_id": job_id,
                          "scheduler": p["scheduler"]}
                if digest is not None and not module.check_mode:
                    try:
                        save_record(workdir, record)
                    except (IOError, OSError) as exc:
                        module.warn("job %s of run %s was found, but its record could not "
                                    "be written in %s (%s)" % (job_id, p["run_id"], workdir,
                                                               exc))
        if record is None:
            module.exit_json(msg="run %s was not submitted" % p["run_id"], **result)
        job_id = record["job_id"]
        result["job_id"] = job_id
        result["submitted_at"] = record.get("submitted_at")
        if status is None:  # (unless asked above, of the same job)
            status = sched.status(workdir, job_id, result["stdout_path"])

        if p["state"] == "cancelled" and not status.terminal:
            result["changed"] = True
            if not module.check_mode:
                sched.cancel(workdir, job_id)
                for dummy in range(60):
                    status = sched.status(workdir, job_id, result["stdout_path"])
                    if status.terminal:
                        break
                    time.sleep(1)
    except JobError as exc:
        module.fail_json(msg=str(exc), **result)

    result.update(status.as_dict(), now=time.time())
    line = job_line(result["stdout_path"])
    if line is not None:
        result["elapsed_s"] = line.get("elapsed_s")
    # (the action plugin waits for ended/finished: here they report once, as status does)
    if p["state"] == "finished" and status.terminal:
        if status.state != "COMPLETED":
            module.fail_json(msg="job %s ended %s (exit code %s)%s" % (
                job_id, status.state, status.exit_code,
                ": " + status.reason if status.reason else ""), **result)
    module.exit_json(msg="job %s is %s" % (job_id, status.state), **result)


if __name__ == "__main__":
    main()
