# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Job control on an HPC front-end: submit, status, cancel, find.

Runs on the front-end (old Pythons, no MODAK installed): standard library only.
A batch scheduler is not written here: its commands, the reading of their output and
its map of states come as data from its MODAK backend (``modak_lib/schedulers/NAME.py``,
``control()``, carried by the plan as ``job_control``), and ``Batch`` executes them.
``Local`` (no scheduler: the script in its own session, its state in files) is the one
kind of job control that is code here.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
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
# the line a job script of a scheduler that names its jobs prints first (its run and job id)
START_LINE = re.compile(r'^\{"modak": "job-start", .*\}$')
START_SCAN = 65536  # how far into a job's output its first line is looked for (a prolog's lines)
# a scheduler command that failed because the scheduler did not answer (slurmctld or the
# PBS server down or restarting), as opposed to one that answered "no such job"
NO_ANSWER = re.compile(r"contact|connect|communication|timed? ?out|socket|refused|unreachable|"
                       r"temporarily|try again|not responding|no route", re.IGNORECASE)
UNKNOWN = "UNKNOWN"  # not final: the wait goes on


def no_answer(command, rc, out, err, extra=None):
    """A Status saying the scheduler did not answer, or None when it did; ``extra``: the
    backend's own "not answering" messages (a compiled pattern), besides the generic ones."""
    text = (err or "") + (out or "")
    if rc != 0 and (NO_ANSWER.search(text) or (extra is not None and extra.search(text))):
        return Status(UNKNOWN, reason="%s: the scheduler did not answer (%s); still waiting"
                      % (command, " ".join(text.split())[:200]))
    return None


class JobError(Exception):
    pass


def run(argv, cwd=None, check=True, env=None, stdin=None):
    try:
        source = open(stdin) if stdin else None
    except (IOError, OSError) as exc:
        raise JobError("cannot read %s: %s" % (stdin, exc))
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=source, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, universal_newlines=True)
        out, err = proc.communicate()
    except OSError as exc:  # the command is not there
        if check:
            raise JobError("%s: %s" % (argv[0], exc))
        return 127, "", str(exc)
    finally:
        if source:
            source.close()
    if check and proc.returncode != 0:
        raise JobError("%s failed (%d): %s" % (" ".join(argv), proc.returncode,
                                               (err or out).strip()[-1000:]))
    return proc.returncode, out, err


