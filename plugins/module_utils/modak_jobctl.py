# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Job control on an HPC front-end: submit, status, cancel for slurm, pbs and local.

Runs on the front-end (old Pythons, no MODAK installed): standard library only.
Each scheduler is one class with its commands and the parsing of their output.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import pwd
import re
import signal
import subprocess
import time

TERMINAL = frozenset(["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                      "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"])
ACTIVE = frozenset(["PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                    "REQUEUED", "RESIZING", "STAGE_OUT", "SIGNALING"])
JOB_LINE = re.compile(r'^\{"modak": "job", .*\}$')
# a scheduler command that failed because the scheduler did not answer (slurmctld or the
# PBS server down or restarting), as opposed to one that answered "no such job"
NO_ANSWER = re.compile(r"contact|connect|communication|timed? ?out|socket|refused|unreachable|"
                       r"temporarily|try again|not responding|no route", re.IGNORECASE)
UNKNOWN = "UNKNOWN"  # not final: the wait goes on


def no_answer(command, rc, out, err):
    """A Status saying the scheduler did not answer, or None when it did."""
    text = (err or "") + (out or "")
    if rc != 0 and NO_ANSWER.search(text):
        return Status(UNKNOWN, reason="%s: the scheduler did not answer (%s); still waiting"
                      % (command, " ".join(text.split())[:200]))
    return None


class JobError(Exception):
    pass


def run(argv, cwd=None, check=True, env=None):
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, universal_newlines=True)
    out, err = proc.communicate()
    if check and proc.returncode != 0:
        raise JobError("%s failed (%d): %s" % (" ".join(argv), proc.returncode,
                                               (err or out).strip()[-1000:]))
    return proc.returncode, out, err


def job_line(path):
    """The {"modak": "job", ...} line the job script prints last, or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return None
    for line in reversed(lines):
        if JOB_LINE.match(line.strip()):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


class Status(object):
    def __init__(self, state, exit_code=None, reason=None):
        self.state = state
        self.exit_code = exit_code
        self.reason = reason

    @property
    def terminal(self):
        return self.state in TERMINAL

    def as_dict(self):
        return {"state": self.state, "exit_code": self.exit_code, "terminal": self.terminal,
                "reason": self.reason}


# ---------------------------------------------------------------------------
class Slurm(object):
    name = "slurm"

    def submit(self, workdir, script, stdout, stderr, run_id=None):
        # the output files on the command line win over the script's directives, so that
        # the module reads what it was told the job writes; the run id rides in the job's
        # comment so that a lost record can be found again (find)
        argv = ["sbatch", "--parsable", "--output=" + stdout]
        argv += ["--comment=modak-run=" + run_id] if run_id else []
        argv += ["--error=" + stderr] if stderr else []
        rc, out, err = run(argv + [script], cwd=workdir)
        job_id = out.strip().split(";", maxsplit=1)[0]
        if not job_id.isdigit():
            raise JobError("sbatch printed no job id: %r" % out)
        return job_id

    def status(self, workdir, job_id, stdout):
        rc, out, err = run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], check=False)
        silent = no_answer("squeue", rc, out, err)
        if silent:
            return silent
        line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
        if line:
            state, dummy, reason = line.partition("|")
            if state == "COMPLETING":
                # the job has ended and Slurm is cleaning up its processes (a container
                # started when the job was cancelled can take a minute); Slurm says only
                # COMPLETING until then, but slurmstepd has already written why it killed
                # the job into its output: a cancel or a time-out is final now, a normal end
                # waits until its output is complete
                ended = _end_marks(stdout, None)
                if ended is not None:
                    ended.reason = "ended %s; Slurm is still cleaning up its processes" % (
                        ended.state)
                    return ended
            if state in ACTIVE:
                return Status(state, reason=reason or None)
        # finished (or finishing): sacct when accounting runs, else scontrol's memory
        rc, out, err = run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"],
                           check=False)
        if rc == 0 and out.strip():
            state, dummy, code = out.strip().splitlines()[0].partition("|")
            return _slurm_status(state.split()[0], code)
        rc, out, err = run(["scontrol", "-o", "show", "job", job_id], check=False)
        silent = no_answer("scontrol", rc, out, err)
        if silent:
            return silent
        ended = self._parse_scontrol(rc, out)
        if ended is not None:
            return ended
        return _from_job_line(stdout, "slurm knows no job %s any more" % job_id)

    @staticmethod
    def _parse_scontrol(rc, out):
        if rc == 0 and "JobState=" in out:
            fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            return _slurm_status(fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""),
                                 fields.get("Reason"))
        return None

    def cancel(self, workdir, job_id):
        run(["scancel", job_id])

    def find(self, run_id):
        """The id of a job of this user whose comment names the run, or None."""
        user = pwd.getpwuid(os.getuid()).pw_name
        rc, out, err = run(["squeue", "-h", "-u", user, "-o", "%i|%k"], check=False)
        if rc != 0:
            return None
        for line in out.splitlines():
            job_id, dummy, comment = line.strip().partition("|")
            if comment == "modak-run=" + run_id and job_id.isdigit():
                return job_id
        return None


def _slurm_status(state, code, reason=None):
    exit_code = None
    m = re.match(r"(\d+):(\d+)", code or "")
    if m:
        exit_code = int(m.group(1)) or (128 + int(m.group(2)) if int(m.group(2)) else 0)
    state = {"CANCELLED+": "CANCELLED"}.get(state, state.rstrip("+"))
    if state == "COMPLETED" and exit_code:
        state = "FAILED"
    return Status(state, exit_code, None if reason in (None, "None") else reason)


def _from_job_line(stdout, missing):
    rec = job_line(stdout)
    if rec is None:
        return Status("FAILED", None, missing + " and its output has no MODAK job line")
    code = rec.get("exit_code")
    return Status("COMPLETED" if code == 0 else "FAILED", code)


# ---------------------------------------------------------------------------
class Pbs(object):
    """PBS/Torque ``qsub``/``qstat``/``qdel``; also Slurm's slurm-wlm-torque wrappers.

    Final states come from ``qstat -f`` (``job_state`` and ``exit_status``); where
    those are gone or ambiguous (the wrappers report C for every end), the job's own
    last line (exit code) and the output's scheduler messages decide.
    """
    name = "pbs"

    def submit(self, workdir, script, stdout, stderr, run_id=None):
        argv = ["qsub", "-o", stdout] + (["-e", stderr] if stderr else ["-j", "oe"]) + [script]
        rc, out, err = run(argv, cwd=workdir)
        job_id = out.strip().splitlines()[-1].strip() if out.strip() else ""
        if not job_id or not job_id.split(".", maxsplit=1)[0].isdigit():
            raise JobError("qsub printed no job id: %r" % out)
        return job_id

    def status(self, workdir, job_id, stdout):
        rc, out, err = run(["qstat", "-f", job_id], check=False)
        silent = no_answer("qstat", rc, out, err)
        if silent:
            return silent
        fields = {}
        for line in out.splitlines():
            if "=" in line:
                k, dummy, v = line.partition("=")
                fields[k.strip()] = v.strip()
        state = fields.get("job_state")
        if rc == 0 and state in ("Q", "H", "W", "T"):
            return Status("PENDING")
        if rc == 0 and state in ("R", "E"):
            return Status("RUNNING")
        code = fields.get("exit_status")
        if state == "C" and code is None and "exec_host" not in fields and \
                not output_size(stdout):
            # never ran (the wrappers report no exit status at all): deleted while queued
            return Status("CANCELLED", None, "ended before it started (deleted while queued)")
        if code is not None and code.lstrip("-").isdigit():
            code = int(code)
            if code == -11:
                return Status("TIMEOUT", code)
            if code >= 256:  # killed by signal code-256 (qdel sends SIGTERM)
                return Status("CANCELLED", code)
        return _classify_end(stdout, code if isinstance(code, int) else None)

    def cancel(self, workdir, job_id):
        run(["qdel", job_id])


def _end_marks(stdout, code):
    """What slurmstepd wrote into the output when it ended the job (a time limit, a cancel,
    the OOM killer), or None."""
    text = ""
    try:
        with open(stdout) as f:
            text = f.read()[-20000:]
    except (IOError, OSError):
        pass
    if "DUE TO TIME LIMIT" in text:
        return Status("TIMEOUT", code)
    if "CANCELLED AT" in text:
        return Status("CANCELLED", code)
    if "oom-kill" in text or "Out Of Memory" in text:
        return Status("OUT_OF_MEMORY", code)
    return None


def _classify_end(stdout, code):
    """A finished job without a trustworthy final state: read what it left."""
    marked = _end_marks(stdout, code)
    if marked is not None:
        return marked
    rec = job_line(stdout)
    if rec is not None:
        c = rec.get("exit_code")
        return Status("COMPLETED" if c == 0 else "FAILED", c)
    if code == 0:
        return Status("COMPLETED", 0)
    return Status("FAILED", code, "the job ended without its MODAK job line "
                  "(killed, cancelled or out of time)")


# ---------------------------------------------------------------------------
class Local(object):
    """No scheduler: the script runs under setsid in the background; files keep its state."""
    name = "local"
    PID = ".modak-local.pid"
    EXIT = ".modak-local.exit"
    CANCELLED = ".modak-local.cancelled"

    def submit(self, workdir, script, stdout, stderr, walltime=None):
        for f in (self.EXIT, self.CANCELLED):
            if os.path.exists(os.path.join(workdir, f)):
                os.unlink(os.path.join(workdir, f))
        limit = "timeout --signal=TERM --kill-after=10 %d " % walltime if walltime else ""
        err = "2>%s" % _q(stderr) if stderr else "2>&1"
        inner = "%sbash %s >%s %s; echo $? >%s" % (limit, _q(script), _q(stdout), err, self.EXIT)
        proc = subprocess.Popen(["setsid", "bash", "-c", inner], cwd=workdir,
                                stdin=open(os.devnull), stdout=open(os.devnull, "w"),
                                stderr=subprocess.STDOUT, close_fds=True)
        with open(os.path.join(workdir, self.PID), "w") as f:
            f.write(str(proc.pid))
        return "local-%d" % proc.pid

    def status(self, workdir, job_id, stdout):
        exit_file = os.path.join(workdir, self.EXIT)
        if os.path.exists(os.path.join(workdir, self.CANCELLED)):
            return Status("CANCELLED", _read_int(exit_file))
        if os.path.exists(exit_file):
            code = _read_int(exit_file)
            if code == 124:
                return Status("TIMEOUT", code)
            if code == 137:
                return Status("OUT_OF_MEMORY" if _oom(stdout) else "FAILED", code)
            return Status("COMPLETED" if code == 0 else "FAILED", code)
        pid = int(job_id.split("-", 1)[1])
        if _alive(pid):
            return Status("RUNNING")
        return Status("FAILED", None, "the local job's process is gone without an exit code")

    def cancel(self, workdir, job_id):
        pid = int(job_id.split("-", 1)[1])
        open(os.path.join(workdir, self.CANCELLED), "w").close()
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
            for dummy in range(40):
                if not _alive(pid):
                    break
                time.sleep(0.25)
            else:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass


def _q(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


def output_size(path):
    """The size of a job's output file, 0 when it is missing."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (IOError, OSError, ValueError):
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is not alive
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (IOError, OSError):
        return True


def _oom(stdout):
    try:
        with open(stdout) as f:
            return "Killed" in f.read()[-5000:]
    except (IOError, OSError):
        return False


SCHEDULERS = {"slurm": Slurm, "pbs": Pbs, "local": Local}


def scheduler(name):
    try:
        return SCHEDULERS[name]()
    except KeyError:
        raise JobError("unknown scheduler %r (slurm, pbs, local)" % name)
