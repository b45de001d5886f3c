"""The target's measured figures (``modak probe``), cached per target and image.

The probe itself is ``modak_runtime.probe`` (it runs where the job runs: inside the image,
with the job's cores and CPU-feature caps).  Here: running it on this host, and the cache
the planner reads when an infrastructure file gives no figures.  Cache:
``$MODAK_PROBES`` or ``~/.local/share/modak/probes.json``, one record per target key.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import ModakError
from ..files import write_atomic
from ..paths import data_file
from .features import TARGET_FIGURES


class ProbeError(ModakError):
    pass


def cache_path() -> Path:
    return data_file("MODAK_PROBES", "probes.json")


def target_key(target: Any, image: str = "host") -> str:
    """What a probe's figures belong to: the target (its name, microarchitecture and
    cores) and the image it ran in."""
    return f"{target.name}|{target.microarchitecture}|{target.cores_per_node}|{image}"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached(target: Any, image: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The latest probe of ``target`` (in ``image``, or in any image), or None."""
    data = _load(cache_path())
    if image is not None:
        return data.get(target_key(target, image))
    prefix = target_key(target, "")
    found = [v for k, v in data.items() if k.startswith(prefix)]
    if not found:  # the same hardware under another target name (local, localhost)
        same = f"|{target.microarchitecture}|{target.cores_per_node}|"
        found = [v for k, v in data.items() if same in k]
    return max(found, key=lambda v: v.get("probed_at", "")) if found else None


def target_figures(target: Any) -> dict[str, Optional[float]]:
    """The target's figures: its infrastructure file's (``peak_gflops``,
    ``peak_gflops_bf16``, ``memory_bandwidth_gbs``), else its cached probe's; the time of
    one operation (``op_us``, a GPU's) always the probe's."""
    given = {"gflops_fp32": target.peak_gflops, "gflops_bf16": target.peak_gflops_bf16,
             "bandwidth_gbs": target.memory_bandwidth_gbs, "op_us": None}
    rec = cached(target) or {}
    if given["gflops_fp32"] and given["bandwidth_gbs"]:  # the file's rates, not mixed with a
        rec = {"op_us": rec.get("op_us")}               # probe's (its operation time kept)
    return {k: given[k] or (float(rec[k]) if rec.get(k) else None) for k in TARGET_FIGURES}


def remember(target: Any, record: dict[str, Any], image: str = "host") -> Path:
    path = cache_path()
    data = _load(path)
    data[target_key(target, image)] = record
    return write_atomic(path.parent, path.name, json.dumps(data, indent=1, sort_keys=True) + "\n")


def remember_job_probe(target: Any, output: str, image: str) -> Optional[dict[str, Any]]:
    """The probe a job ran first (its JSON line in the job's output), remembered for its
    target and image; None when the output has none, or it measured nothing."""
    from modak_runtime import probe

    rec = probe.parse(output)
    if not rec or rec.get("error") or not rec.get("gflops_fp32"):
        return None
    remember(target, _stamped(rec), image)
    return {k: rec.get(k) for k in TARGET_FIGURES}


def run_here(seconds: float = 8.0, env: Optional[dict[str, str]] = None,
             cpus: Optional[Sequence[int]] = None, python: str = sys.executable
             ) -> dict[str, Any]:
    """Run the probe on this host (``cpus``: the CPU affinity it gets; ``env``: variables on
    top of this process's, such as ISA caps)."""
    from modak_runtime import probe

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, set(cpus))

    proc = subprocess.run([python, "-m", "modak_runtime.probe", "--seconds", str(seconds)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          preexec_fn=pin if cpus else None, timeout=seconds * 6 + 60)
    rec = probe.parse(proc.stdout)
    if proc.returncode != 0 or rec is None:
        raise ProbeError(f"the probe failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    if rec.get("error"):
        raise ProbeError(f"the probe measured nothing: {rec['error']}")
    return _stamped(rec)


def _stamped(rec: dict[str, Any]) -> dict[str, Any]:
    """A probe record with the time it was taken (the cache keeps the latest per target)."""
    from datetime import datetime, timezone

    rec["probed_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return rec
