"""PBS/Torque: ``#PBS`` directives, submitted with ``qsub``.

The dialect is Torque's (``-l nodes=N:ppn=M:gpus=G``), which is what Torque and
the ``slurm-wlm-torque`` wrappers read.  Those wrappers ignore ``#PBS -o/-e``, so
the output files are also passed to ``qsub`` on its command line, which every
PBS honours.
"""
from __future__ import annotations

from typing import Any

from ..models import JobOptions
from ..validate import pbs_walltime
from .base import Resources, SchedulerSpec
from .slurm import SLURMSTEPD_MARKS

_MAIL = {"begin": "b", "end": "e", "fail": "a"}


class Pbs(SchedulerSpec):
    name = "pbs"
    aliases = ("torque",)
    directive_prefix = "#PBS"
    # Torque starts the job in the home directory; Slurm's wrappers set SLURM_* only
    job_id_vars = ("PBS_JOBID", "SLURM_JOB_ID")
    submit_dir_vars = ("PBS_O_WORKDIR", "SLURM_SUBMIT_DIR")

    def job_problems(self, job: JobOptions) -> list[tuple[str, str]]:
        # Torque's qsub refuses a -N whose first character is not alphabetic (its manual)
        if not job.job_name[:1].isalpha():
            return [("job.job_name", f"{job.job_name!r}: a PBS job's name starts with a "
                     "letter (qsub refuses it)")]
        return []

    def directives(self, job: JobOptions, res: Resources, run_id: str = "") -> list[str]:
        nodes = f"nodes={res.nodes}:ppn={res.tasks_per_node * res.cpus_per_task}"
        if res.gpus_per_node:
            nodes += f":gpus={res.gpus_per_node}"
        if job.request_specific_nodes:
            nodes += f":{job.request_specific_nodes}"
        # the job's name ends with its run id: `qstat -f` lists no comment of the job's,
        # and a run whose record was lost finds its queued job by that name (``find``)
        d = [f"-N {job.job_name}-{run_id}" if run_id else f"-N {job.job_name}", f"-l {nodes}"]
        if res.walltime_s:
            d.append(f"-l walltime={pbs_walltime(res.walltime_s)}")
        if res.memory_gb:
            d.append(f"-l mem={int(res.memory_gb * 1024)}mb")
        if res.partition:
            d.append(f"-q {res.partition}")
        if job.account:
            d.append(f"-A {job.account}")
        d.append(f"-o {res.stdout}")
        if res.stderr:
            d.append(f"-e {res.stderr}")
        else:
            d.append("-j oe")
        if job.mail_events:
            d.append("-m " + "".join(_MAIL[e] for e in job.mail_events))
            d.append(f"-M {job.email_address}")
        if job.copy_environment:
            d.append("-V")
        if job.copy_environment_variable:
            d.append("-v " + ",".join(job.copy_environment_variable))
        return [f"{self.directive_prefix} {x}" for x in d]

    def control(self) -> dict[str, Any]:
        # Final states come from `qstat -f` (job_state, exit_status); where those are gone
        # or ambiguous (the wrappers report C for every end, without an exit status), the
        # scheduler's marks in the output and the job's own last line decide.
        return {
            "submit": {"argv": ["qsub", "-o", "{stdout}", "{script}"],
                       "stderr": ["-e", "{stderr}"], "no_stderr": ["-j", "oe"],
                       "job_id": r"(?m)^\s*(\d+(\.[\w.-]+)?)\s*\Z"},
            "queries": [
                {"argv": ["qstat", "-f", "{job_id}"], "records": "Job Id:",
                 "fields": {"state": "job_state", "exit": "exit_status", "host": "exec_host",
                            "reason": "comment"}},
            ],
            "states": {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING",
                       "S": "SUSPENDED", "R": "RUNNING", "E": "RUNNING", "C": "ENDED",
                       "F": "ENDED"},
            # Torque's JOB_EXEC_* codes: -1/-2 the start failed, -4..-6 the node's MOM
            # aborted it, -10 memory, -11 wall time, -12 CPU time; 256+N: killed by signal
            # N (qdel sends SIGTERM).  PBS has no preempted end: a preempted job is
            # suspended (S) or queued again (Q).
            "exit": {"format": "int", "signal_from": 256, "signalled": "CANCELLED",
                     "codes": {"-1": "BOOT_FAIL", "-2": "BOOT_FAIL", "-4": "NODE_FAIL",
                               "-5": "NODE_FAIL", "-6": "NODE_FAIL", "-10": "OUT_OF_MEMORY",
                               "-11": "TIMEOUT", "-12": "TIMEOUT"}},
            "marks": SLURMSTEPD_MARKS + [["job killed: walltime", "TIMEOUT"],
                                         ["job killed: mem", "OUT_OF_MEMORY"]],
            # deleted while queued: C without an exit status or a host, and no output
            "never_started": {"state": "C", "without": ["exit", "host"]},
            "cancel": ["qdel", "{job_id}"],
            # PBS Professional's and OpenPBS's scheduler comments a job it can never run
            # as asked ("Can Never Run: Insufficient amount of resource: ncpus (R: 64 A: 32
            # T: 32)"); one that waits its turn says "Not Running: ..."
            "stuck": {"reasons": ["Can Never Run*"],
                      "says": "the server cannot give what it asks for"},
            # every job the server lists, in full, of those not finished: a finished one
            # (C, F) that the server still lists is an earlier deploy's of the same script
            # (the run id is the script's hash), in another run directory; a run's own
            # finished job is found by its first line in its output, in its directory
            "find": {"argv": ["qstat", "-f"], "records": "Job Id:",
                     "fields": {"name": "Job_Name", "owner": "Job_Owner",
                                "state": "job_state"},
                     "match": {"name": "*-{run_id}", "owner": "{user}@*", "state": "[!CF]"}},
        }
