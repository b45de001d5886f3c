"""Schedulers by name: adding one is adding a file and a line here."""
from __future__ import annotations

from .base import Resources, SchedulerSpec
from .local import Local
from .pbs import Pbs
from .slurm import Slurm

SCHEDULERS: dict[str, SchedulerSpec] = {s.name: s for s in (Slurm(), Pbs(), Local())}

__all__ = ["SCHEDULERS", "Resources", "SchedulerSpec"]
