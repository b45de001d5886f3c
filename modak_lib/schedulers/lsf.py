"""IBM Spectrum LSF: ``#BSUB`` directives, submitted with ``bsub < job.sh``.

LSF reads a script's ``#BSUB`` lines only when the script comes on ``bsub``'s standard
input, so the submission feeds it there.  LSF is not installable on MODAK's development
machines: its job scripts are golden-tested and its job control is contract-tested on
output in the formats LSF 10.1 documents, not executed against a real LSF.
"""
from __future__ import annotations

from typing import Any

from ..models import JobOptions, Launcher
from .base import Resources, SchedulerSpec

_MAIL = {"begin": "-B", "end": "-N", "fail": "-N"}  # LSF mails at the end, failed or not


def lsf_walltime(seconds: int) -> str:
    """LSF's ``-W [hours:]minutes``, rounded up to the minute."""
    minutes = -(-seconds // 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


class Lsf(SchedulerSpec):
    name = "lsf"
    directive_prefix = "#BSUB"
    launcher = Launcher.mpirun
    job_id_vars = ("LSB_JOBID",)  # LSF starts the job in the directory it was submitted from

    def directives(self, job: JobOptions, res: Resources, run_id: str = "") -> list[str]:
        d = [f"-J {job.job_name}", f"-n {res.nodes * res.tasks_per_node}",
             f'-R "span[ptile={res.tasks_per_node}]"']
        if res.cpus_per_task > 1:
            d.append(f'-R "affinity[core({res.cpus_per_task})]"')
        if res.gpus_per_node:
            d.append(f'-gpu "num={res.gpus_per_node}"')
        if res.walltime_s:
            d.append(f"-W {lsf_walltime(res.walltime_s)}")
        if res.memory_gb:
            d.append(f"-M {int(res.memory_gb * 1024)}MB")
        if res.partition:
            d.append(f"-q {res.partition}")
        if job.account:
            d.append(f"-P {job.account}")
        if job.request_specific_nodes:
            d.append(f'-R "select[{job.request_specific_nodes}]"')
        d.append(f"-oo {res.stdout}")
        if res.stderr:
            d.append(f"-eo {res.stderr}")
        if job.mail_events:
            d += sorted({_MAIL[e] for e in job.mail_events})
            d.append(f"-u {job.email_address}")
        if job.copy_environment or job.copy_environment_variable:
            d.append("-env all")
        return [f"{self.directive_prefix} {x}" for x in d]

    def control(self) -> dict[str, Any]:
        # -oo/-eo overwrite (a resubmitted run starts a fresh output); the run id rides in
        # the job's description, so that a job whose record was lost is found again
        fmt = "-o", "stat exit_code delimiter='|'"
        return {
            "submit": {"argv": ["bsub", "-oo", "{stdout}", "-Jd", "modak-run={run_id}"],
                       "stderr": ["-eo", "{stderr}"], "stdin": "{script}",
                       "job_id": r"Job <(\d+)> is submitted"},
            "queries": [
                {"argv": ["bjobs", "-noheader", *fmt, "{job_id}"], "split": "|",
                 "fields": ["state", "exit"]},
            ],
            "states": {"PEND": "PENDING", "WAIT": "PENDING", "PROV": "PENDING",
                       "RUN": "RUNNING", "PSUSP": "SUSPENDED", "USUSP": "SUSPENDED",
                       "SSUSP": "SUSPENDED", "DONE": "COMPLETED", "EXIT": "ENDED",
                       "ZOMBI": "ENDED", "UNKWN": "UNKNOWN"},
            "exit": {"format": "int"},
            # the job report LSF appends to the output (-oo) names why it ended a job
            "marks": [["TERM_RUNLIMIT", "TIMEOUT"], ["TERM_OWNER", "CANCELLED"],
                      ["TERM_FORCE_OWNER", "CANCELLED"], ["TERM_ADMIN", "CANCELLED"],
                      ["TERM_FORCE_ADMIN", "CANCELLED"], ["TERM_MEMLIMIT", "OUT_OF_MEMORY"],
                      ["TERM_PREEMPT", "PREEMPTED"], ["TERM_HOST", "NODE_FAIL"],
                      ["TERM_LOAD", "NODE_FAIL"]],
            "cancel": ["bkill", "{job_id}"],
            "find": {"argv": ["bjobs", "-noheader", "-o", "jobid job_description delimiter='|'"],
                     "split": "|", "fields": ["job_id", "comment"],
                     "match": {"comment": "modak-run={run_id}"}},
            "silent": r"LSF is down|batch system daemon not responding|LIM is down",
        }
