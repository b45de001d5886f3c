"""Readers: a TOSCA blueprint or a MODAK-DSL document -> :class:`JobRequest`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..models import JobRequest, Target
from .common import load_document
from .dsl import read_dsl
from .infra import read_infra
from .tosca import read_tosca

__all__ = ["read_request", "read_infra", "read_dsl", "read_tosca", "detect_format"]


def detect_format(data: Any) -> str:
    if isinstance(data, dict) and "tosca_definitions_version" in data:
        return "tosca"
    if isinstance(data, dict) and "job" in data:
        return "modak-dsl"
    raise InputError("neither a TOSCA blueprint (no 'tosca_definitions_version') nor a MODAK "
                     "DSL document (no top-level 'job')")


def read_request(path: str | Path, infra: str | Path | None = None,
                 inputs: dict[str, Any] | None = None, node: str | None = None) -> JobRequest:
    """Read a blueprint or DSL document; ``infra`` gives the target's hardware as a base."""
    path = Path(path)
    base: Target | None = read_infra(infra) if infra else None
    data = load_document(path)
    try:
        kind = detect_format(data)
    except InputError as exc:
        raise exc.with_source(str(path)) from None
    if kind == "tosca":
        return read_tosca(path, inputs=inputs, base_target=base, node=node)
    if inputs:
        raise InputError("--inputs applies to TOSCA blueprints only", str(path))
    return read_dsl(data, str(path), base_target=base)
