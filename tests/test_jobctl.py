"""The front-end's job control (plugins/module_utils/modak_jobctl.py), driven by each
registered scheduler backend's data (modak_lib/schedulers/), against stand-in scheduler
commands: what it concludes when the scheduler answers, and when it does not.

Adding a scheduler backend = its file, its registry line and its rows in CONTRACT and
SUBMIT below (test_every_backend_has_contract_rows says which are missing)."""
import itertools
import json
import os
import sys

import pytest
from conftest import ROOT

from modak_lib.schedulers import SCHEDULERS

sys.path.insert(0, str(ROOT / "build/collections"))
jobctl = pytest.importorskip("ansible_collections.modak.modak.plugins.module_utils.modak_jobctl")
sys.path.pop(0)

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def control(name):
    """The backend's job control as the module receives it: through the plan's JSON."""
    return jobctl.scheduler(json.loads(json.dumps(SCHEDULERS[name].job_control())))


@pytest.fixture
def commands(tmp_path, monkeypatch):
    """commands(name=(exit code, stdout, stderr), ...): stand-ins first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def define(**answers):
        for name, (code, out, err) in answers.items():
            (bin_dir / f"{name}.stdout").write_text(out)
            (bin_dir / f"{name}.stderr").write_text(err)
            path = bin_dir / name
            path.write_text(f"#!/bin/sh\ncat '{bin_dir}/{name}.stdout'\n"
                            f"cat '{bin_dir}/{name}.stderr' >&2\nexit {code}\n")
            path.chmod(0o755)
    return define


def job_output(tmp_path, exit_code=None):
    out = tmp_path / "job.out"
    lines = ["training..."]
    if exit_code is not None:
        lines.append(json.dumps({"modak": "job", "run_id": "r1", "exit_code": exit_code,
                                 "elapsed_s": 1.0}))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_a_slurm_controller_that_does_not_answer_is_not_a_final_state(commands, tmp_path):
    commands(squeue=(1, "", DOWN), sacct=(1, "", "sacct: error: Problem talking to the "
                                                  "database: Connection refused"),
             scontrol=(1, "", DOWN))
    status = control("slurm").status(str(tmp_path), "42", job_output(tmp_path))
    assert status.state == "UNKNOWN" and not status.terminal
    assert "did not answer" in status.reason and "still waiting" in status.reason


def test_a_job_slurm_forgot_ends_by_its_own_last_line(commands, tmp_path):
    gone = "slurm_load_jobs error: Invalid job id specified"
    commands(squeue=(1, "", gone), sacct=(1, "", "sacct: error: accounting storage disabled"),
             scontrol=(1, "", gone))
    status = control("slurm").status(str(tmp_path), "42", job_output(tmp_path, 0))
    assert (status.state, status.exit_code) == ("COMPLETED", 0)


@pytest.mark.parametrize("reason, stuck", [
    ("PartitionConfig", True), ("PartitionNodeLimit", True), ("QOSMaxNodePerJobLimit", True),
    ("BadConstraints", True),
    ("AssocMaxWallDurationPerJobLimit", True), ("Resources", False), ("Priority", False),
    ("QOSMaxJobsPerUserLimit", False), ("AssocGrpCpuLimit", False), ("None", False)])
def test_a_pending_job_slurm_holds_for_good_is_said_stuck(reason, stuck, commands, tmp_path):
    """Slurm holds a job that asks for more than its partition has (PartitionConfig), or
    beyond a per-job limit, for good: the status says so (the wait then cancels it); a job
    that waits its turn, or for a user's or group's running jobs to end, is not stuck."""
    commands(squeue=(0, f"PENDING|{reason}\n", ""))
    status = control("slurm").status(str(tmp_path), "42", job_output(tmp_path))
    assert status.state == "PENDING" and not status.terminal
    assert bool(status.stuck) is stuck
    assert status.as_dict()["stuck"] == status.stuck


@pytest.mark.parametrize("comment, stuck", [
    ("Can Never Run: Insufficient amount of resource: ncpus (R: 64 A: 32 T: 32)", True),
    ("Not Running: Insufficient amount of resource: ncpus (R: 64 A: 0 T: 32)", False),
    (None, False)])
def test_a_queued_job_pbs_can_never_run_is_said_stuck(comment, stuck, commands, tmp_path):
    """PBS Professional's scheduler comments a job it can never run as asked ("Can Never
    Run: ..."): stuck, with that comment as its reason; one that waits its turn is not."""
    commands(qstat=qstat("Q", after=[f"    comment = {comment}"] if comment else []))
    status = control("pbs").status(str(tmp_path), "42", job_output(tmp_path))
    assert status.state == "PENDING" and status.reason == comment
    assert bool(status.stuck) is stuck


