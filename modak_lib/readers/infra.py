"""Infrastructure descriptions (``--infra FILE``): the system, kept apart from the workload.

The file holds the fields of :class:`modak_lib.models.Target`.  For a local
target the hardware may be written as ``host``: ``microarchitecture: host``,
``cores_per_node: host`` and ``cpu_features: host`` are read from the machine
that runs MODAK (with archspec).
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..models import Target
from .common import load_document, validate

# CPU flags that change which configuration is fastest (bf16 needs native support)
RELEVANT_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile",
                     "sve", "sve2", "bf16")


def host_facts() -> dict[str, Any]:
    import archspec.cpu  # imported here: costs ~50 ms, only for 'host'

    host = archspec.cpu.host()
    # archspec reports the features of the microarchitecture it matched (x86_64_v4 has
    # no bf16); the kernel's flags say what this CPU really has
    flags = set(host.features)
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {
        "microarchitecture": host.name,
        "cpu_arch": {"arm64": "aarch64"}.get(platform.machine(), platform.machine()),
        "cores_per_node": len(os.sched_getaffinity(0)),
        "cpu_features": sorted(f for f in flags if f in RELEVANT_FEATURES),
    }


def resolve_host_values(data: dict[str, Any]) -> dict[str, Any]:
    wanted = [k for k in ("microarchitecture", "cores_per_node", "cpu_features")
              if data.get(k) == "host"]
    if not wanted:
        return data
    facts = host_facts()
    data = dict(data)
    for key in wanted:
        data[key] = facts[key]
    if "microarchitecture" in wanted and "cpu_arch" not in data:
        data["cpu_arch"] = facts["cpu_arch"]
    return data


def merge_target(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Target fields: ``overrides`` win, and a ``frontend`` mapping is merged key by key
    (a blueprint that names only the port keeps the infrastructure's host and user)."""
    merged = {**base, **overrides}
    if isinstance(base.get("frontend"), dict) and isinstance(overrides.get("frontend"), dict):
        merged["frontend"] = {**base["frontend"], **overrides["frontend"]}
    return merged


def read_infra(path: str | Path) -> Target:
    path = Path(path)
    data = load_document(path)
    if not isinstance(data, dict):
        raise InputError("an infrastructure file must be a mapping of target fields", str(path))
    return validate(Target, resolve_host_values(data), str(path))
