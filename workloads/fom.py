"""Figures of merit: one JSON line per measurement, with the configuration and host facts.

MODAK reads them back with ``modak_lib.results.parse_fom_lines``.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import sys
from typing import Any

FOM_KEY = "fom"
DATASET_SIZES = {"mnist-cnn": 60000, "resnet50": 1281167, "resnet18": 1281167}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "sve",
                  "bf16")


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return sorted(set(line.split(":", 1)[1].split()) & set(RELEVANT_FLAGS))
    except OSError:
        pass
    return []


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host_facts(framework_versions: dict[str, str]) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "hostname": platform.node(), "cpu_model": _cpu_model(), "cpu_features": _cpu_flags(),
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
        "frameworks": framework_versions,
    }
    try:
        import archspec.cpu
        facts["microarchitecture"] = archspec.cpu.host().name
    except Exception:  # archspec is optional inside images
        facts["microarchitecture"] = None
    return facts


def emit(record: dict[str, Any]) -> None:
    line = json.dumps({"modak": FOM_KEY, **record}, sort_keys=True)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
