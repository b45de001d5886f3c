"""Local: no scheduler, the job script runs with bash on the front-end itself."""
from __future__ import annotations

from ..models import JobOptions
from .base import Resources, SchedulerSpec


class Local(SchedulerSpec):
    name = "local"

    def directives(self, job: JobOptions, res: Resources) -> list[str]:
        return []

    def submit_command(self, script: str, res: Resources) -> list[str]:
        return ["bash", script]
