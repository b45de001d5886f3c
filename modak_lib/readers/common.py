"""Helpers shared by the readers: load files, turn pydantic errors into InputError."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import InputError, shorten

M = TypeVar("M", bound=BaseModel)


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


SHOWN_KEYS = 16  # an unknown key's error lists the known ones where there are no more


def close_to(name: str, known: "Any") -> str:
    """What to add to "unknown key" for ``name`` among the ``known`` keys: the one it is
    likely a slip of (``partition`` for ``partitions``), else the known ones, where few."""
    import difflib

    known = sorted({k for k in known if isinstance(k, str)})
    if not known or not isinstance(name, str):
        return ""
    near = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6) or [
        k for k in known if name.lower().replace("-", "_") == k.lower()]
    if near:
        return f" (did you mean {near[0]!r}?)"
    if len(known) <= SHOWN_KEYS:
        return f" (known: {', '.join(known)})"
    return ""


def _models_in(annotation: Any) -> set[type[BaseModel]]:
    """The pydantic models a field's type holds (``Optional[M]``, ``tuple[M, ...]``...)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    found: set[type[BaseModel]] = set()
    for arg in typing.get_args(annotation):
        found |= _models_in(arg)
    return found


def keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> set[str]:
    """The keys the mapping at ``loc`` (an error's location, without its last part) may
    have, in ``model``: its fields' names and aliases; a part that names no field (a list's
    index, a mapping's own key) stays at the models it is in."""
    models = {model}
    for part in loc:
        inner: set[type[BaseModel]] = set()
        for m in models:
            for name, f in m.model_fields.items():
                if part in (name, f.alias):
                    inner |= _models_in(f.annotation)
        if inner:
            models = inner
        elif isinstance(part, str) and not isinstance(part, bool) and any(
                part in m.model_fields for m in models):
            return set()  # a field that holds no model: not a mapping of known keys
    return {k for m in models for name, f in m.model_fields.items() for k in (name, f.alias)
            if k}


def _message(err: dict[str, Any], model: "type[BaseModel] | None" = None) -> str:
    if err["type"] == "extra_forbidden":
        if model is not None and err["loc"]:
            return "unknown key" + close_to(err["loc"][-1], keys_at(model, err["loc"][:-1]))
        return "unknown key"
    if err["type"] == "missing":
        return "required field is missing"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def problems_of(exc: ValidationError, prefix: str = "",
                model: "type[BaseModel] | None" = None) -> list[tuple[str, str]]:
    """(field path, message) of each error; with the ``model`` validated, an unknown key's
    message names the known key it is close to (:func:`close_to`)."""
    problems = []
    for err in exc.errors():
        # drop pydantic's internal union/function-wrapper tags from the path
        loc = tuple(p for p in err["loc"]
                    if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
        path = field_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        problems.append((path, _message(err, model)))
    return problems


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate ``data`` as ``model``; errors name ``source`` and the field path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(problems_of(exc, prefix, model), source) from None


# Limits of every input document (blueprints, inputs, infrastructure, DSL, catalogue): a
# file from someone else cannot make the loader hang or exhaust memory.
MAX_BYTES = 4 * 1024 * 1024      # a blueprint is kilobytes
MAX_DEPTH = 64                   # nesting of mappings and lists
MAX_NODES = 200_000              # values after aliases and merge keys are expanded
MAX_ALIASES = 1000               # *alias references in one YAML document
MAX_NUMBER = 10 ** 15            # any number's magnitude (counts, sizes, seconds)


class _LimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts alias references while composing."""

    def compose_node(self, parent, index):  # noqa: D102 (PyYAML's hook)
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen = getattr(self, "aliases_seen", 0) + 1
            if self.aliases_seen > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise InputError(f"more than {MAX_ALIASES} YAML aliases (line {mark.line + 1}): "
                                 "refused (an alias bomb?)")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: D102 (PyYAML's hook)
        # a key written twice in one mapping: PyYAML keeps the last, unseen by a reader of
        # the first (``script: train.py`` ... ``script: other.py`` further down); a key a
        # merge (<<) brings in and the mapping then sets is YAML's override, not a repeat
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                ident = (key.tag, key.value)
                if ident in seen:
                    raise InputError(f"the key {key.value[:80]!r} is written twice in one "
                                     f"mapping (line {key.start_mark.line + 1}): refused (the "
                                     "last would win, unseen by a reader of the first)")
                seen.add(ident)
        return super().construct_mapping(node, deep)

    def flatten_mapping(self, node):  # noqa: D102 (PyYAML's hook for merge keys <<)
        super().flatten_mapping(node)
        self.merged_pairs = getattr(self, "merged_pairs", 0) + len(node.value)
        if self.merged_pairs > MAX_NODES:
            raise InputError(f"more than {MAX_NODES} keys once YAML merge keys (<<) are "
                             "expanded: refused (a merge-key bomb?)")


def check_limits(data: Any, where: str = "") -> None:
    """Refuse documents too deep or too large once aliases are expanded, non-finite or huge
    numbers; the error names the field path."""
    count = 0
    stack: list[tuple[Any, str, int]] = [(data, where, 0)]
    while stack:
        value, path, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise InputError([(where, f"more than {MAX_NODES} values once YAML aliases and "
                               "merge keys are expanded: refused")])
        if depth > MAX_DEPTH:
            raise InputError([(path, f"nested more than {MAX_DEPTH} levels deep: refused")])
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise InputError([(path, f"a key of type {type(key).__name__}: keys must "
                                       "be plain strings")])
                stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                stack.append((item, f"{path}[{i}]", depth + 1))
        elif isinstance(value, float) and not math.isfinite(value):
            raise InputError([(path, f"{value} is not a number MODAK accepts")])
        elif isinstance(value, (int, float)) and not isinstance(value, bool) \
                and abs(value) > MAX_NUMBER:
            raise InputError([(path, f"number too large (the limit is {MAX_NUMBER:.0e})")])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number MODAK accepts")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused where a key is written twice (the last would win unseen)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"the key {key[:80]!r} is written twice in one JSON object: "
                             "refused (the last would win, unseen by a reader of the first)")
        out[key] = value
    return out


def load_document(path: Path) -> Any:
    """Read a JSON or YAML file within MODAK's limits (size, depth, aliases, numbers);
    every problem becomes an InputError naming the file (and line or field)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"file is {size / 2**20:.1f} MiB; MODAK reads at most "
                             f"{MAX_BYTES // 2**20} MiB", str(path))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", str(path)) from None
    try:
        if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            try:
                data = json.loads(text, parse_constant=_reject_constant,
                                  object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as exc:
                raise InputError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                                 f"{exc.msg}", str(path)) from None
        else:
            try:
                data = yaml.load(text, Loader=_LimitedLoader)  # noqa: S506 (a SafeLoader)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                problem = getattr(exc, "problem", None) or str(exc)
                raise InputError(f"invalid YAML{where}: {problem}", str(path)) from None
        check_limits(data)
        return data
    except InputError as exc:
        raise exc.with_source(str(path)) from None
    except RecursionError:
        raise InputError(f"nested too deeply (MODAK's limit is {MAX_DEPTH} levels)",
                         str(path)) from None
    except (ValueError, TypeError, OverflowError) as exc:  # int digits limit, constants
        raise InputError(f"cannot read a value: {shorten(str(exc))}", str(path)) from None