def test_a_pbs_server_that_does_not_answer_is_not_a_final_state(commands, tmp_path):
    commands(qstat=(1, "", "Communication failure.\nqstat: cannot connect to server pbs"))
    status = control("pbs").status(str(tmp_path), "42.pbs", job_output(tmp_path))
    assert status.state == "UNKNOWN" and not status.terminal


# ---------------------------------------------------------------------------
# the contract: what each scheduler's commands print -> the portable state and exit code.
# Formats as Slurm 22.05 (Debian 12) and its PBS/Torque wrappers print them; `None` for a
# command means it is not reached (or fails as when accounting is off).
NO_ACCT = (1, "", "sacct: error: Slurm accounting storage is disabled")
GONE = (1, "", "slurm_load_jobs error: Invalid job id specified")


def scontrol(state, code, reason="None"):
    return (0, f"JobId=42 JobName=train UserId=hpcuser(1000) JobState={state} Reason={reason} "
               f"Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode={code}\n", "")


SLURM = [
    # (case, squeue, sacct, scontrol, job's last line exit code, state, exit code)
    ("running", (0, "RUNNING|None\n", ""), None, None, None, "RUNNING", None),
    ("pending", (0, "PENDING|Resources\n", ""), None, None, None, "PENDING", None),
    ("suspended", (0, "SUSPENDED|None\n", ""), None, None, None, "SUSPENDED", None),
    ("completed", (0, "", ""), NO_ACCT, scontrol("COMPLETED", "0:0"), 0, "COMPLETED", 0),
    ("failed", (0, "", ""), NO_ACCT, scontrol("FAILED", "1:0", "NonZeroExitCode"), 1,
     "FAILED", 1),
    ("completed-nonzero", (0, "", ""), NO_ACCT, scontrol("COMPLETED", "3:0"), 3, "FAILED", 3),
    ("timeout", (0, "", ""), NO_ACCT, scontrol("TIMEOUT", "0:15", "TimeLimit"), None,
     "TIMEOUT", 143),
    ("cancelled", (0, "", ""), NO_ACCT, scontrol("CANCELLED", "0:15"), None, "CANCELLED", 143),
    ("node-fail", (0, "", ""), NO_ACCT, scontrol("NODE_FAIL", "0:0", "NodeDown"), None,
     "NODE_FAIL", 0),
    ("out-of-memory", (0, "", ""), NO_ACCT, scontrol("OUT_OF_MEMORY", "0:125"), None,
     "OUT_OF_MEMORY", 253),
    ("preempted", (0, "", ""), NO_ACCT, scontrol("PREEMPTED", "0:15"), None, "PREEMPTED", 143),
    ("sacct-cancelled-by", (0, "", ""), (0, "CANCELLED by 1000|0:15\n", ""), None, None,
     "CANCELLED", 143),
    ("sacct-completed", (0, "", ""), (0, "COMPLETED|0:0\n", ""), None, 0, "COMPLETED", 0),
    ("sacct-timeout", (0, "", ""), (0, "TIMEOUT|0:0\n", ""), None, None, "TIMEOUT", 0),
    ("forgotten-line-ok", GONE, NO_ACCT, GONE, 0, "COMPLETED", 0),
    ("forgotten-line-failed", GONE, NO_ACCT, GONE, 2, "FAILED", 2),
    ("forgotten-no-line", GONE, NO_ACCT, GONE, None, "FAILED", None),
    # Slurm says COMPLETING (squeue and scontrol alike) while it cleans up; slurmstepd has
    # written why it ended the job
    ("completing-cancelled", (0, "COMPLETING|None\n", ""), None, None, None, "CANCELLED", None,
     "slurmstepd: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-22T10:00:00 ***"),
    ("completing-timeout", (0, "COMPLETING|None\n", ""), None, None, None, "TIMEOUT", None,
     "slurmstepd: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-22T10:00:00 DUE TO "
     "TIME LIMIT ***"),
    ("completing-success", (0, "COMPLETING|None\n", ""), None, None, 0, "COMPLETING", None),
    ("controller-down", (1, "", DOWN), None, None, None, "UNKNOWN", None),
    ("controller-down-later", (0, "", ""), NO_ACCT, (1, "", DOWN), None, "UNKNOWN", None),
]


