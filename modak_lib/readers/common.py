"""Helpers shared by the readers: load files, turn pydantic errors into InputError."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import InputError

M = TypeVar("M", bound=BaseModel)


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required field is missing"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def problems_of(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        # drop pydantic's internal union/function-wrapper tags from the path
        loc = tuple(p for p in err["loc"]
                    if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
        path = field_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        problems.append((path, _message(err)))
    return problems


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate ``data`` as ``model``; errors name ``source`` and the field path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(problems_of(exc, prefix), source) from None


def load_document(path: Path) -> Any:
    """Read a JSON or YAML file; syntax errors become InputError naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", str(path)) from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                             str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"invalid YAML{where}: {problem}", str(path)) from None