def _marked(lines, pattern):
    """The first of ``lines`` that ``pattern`` (a MODAK marker line) matches, parsed; None
    when none does, or when that one is not JSON."""
    for line in lines:
        if pattern.match(line.strip()):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def job_line(path):
    """The {"modak": "job", ...} line the job script prints last, or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return None
    return _marked(reversed(lines), JOB_LINE)


def started_job(path, run_id):
    """The id of the job of run ``run_id`` that started and wrote ``path``, as its first
    line (``{"modak": "job-start", ...}``) names it; None when there is no such line.  Only
    the first such line counts: the job script prints it before the application starts, so
    what the application prints cannot name another job."""
    try:
        with open(path) as f:
            head = f.read(START_SCAN)
    except (IOError, OSError):
        return None
    rec = _marked(head.splitlines(), START_LINE)
    if isinstance(rec, dict) and rec.get("run_id") == run_id and rec.get("job_id"):
        return str(rec["job_id"])
    return None


def job_left(sched, workdir, stdout, run_id):
    """The job of run ``run_id`` that this work directory shows was submitted, when its
    record was lost: the job a local run started (its PID file), or the job whose first
    line is in the run's output (:func:`started_job`), which is there after the scheduler
    has forgotten the job; None when neither is."""
    if isinstance(sched, Local):
        pid = _read_int(os.path.join(workdir, Local.PID))
        return None if pid is None else "local-%d" % pid
    return started_job(stdout, run_id)


class Status(object):
    def __init__(self, state, exit_code=None, reason=None, stuck=None):
        self.state = state
        self.exit_code = exit_code
        self.reason = reason
        self.stuck = stuck  # (pending for a reason it never starts for: what that means)

    @property
    def terminal(self):
        return self.state in TERMINAL

    def as_dict(self):
        return {"state": self.state, "exit_code": self.exit_code, "terminal": self.terminal,
                "reason": self.reason, "stuck": self.stuck}


# ---------------------------------------------------------------------------
def _fill(words, values):
    """argv words with their {placeholders} filled (each word stays one word)."""
    out = []
    for word in words:
        for key, value in values.items():
            word = word.replace("{%s}" % key, "" if value is None else str(value))
        out.append(word)
    return out


def _read_fields(query, out):
    """The fields a query's output holds, by MODAK's names ({} when it names no job)."""
    names = query.get("fields") or {}
    if "split" in query:
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if not lines:
            return {}
        values = lines[0].strip().split(query["split"])
        return dict((k, v.strip()) for k, v in zip(names, values) if v.strip())
    if "records" in query:  # a full listing of the one job asked about (PBS's qstat -f ID)
        rows = _records(out, query["records"], names)
        return dict((k, v) for k, v in rows[0].items() if v and k != "job_id") if rows else {}
    # "pairs": KEY=VALUE words
    pairs = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    return dict((k, pairs[v]) for k, v in names.items() if v in pairs)


def _records(out, head, names):
    """The jobs a full listing describes (PBS's ``qstat -f``): each starts with a line
    ``HEAD ID`` and goes on with ``KEY = VALUE`` lines, a long value continued on the lines
    after it (indented, without " = ").  Each job as a dict: ``job_id``, and MODAK's names
    for the keys ``names`` maps them to ("" where the job has none)."""
    jobs, pairs, key = [], None, None
    for line in out.splitlines():
        if line.startswith(head):
            pairs, key = {}, None
            jobs.append((line[len(head):].strip(), pairs))
        elif pairs is None or not line.strip():
            continue
        elif " = " in line:
            key, dummy, value = line.partition(" = ")
            key = key.strip()
            pairs[key] = value.strip()
        elif key is not None and line[:1] in ("\t", " "):
            pairs[key] += line.strip()
    return [dict([("job_id", job_id)] + [(k, pairs.get(v, "")) for k, v in names.items()])
            for job_id, pairs in jobs]


class Batch(object):
    """A batch scheduler described by its backend's data (MODAK's ``SchedulerSpec.control``,
    carried by the plan): submit, status, cancel and find, executed and read generically."""

    def __init__(self, control):
        self.c = control
        self.name = control.get("name", "scheduler")
        extra = control.get("silent")
        self.silent = re.compile(extra, re.IGNORECASE) if extra else None

    def submit_argv(self, script, stdout, stderr, run_id):
        sub = self.c["submit"]
        argv = list(sub["argv"])
        extra = sub.get("stderr", []) if stderr else sub.get("no_stderr", [])
        at = argv.index("{script}") if "{script}" in argv else len(argv)
        argv[at:at] = extra
        return _fill(argv, {"script": script, "stdout": stdout, "stderr": stderr,
                            "run_id": run_id or ""})

    def submit(self, workdir, script, stdout, stderr, run_id=None):
        sub = self.c["submit"]
        argv = self.submit_argv(script, stdout, stderr, run_id)
        stdin = None
        if sub.get("stdin"):
            stdin = os.path.join(workdir, _fill([sub["stdin"]], {"script": script})[0])
        rc, out, err = run(argv, cwd=workdir, stdin=stdin)
        m = re.search(sub["job_id"], out)
        if not m:
            raise JobError("%s printed no job id: %r" % (argv[0], out))
        return m.group(1)

    def status(self, workdir, job_id, stdout):
        c = self.c
        fields = None
        for query in c["queries"]:
            argv = _fill(query["argv"], {"job_id": job_id})
            rc, out, err = run(argv, check=False)
            if rc != 0:
                silent = no_answer(argv[0], rc, out, err, self.silent)
                if silent and not query.get("quiet_failure"):
                    return silent
                continue
            found = _read_fields(query, out)
            native = found.get("state", "").split(" ")[0].rstrip("+")
            if not native:
                continue
            state = c["states"].get(native, "ENDED")
            if native in c.get("marked", ()):
                # the scheduler is still cleaning up: its marks in the output settle the end
                ended = _end_marks(stdout, None, c.get("marks", ()))
                if ended is not None:
                    ended.reason = "ended %s; %s is still cleaning up its processes" % (
                        ended.state, self.name)
                    return ended
            if state in ACTIVE or state == UNKNOWN:
                return Status(state, reason=found.get("reason") or None,
                              stuck=self._stuck(state, found.get("reason")))
            if query.get("active_only"):
                continue
            fields = dict(found, native=native, state=state)
            break
        if fields is None:  # no query knows the job any more: its output says how it ended
            return _classify_end(stdout, None, c.get("marks", ()),
                                 "%s knows no job %s any more" % (self.name, job_id))
        return self._ended(fields, stdout)

    def _stuck(self, state, reason):
        """What a pending job's ``reason`` says, where the job never starts for it (the
        backend's ``stuck``); None otherwise."""
        stuck = self.c.get("stuck")
        if state != "PENDING" or not stuck or not reason:
            return None
        if any(fnmatch.fnmatchcase(reason, p) for p in stuck.get("reasons", ())):
            return stuck.get("says") or reason
        return None

    def _ended(self, fields, stdout):
        c = self.c
        state, code = fields["state"], None
        reason = fields.get("reason")
        reason = None if reason in (None, "None", "(null)") else reason
        exit_rule = c.get("exit", {})
        raw = fields.get("exit")
        if exit_rule.get("format") == "code:signal":
            m = re.match(r"(\d+):(\d+)", raw or "")
            if m:
                code = int(m.group(1)) or (128 + int(m.group(2)) if int(m.group(2)) else 0)
        elif raw is not None and raw.lstrip("-").isdigit():
            code = int(raw)
            by_code = exit_rule.get("codes", {}).get(str(code))
            if by_code:
                return Status(by_code, code, reason)
            if exit_rule.get("signal_from") is not None and code >= exit_rule["signal_from"]:
                return Status(exit_rule.get("signalled", "FAILED"), code, reason)
        never = c.get("never_started")
        if never and fields["native"] == never["state"] and \
                not any(f in fields for f in never["without"]) and not output_size(stdout):
            return Status("CANCELLED", None, "ended before it started (deleted while queued)")
        if state == "ENDED":  # the scheduler does not say how: the output does
            return _classify_end(stdout, code, c.get("marks", ()))
        if state == "COMPLETED" and code:
            state = "FAILED"
        return Status(state, code, reason)

    def cancel(self, workdir, job_id):
        run(_fill(self.c["cancel"], {"job_id": job_id}))

    def find(self, run_id):
        """The id of a job of this user whose run mark names the run, or None."""
        find = self.c.get("find")
        if not find:
            return None
        user = pwd.getpwuid(os.getuid()).pw_name
        rc, out, err = run(_fill(find["argv"], {"user": user}), check=False)
        if rc != 0:
            return None
        match = dict((k, _fill([v], {"run_id": run_id, "user": user})[0])
                     for k, v in find["match"].items())
        if "records" in find:
            rows = _records(out, find["records"], find["fields"])
        else:
            rows = [dict(zip(find["fields"], [v.strip() for v in line.split(find["split"])]))
                    for line in out.splitlines()]
        for row in rows:
            if row.get("job_id") and all(fnmatch.fnmatchcase(row.get(k) or "", v)
                                         for k, v in match.items()):
                return row["job_id"]
        return None


