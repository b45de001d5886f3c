"""Local: no scheduler, the job script runs with bash on the front-end itself.

The front-end runs it in its own session in the background and keeps its state in
files of the work directory (``modak_jobctl.Local``): there is nothing to describe.
"""
from __future__ import annotations

from typing import Any

from ..models import JobOptions
from .base import Resources, SchedulerSpec


class Local(SchedulerSpec):
    name = "local"
    aliases = ("none",)

    def directives(self, job: JobOptions, res: Resources, run_id: str = "") -> list[str]:
        return []

    def control(self) -> dict[str, Any]:
        return {"local": True}
