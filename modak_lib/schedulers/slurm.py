"""Slurm: ``#SBATCH`` directives, submitted with ``sbatch --parsable``."""
from __future__ import annotations

from ..models import JobOptions, Launcher
from ..validate import slurm_walltime
from .base import Resources, SchedulerSpec

_MAIL = {"begin": "BEGIN", "end": "END", "fail": "FAIL"}


class Slurm(SchedulerSpec):
    name = "slurm"
    directive_prefix = "#SBATCH"
    launcher = Launcher.srun
    launch_single = True

    def directives(self, job: JobOptions, res: Resources) -> list[str]:
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

    def submit_command(self, script: str, res: Resources) -> list[str]:
        argv = ["sbatch", "--parsable", f"--output={res.stdout}"]
        return argv + ([f"--error={res.stderr}"] if res.stderr else []) + [script]
