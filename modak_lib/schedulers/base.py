"""What every scheduler provides: directives for a job script and its submit command.

Job control (submit / status / cancel and reading their output) runs on the
front-end and lives in ``plugins/module_utils`` (standard library only).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

from ..models import JobOptions, Launcher


@dataclass(frozen=True)
class Resources:
    """What the planner asks the scheduler for."""
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    walltime_s: Optional[int]
    memory_gb: Optional[float]
    partition: Optional[str]
    stdout: str
    stderr: Optional[str]  # None: combined with stdout


class SchedulerSpec(ABC):
    name: str
    directive_prefix: str = ""
    # what starts a job's tasks (the planner's outer launcher): for several tasks, and also
    # for a single one where ``launch_single`` (Slurm: the step is then the scheduler's own)
    launcher: Launcher = Launcher.mpirun
    launch_single: bool = False

    @abstractmethod
    def directives(self, job: JobOptions, res: Resources) -> list[str]:
        """Header lines (already validated values: no quoting needed, none allowed)."""

    @abstractmethod
    def submit_command(self, script: str, res: Resources) -> list[str]:
        """argv that submits ``script`` from the job's work directory."""