def qstat(state, exit_status=None, after=()):
    lines = ["Job Id: 42.localhost", "    Job_Name = train", f"    job_state = {state}"]
    if exit_status is not None:
        lines.append(f"    exit_status = {exit_status}")
    return (0, "\n".join(lines + list(after)) + "\n", "")


# `qsub -V` copies the user's environment into Variable_List, a long value that qstat -f
# continues on indented lines: a variable there named like a field is the value's, not the job's
COPIED_ENV = ["    Variable_List = PBS_O_HOME=/home/u,PBS_O_SHELL=/bin/bash,PBS_O_QUEUE=batch,",
              "\tPBS_O_WORKDIR=/home/u/run,", "\tjob_state=R"]


PBS = [
    # (case, qstat, job's last line exit code, extra output, state, exit code)
    ("queued", qstat("Q"), None, "", "PENDING", None),
    ("held", qstat("H"), None, "", "PENDING", None),
    ("running", qstat("R"), None, "", "RUNNING", None),
    ("exiting", qstat("E"), None, "", "RUNNING", None),
    ("completed", qstat("C", 0), 0, "", "COMPLETED", 0),
    ("completed-copied-env", qstat("C", 0, COPIED_ENV), 0, "", "COMPLETED", 0),
    ("failed", qstat("C", 1), 1, "", "FAILED", 1),
    ("suspended", qstat("S"), None, "", "SUSPENDED", None),
    ("walltime", qstat("C", -11), None, "", "TIMEOUT", -11),
    ("mem-limit", qstat("C", -10), None, "", "OUT_OF_MEMORY", -10),
    ("mom-aborted", qstat("C", -4), None, "", "NODE_FAIL", -4),
    ("exec-failed", qstat("C", -1), None, "", "BOOT_FAIL", -1),
    ("torque-walltime-mark", qstat("C"), None,
     "=>> PBS: job killed: walltime 3620 exceeded limit 3600", "TIMEOUT", None),
    ("qdel", qstat("C", 271), None, "", "CANCELLED", 271),
    # the Slurm wrappers: job_state C for every end, no exit_status
    ("wrapper-completed", qstat("C"), 0, "", "COMPLETED", 0),
    ("wrapper-failed", qstat("C"), 4, "", "FAILED", 4),
    ("wrapper-timeout", qstat("C"), None,
     "slurmstepd: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-22T10:00:00 DUE TO TIME "
     "LIMIT ***", "TIMEOUT", None),
    ("wrapper-cancelled", qstat("C"), None,
     "slurmstepd: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-22T10:00:00 ***",
     "CANCELLED", None),
    ("wrapper-oom", qstat("C"), None,
     "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=42.batch", "OUT_OF_MEMORY",
     None),
    ("unknown-job", (1, "", "qstat: Unknown Job Id 42.localhost"), 0, "", "COMPLETED", 0),
    ("server-down", (1, "", "Communication failure.\ncannot connect to server"), None, "",
     "UNKNOWN", None),
]


def _output(tmp_path, code, extra=""):
    return job_output(tmp_path, code) if not extra else _with(job_output(tmp_path, code), extra)


def _with(path, extra):
    with open(path, "a") as f:
        f.write(extra + "\n")
    return path


def bjobs(state, code="-"):
    return (0, f"{state}|{code}\n", "")


