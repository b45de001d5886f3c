"""Slurm: ``#SBATCH`` directives, submitted with ``sbatch --parsable``."""
from __future__ import annotations

from typing import Any

from ..models import JobOptions, Launcher
from ..validate import slurm_walltime
from .base import Resources, SchedulerSpec

_MAIL = {"begin": "BEGIN", "end": "END", "fail": "FAIL"}

# what slurmstepd writes into a job's output when it ends the job (also under the PBS
# wrappers, which run on Slurm)
SLURMSTEPD_MARKS = [["DUE TO TIME LIMIT", "TIMEOUT"], ["CANCELLED AT", "CANCELLED"],
                    ["oom-kill", "OUT_OF_MEMORY"], ["Out Of Memory", "OUT_OF_MEMORY"]]


class Slurm(SchedulerSpec):
    name = "slurm"
    directive_prefix = "#SBATCH"
    launcher = Launcher.srun
    launch_single = True
    job_id_vars = ("SLURM_JOB_ID",)

    def directives(self, job: JobOptions, res: Resources, run_id: str = "") -> list[str]:
        d = [f"--job-name={job.job_name}", f"--nodes={res.nodes}",
             f"--ntasks-per-node={res.tasks_per_node}", f"--cpus-per-task={res.cpus_per_task}"]
        if res.walltime_s:
            d.append(f"--time={slurm_walltime(res.walltime_s)}")
        if res.partition:
            d.append(f"--partition={res.partition}")
        if job.account:
            d.append(f"--account={job.account}")
        if res.gpus_per_node:
            d.append(f"--gres=gpu:{res.gpus_per_node}")
        if res.memory_gb:
            d.append(f"--mem={int(res.memory_gb * 1024)}M")
        d.append(f"--output={res.stdout}")
        if res.stderr:
            d.append(f"--error={res.stderr}")
        if job.mail_events:
            d.append("--mail-type=" + ",".join(_MAIL[e] for e in job.mail_events))
            d.append(f"--mail-user={job.email_address}")
        if job.copy_environment or job.copy_environment_variable:
            # Slurm's --export=VAR alone would drop PATH and everything else; ALL is what
            # PBS's -V/-v ask for on top of its own minimal environment
            d.append("--export=ALL")
        if job.request_specific_nodes:
            d.append(f"--constraint={job.request_specific_nodes}")
        return [f"{self.directive_prefix} {x}" for x in d]

    def control(self) -> dict[str, Any]:
        # the output files on the command line win over the script's directives (the module
        # reads what it was told the job writes); the run id rides in the job's comment, so
        # that a job whose record was lost is found again
        return {
            "submit": {"argv": ["sbatch", "--parsable", "--output={stdout}",
                                "--comment=modak-run={run_id}", "{script}"],
                       "stderr": ["--error={stderr}"], "job_id": r"^\s*(\d+)(;\S*)?\s*$"},
            "queries": [
                {"argv": ["squeue", "-h", "-j", "{job_id}", "-o", "%T|%r"], "split": "|",
                 "fields": ["state", "reason"], "active_only": True},
                # sacct where accounting runs; its failure (no accounting) says nothing
                {"argv": ["sacct", "-n", "-P", "-X", "-j", "{job_id}", "-o", "State,ExitCode"],
                 "split": "|", "fields": ["state", "exit"], "quiet_failure": True},
                # else slurmctld's memory of the job (MinJobAge)
                {"argv": ["scontrol", "-o", "show", "job", "{job_id}"], "pairs": "words",
                 "fields": {"state": "JobState", "exit": "ExitCode", "reason": "Reason"}},
            ],
            "states": {**{s: s for s in ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED",
                                         "REQUEUED", "COMPLETED", "FAILED", "CANCELLED",
                                         "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                                         "BOOT_FAIL", "DEADLINE")},
                       "CONFIGURING": "PENDING", "REQUEUE_HOLD": "PENDING",
                       "REQUEUE_FED": "PENDING", "RESIZING": "RUNNING", "SIGNALING": "RUNNING",
                       "STAGE_OUT": "COMPLETING", "STOPPED": "SUSPENDED",
                       "SPECIAL_EXIT": "FAILED", "REVOKED": "CANCELLED"},
            # Slurm says COMPLETING while it cleans up (a container started as the job was
            # cancelled can take a minute); slurmstepd has already written why it ended it
            "marked": ["COMPLETING"],
            "exit": {"format": "code:signal"},
            "marks": SLURMSTEPD_MARKS,
            "cancel": ["scancel", "{job_id}"],
            # pending for these, a job never starts as it is (Slurm holds, rather than
            # refuses, a job beyond its partition's nodes unless EnforcePartLimits says so:
            # PartitionConfig or PartitionNodeLimit, which also stands for nodes named by
            # --nodelist that are down, and MODAK names none); an aggregate limit (AssocGrp*,
            # QOSGrp*, *MaxJobs*) or Resources passes in time
            "stuck": {"reasons": ["PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
                                  "BadConstraints",
                                  "InvalidAccount", "InvalidQOS", "AccountNotAllowed",
                                  "QOSNotAllowed", "AssocMax*PerJob*", "AssocMax*PerNode*",
                                  "QOSMax*PerJob*", "QOSMax*PerNode*"],
                      "says": "its partition, account or QOS cannot give what it asks for: "
                              "nodes, cores, memory, GPUs, time or features"},
            "find": {"argv": ["squeue", "-h", "-u", "{user}", "-o", "%i|%k"], "split": "|",
                     "fields": ["job_id", "comment"], "match": {"comment": "modak-run={run_id}"}},
        }
