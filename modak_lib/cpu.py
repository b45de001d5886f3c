"""Compiler flags for a target CPU, from archspec's microarchitecture data."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=64)
def target_flags(microarch: str, compiler: str = "gcc", version: str = "12.2.0") -> tuple[str, str]:
    """Return ``(flags, used_microarch)`` for building on ``compiler@version``.

    When that compiler cannot target ``microarch`` itself (zen4 needs a newer gcc
    than Debian 12's), the most specific ancestor it supports is used instead,
    and ``used_microarch`` says which.
    """
    import archspec.cpu

    targets = archspec.cpu.TARGETS
    if microarch not in targets:
        raise KeyError(microarch)
    chain = [targets[microarch]] + sorted(targets[microarch].ancestors,
                                          key=lambda t: -len(t.ancestors))
    for t in chain:
        try:
            flags = t.optimization_flags(compiler, version)
        except archspec.cpu.UnsupportedMicroarchitecture:
            continue
        if flags:
            return flags, t.name
    return "", chain[-1].name