LSF_REPORT = "\n------------------------------------------------------------\nSender: LSF System\n"
LSF = [
    # (case, bjobs, job's last line exit code, extra output, state, exit code): the formats
    # LSF 10.1 documents (bjobs -o with a delimiter; the job report -oo appends); no LSF
    # runs here to record them
    ("pending", bjobs("PEND"), None, "", "PENDING", None),
    ("running", bjobs("RUN"), None, "", "RUNNING", None),
    ("suspended", bjobs("USUSP"), None, "", "SUSPENDED", None),
    ("done", bjobs("DONE", "-"), 0, LSF_REPORT + "Successfully completed.", "COMPLETED", None),
    ("exit-failed", bjobs("EXIT", "3"), 3, LSF_REPORT + "Exited with exit code 3.", "FAILED", 3),
    ("runlimit", bjobs("EXIT", "140"), None,
     LSF_REPORT + "TERM_RUNLIMIT: job killed after reaching LSF run time limit.\n"
     "Exited with exit code 140.", "TIMEOUT", 140),
    ("bkill", bjobs("EXIT", "130"), None,
     LSF_REPORT + "TERM_OWNER: job killed by owner.\nExited with exit code 130.", "CANCELLED",
     130),
    ("memlimit", bjobs("EXIT", "137"), None,
     LSF_REPORT + "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
     "OUT_OF_MEMORY", 137),
    ("preempted", bjobs("EXIT", "143"), None,
     LSF_REPORT + "TERM_PREEMPT: job killed after preemption.", "PREEMPTED", 143),
    ("host-failed", bjobs("EXIT", "-"), None,
     LSF_REPORT + "TERM_HOST: job killed by LSF due to a host failure.", "NODE_FAIL", None),
    ("unknown-host-state", bjobs("UNKWN"), None, "", "UNKNOWN", None),
    ("forgotten", (255, "", "Job <42> is not found\n"), 0, "", "COMPLETED", 0),
    ("lsf-down", (255, "", "LSF is down. Please wait ...\n"), None, "", "UNKNOWN", None),
]

# one table for every registered scheduler: (scheduler, case, the commands' answers, the
# job's last line exit code, extra output, the portable state, the exit code)
CONTRACT = (
    [("slurm", r[0], {"squeue": r[1], "sacct": r[2], "scontrol": r[3]}, r[4],
      r[7] if len(r) > 7 else "", r[5], r[6]) for r in SLURM]
    + [("pbs", r[0], {"qstat": r[1]}, r[2], r[3], r[4], r[5]) for r in PBS]
    + [("lsf", r[0], {"bjobs": r[1]}, r[2], r[3], r[4], r[5]) for r in LSF])
JOB_IDS = {"slurm": "42", "pbs": "42.localhost", "lsf": "42"}
BATCH = sorted(name for name, spec in SCHEDULERS.items() if "local" not in spec.control())


@pytest.mark.parametrize("sched,case,answers,line,extra,state,code", CONTRACT,
                         ids=[f"{c[0]}-{c[1]}" for c in CONTRACT])
def test_contract(sched, case, answers, line, extra, state, code, commands, tmp_path):
    absent = (127, "", "not reached")
    commands(**{name: answer or absent for name, answer in answers.items()})
    status = control(sched).status(str(tmp_path), JOB_IDS[sched],
                                   _output(tmp_path, line, extra))
    assert (status.state, status.exit_code) == (state, code)
    assert status.terminal == (state not in ("RUNNING", "PENDING", "COMPLETING", "SUSPENDED",
                                             "UNKNOWN"))


def reachable_states(spec):
    """Every portable state a backend's data can report."""
    c = spec.control()
    found = set(c["states"].values()) | {state for _, state in c.get("marks", ())}
    found |= set(c.get("exit", {}).get("codes", {}).values())
    found |= {c["exit"]["signalled"]} if "signalled" in c.get("exit", {}) else set()
    return (found - {"ENDED"}) | {"COMPLETED", "FAILED", "UNKNOWN"}


@pytest.mark.parametrize("sched", BATCH)
def test_every_backend_has_contract_rows(sched):
    """Every state a backend can report has a row (a new backend: add its rows)."""
    covered = {row[5] for row in CONTRACT if row[0] == sched}
    missing = reachable_states(SCHEDULERS[sched]) - covered - {
        "COMPLETING", "REQUEUED", "BOOT_FAIL", "DEADLINE"}  # rare Slurm-only states
    assert not missing, f"{sched}: no contract row ends {sorted(missing)}"
    assert sched in JOB_IDS and sched in SUBMIT


