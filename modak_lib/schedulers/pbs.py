"""PBS/Torque: ``#PBS`` directives, submitted with ``qsub``.

The dialect is Torque's (``-l nodes=N:ppn=M:gpus=G``), which is what Torque and
the ``slurm-wlm-torque`` wrappers read.  Those wrappers ignore ``#PBS -o/-e``, so
the output files are also passed to ``qsub`` on its command line, which every
PBS honours.
"""
from __future__ import annotations

from ..models import JobOptions
from ..validate import pbs_walltime
from .base import Resources, SchedulerSpec

_MAIL = {"begin": "b", "end": "e", "fail": "a"}


class Pbs(SchedulerSpec):
    name = "pbs"
    directive_prefix = "#PBS"

    def directives(self, job: JobOptions, res: Resources) -> list[str]:
        nodes = f"nodes={res.nodes}:ppn={res.tasks_per_node * res.cpus_per_task}"
        if res.gpus_per_node:
            nodes += f":gpus={res.gpus_per_node}"
        if job.request_specific_nodes:
            nodes += f":{job.request_specific_nodes}"
        d = [f"-N {job.job_name}", f"-l {nodes}"]
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

    def submit_command(self, script: str, res: Resources) -> list[str]:
        argv = ["qsub", "-o", res.stdout]
        argv += ["-e", res.stderr] if res.stderr else ["-j", "oe"]
        return argv + [script]
