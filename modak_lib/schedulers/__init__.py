"""Schedulers by name: adding one is adding a file and a line here."""
from __future__ import annotations

from .base import Resources, SchedulerSpec
from .local import Local
from .lsf import Lsf
from .pbs import Pbs
from .slurm import Slurm

SCHEDULERS: dict[str, SchedulerSpec] = {s.name: s for s in (Slurm(), Pbs(), Lsf(), Local())}
_NAMES = {alias: s.name for s in SCHEDULERS.values() for alias in (s.name, *s.aliases)}


def scheduler_name(name: str) -> str:
    """The registered name for ``name`` (a backend's own name or one of its aliases)."""
    try:
        return _NAMES[name]
    except (KeyError, TypeError):
        known = ", ".join(f"{s.name} ({', '.join(s.aliases)})" if s.aliases else s.name
                          for s in SCHEDULERS.values())
        raise ValueError(f"unknown scheduler {name!r}: one of {known}") from None


__all__ = ["SCHEDULERS", "Resources", "SchedulerSpec", "scheduler_name"]