# what each scheduler prints when it accepts a job -> its id; the argv it was given and
# what it read on its standard input
SUBMIT = {
    "slurm": ("sbatch", "42\n", "42",
              ["--parsable", "--output=o.txt", "--comment=modak-run=r1", "--error=e.txt",
               "job.sh"]),
    "pbs": ("qsub", "42.localhost\n", "42.localhost",
            ["-o", "o.txt", "-e", "e.txt", "job.sh"]),
    "lsf": ("bsub", "Job <42> is submitted to default queue <normal>.\n", "42",
            ["-oo", "o.txt", "-Jd", "modak-run=r1", "-eo", "e.txt"]),
}


@pytest.mark.parametrize("sched", BATCH)
def test_submit_runs_the_backends_command(sched, tmp_path, monkeypatch):
    command, printed, job_id, argv = SUBMIT[sched]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / command).write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$@\" >'{tmp_path}/argv'\ncat >'{tmp_path}/stdin'\n"
        f"printf '{printed}'\n")
    (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "job.sh").write_text("#BSUB -J x\necho hi\n")
    got = control(sched).submit(str(tmp_path), "job.sh", "o.txt", "e.txt", run_id="r1")
    assert got == job_id
    assert (tmp_path / "argv").read_text().splitlines() == argv
    fed = "stdin" in SCHEDULERS[sched].control()["submit"]
    assert (tmp_path / "stdin").read_text() == ("#BSUB -J x\necho hi\n" if fed else "")