def _end_marks(stdout, code, marks):
    """What the scheduler wrote into the job's output when it ended the job (a time limit,
    a cancel, the OOM killer): the first of ``marks`` ([text, state]) found, or None."""
    text = ""
    try:
        with open(stdout) as f:
            text = f.read()[-20000:]
    except (IOError, OSError):
        pass
    for mark, state in marks:
        if mark in text:
            return Status(state, code)
    return None


def _classify_end(stdout, code, marks, missing=None):
    """A finished job without a trustworthy final state: read what it left."""
    marked = _end_marks(stdout, code, marks)
    if marked is not None:
        return marked
    rec = job_line(stdout)
    if rec is not None:
        c = rec.get("exit_code")
        return Status("COMPLETED" if c == 0 else "FAILED", c)
    if code == 0:
        return Status("COMPLETED", 0)
    return Status("FAILED", code, "%s and its output has no MODAK job line" % missing
                  if missing else "the job ended without its MODAK job line "
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


def scheduler(control):
    """The job control a backend's data (``SchedulerSpec.job_control()``) describes."""
    if not isinstance(control, dict) or not control.get("name"):
        raise JobError("no job control given: pass the plan's job_control")
    if control.get("local"):
        return Local()
    for key in ("submit", "queries", "states", "cancel"):
        if key not in control:
            raise JobError("the job control of %s has no %r" % (control["name"], key))
    return Batch(control)