def test_a_submission_without_a_job_id_is_an_error(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bsub").write_text("#!/bin/sh\necho 'Request aborted by esub.'\n")
    (bin_dir / "bsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "job.sh").write_text("true\n")
    with pytest.raises(jobctl.JobError, match="bsub printed no job id"):
        control("lsf").submit(str(tmp_path), "job.sh", "o.txt", None, run_id="r1")


@pytest.mark.parametrize("sched,listing,found", [
    ("slurm", "41|\n42|modak-run=r1\n", "42"),
    ("slurm", "41|modak-run=r10\n", None),
    ("lsf", "41|-\n42|modak-run=r1\n", "42"),
])
def test_find_a_job_by_its_run(sched, listing, found, commands):
    commands(**{SCHEDULERS[sched].control()["find"]["argv"][0]: (0, listing, "")})
    assert control(sched).find("r1") == found


PBS_FULL = """Job Id: 40.server
    Job_Name = train-r1
    Job_Owner = someone@login1
    job_state = Q

Job Id: 41.server
    Job_Name = train-r10
    Job_Owner = {user}@login1
    job_state = Q

Job Id: 42.server
    Job_Name = a-rather-long-job-name-that-the-listing-wraps-onto-its-next-li
	ne-r1
    Job_Owner = {user}@login1
    Variable_List = PBS_O_HOME=/home/u,PBS_O_WORKDIR=/home/u/runs/x-r1,MODAK_
	RUN_ID=r1
    job_state = Q

Job Id: 43.server
    Job_Name = train-r3
    Job_Owner = {user}@login1
    job_state = C

Job Id: 44.server
    Job_Name = train-r4
    Job_Owner = {user}@login1
    job_state = F

Job Id: 45.server
    Job_Name = train-r5
    Job_Owner = {user}@login1
    job_state = R
"""


@pytest.mark.parametrize("run_id,found", [("r1", "42.server"), ("r10", "41.server"),
                                          ("r2", None), ("ne-r1", None), ("r3", None),
                                          ("r4", None), ("r5", "45.server")])
def test_a_queued_pbs_job_is_found_by_its_name(run_id, found, commands):
    """PBS keeps no comment: the job's name ends with its run id, and `qstat -f` lists every
    job in full, a long value wrapped onto indented lines; only the user's own jobs count
    (job 40 is another user's, with this run's name), and only those not finished: a
    completed one still listed (43, 44) is an earlier deploy's of the same script, in
    another run directory (CI adopted one, an hour old, and failed the new run on it)."""
    import pwd
    user = pwd.getpwuid(os.getuid()).pw_name
    commands(qstat=(0, PBS_FULL.replace("{user}", user), ""))
    assert control("pbs").find(run_id) == found


def test_the_pbs_job_name_carries_the_run_id():
    from modak_lib.models import JobOptions
    from modak_lib.schedulers.base import Resources

    res = Resources(nodes=1, tasks_per_node=1, cpus_per_task=2, gpus_per_node=0,
                    walltime_s=600, memory_gb=None, partition=None, stdout="o", stderr=None)
    pbs = SCHEDULERS["pbs"]
    assert "#PBS -N train-r1a2b3c4d5e6" in pbs.directives(JobOptions(job_name="train"), res,
                                                          run_id="r1a2b3c4d5e6")
    assert "#PBS -N train" in pbs.directives(JobOptions(job_name="train"), res)
    # (Slurm keeps the user's name: its comment carries the run id)
    assert "#SBATCH --job-name=train" in SCHEDULERS["slurm"].directives(
        JobOptions(job_name="train"), res, run_id="r1a2b3c4d5e6")


def test_a_job_is_found_by_the_first_line_its_run_printed(tmp_path):
    """A run's record lost: the job that ran says which it is first in its output (a
    prolog's lines before it), for its own run only; a local run's PID file says it."""
    out = tmp_path / "job.out"
    start = {"modak": "job-start", "run_id": "r1", "job_id": "42.server"}
    out.write_text("prolog: node ready\n" + json.dumps(start) + "\ntraining...\n")
    assert jobctl.started_job(str(out), "r1") == "42.server"
    assert jobctl.started_job(str(out), "r10") is None  # (another run's job)
    assert jobctl.started_job(str(tmp_path / "none.out"), "r1") is None
    # the first line only: what the application prints later cannot name another job
    out.write_text(json.dumps(dict(start, job_id="")) + "\n" + json.dumps(start) + "\n")
    assert jobctl.started_job(str(out), "r1") is None
    out.write_text(json.dumps(dict(start, run_id="r10")) + "\n" + json.dumps(start) + "\n")
    assert jobctl.started_job(str(out), "r1") is None
    assert jobctl.job_left(control("pbs"), str(tmp_path), str(out), "r1") is None
    out.write_text(json.dumps(start) + "\n")
    assert jobctl.job_left(control("pbs"), str(tmp_path), str(out), "r1") == "42.server"
    local = jobctl.Local()
    assert jobctl.job_left(local, str(tmp_path), str(out), "r1") is None
    (tmp_path / local.PID).write_text("4242")
    assert jobctl.job_left(local, str(tmp_path), str(out), "r1") == "local-4242"


def test_job_control_without_data_is_an_error():
    with pytest.raises(jobctl.JobError, match="job_control"):
        jobctl.scheduler("slurm")


# ---------------------------------------------------------------------------
# the same contract on what the local front-end really printed (scripts/record-jobctl):
# Slurm 22.05 and its PBS wrappers, for jobs that really ended each way they can end here
RECORDED = sorted((ROOT / "tests/data/jobctl/slurm-22.05").glob("*/truth.json"))


def test_recordings_cover_every_end_this_front_end_can_produce():
    cases = {p.parent.name for p in RECORDED}
    for via in ("slurm", "pbs"):
        for end in ("completed", "failed", "timeout", "cancelled", "cancelled-pending",
                    "running", "pending"):
            assert f"{via}-{end}" in cases, f"no recording of {via}-{end}"


@pytest.mark.parametrize("truth", RECORDED, ids=[p.parent.name for p in RECORDED])
def test_recorded_answers_give_the_real_state(truth, commands, tmp_path):
    case = truth.parent
    real = json.loads(truth.read_text())
    answers = {}
    for recorded in case.glob("*.json"):
        if recorded.name != "truth.json":
            a = json.loads(recorded.read_text())
            answers[a["argv"][0]] = (a["rc"], a["out"], a["err"])
    commands(**answers)
    output = tmp_path / "job.out"
    output.write_text((case / "output").read_text())
    job_id = json.loads((case / "qstat.json").read_text())["argv"][-1]
    sched = control(real["via"])
    status = sched.status(str(tmp_path), job_id if real["via"] == "pbs" else job_id.split(".")[0],
                          str(output))
    assert status.state == real["state"], (status.as_dict(), real)
    if real["exit_code"] is not None:
        assert status.exit_code == real["exit_code"], (status.as_dict(), real)


def test_the_wait_asks_a_young_job_soon_and_prints_a_line_per_poll_or_change(monkeypatch):
    """The controller's wait (modak_job's action) asks for a job's status half a second
    after submission, then after a quarter of the time waited, at most every ``poll``
    seconds: a search's trial of 3 s was seen ended 5.5 s after submission at a fixed 5 s.
    It prints a line for people every ``poll`` seconds and when the state changes, not at
    each of the early queries; a query that fails waits the whole ``poll`` before the next."""
    from unittest import mock

    from ansible_collections.modak.modak.plugins.action import modak_job as action

    now = [1000.0]
    sleeps, lines = [], []
    monkeypatch.setattr(action.time, "time", lambda: now[0])
    monkeypatch.setattr(action.time, "sleep",
                        lambda s: (sleeps.append(round(s, 3)), now.__setitem__(0, now[0] + s)))
    monkeypatch.setattr(action, "say", lines.append)
    # the job runs till 3.2 s, goes COMPLETING, ends at 40 s; the first query after 9 s
    # fails
    def query(args, task_vars):
        waited = now[0] - 1000.0
        if args["state"] == "submitted":
            return dict(changed=True, submitted=True, job_id="7", state="PENDING")
        if waited > 9 and not getattr(query, "failed", False):
            query.failed = True
            return dict(unreachable=True, msg="connection reset")
        state = ("RUNNING" if waited < 3.2 else "COMPLETING" if waited < 40
                 else "COMPLETED")
        return dict(job_id="7", state=state, terminal=state == "COMPLETED")

    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task = mock.MagicMock(args=dict(
        workdir="w", script="job.sh", scheduler="local", control={"kind": "local"},
        run_id="r1", stdout="out", state="ended", poll=5, retries=3, timeout=600),
        async_val=0, check_mode=False, diff=False)
    plugin._play_context = mock.MagicMock(check_mode=False)
    plugin._connection = mock.MagicMock()
    plugin._query = query
    monkeypatch.setattr(action.PollingAction, "run", lambda self, tmp, task_vars: {})
    monkeypatch.setattr(action, "backend_data", lambda name, args, *keys: args)
    monkeypatch.setattr(action, "warn", lambda text: lines.append("WARNING " + text))
    result = plugin.run(task_vars={"inventory_hostname": "fe"})

    assert result["state"] == "COMPLETED" and not result.get("failed")
    assert sleeps[:3] == [0.5, 0.5, 0.5]  # (a quarter of under 2 s is less than half of one)
    assert max(sleeps) == 5 and sleeps[-1] == 5
    # RUNNING ended at 3.2 s: seen within a second (a fixed 5 s saw it at 5 s)
    times = list(itertools.accumulate(sleeps))  # (when each query after a sleep was made)
    ends = [t for t in times if t >= 3.2]
    assert ends[0] - 3.2 < 1.0
    # the query that failed waited the whole poll before the next
    failed_at = next(i for i, line in enumerate(lines) if line.startswith("WARNING"))
    assert "retrying in 5 s" in lines[failed_at]
    after = next(i for i, t in enumerate(times) if t > 9)
    assert sleeps[after] < 5 and sleeps[after + 1] == 5
    # lines: at submission, at each change of state, and no closer than poll otherwise
    said = [line for line in lines if not line.startswith("WARNING")]
    assert [line.split()[3].rstrip(",") for line in said][:3] == ["PENDING", "RUNNING",
                                                                   "COMPLETING"]
    assert said[-1].startswith("[fe] job 7 COMPLETED")
    assert len(said) < len(sleeps) / 2 + 2
    completing = [line for line in said if " COMPLETING," in line]
    assert 6 <= len(completing) <= 9  # (37 s at one line per 5 s)
