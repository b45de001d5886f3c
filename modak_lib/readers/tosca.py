"""TOSCA blueprints (Simple Profile 1.3) using ``tosca/modak-types.yaml``.

tosca-parser checks the blueprint against the TOSCA types; MODAK then validates
the properties of the job and target nodes with its own models, so an error
names the node and the property path::

    blueprint.yaml: topology_template.node_templates.train.properties.job_options.job_name: ...
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import InputError
from ..models import JobRequest, Target
from .common import close_to, load_document, problems_of, validate
from .infra import merge_target, resolve_host_values

JOB_TYPE = "modak.nodes.AITrainingJob"
_REPORT_LINE = re.compile(r"^[A-Za-z]+(Error|Exception): ")
_UNKNOWN_FIELD = re.compile(r'^UnknownFieldError: Data value of type "(modak\.[\w.]+)" contains '
                            r'unknown field "([^"]+)"')
_UNKNOWN_PROPERTY = re.compile(r'^UnknownFieldError: "properties" of template "[^"]*" contains '
                               r'unknown field "([^"]+)"')
TARGET_TYPE = "modak.nodes.HPCTarget"


def _is_a(node: Any, type_name: str) -> bool:
    t = node.type_definition
    while t is not None:
        if t.type == type_name:
            return True
        t = t.parent_type
    return False


def _no_entry_point_cache() -> None:
    """tosca-parser finds its extensions through stevedore, which writes a cache of entry
    points under ~/.cache: a plan writes nothing but its --out, so turn that cache off."""
    try:
        from stevedore import _cache
        _cache._c._disable_caching = True
    except (ImportError, AttributeError):  # another stevedore: it may write its cache
        pass


def _parse(path: Path, inputs: dict[str, Any]) -> Any:
    # tosca-parser logs every problem before raising; the exception carries them all
    logging.getLogger("tosca").setLevel(logging.CRITICAL)
    _no_entry_point_cache()
    from toscaparser.common.exception import ExceptionCollector, TOSCAException
    from toscaparser.tosca_template import ToscaTemplate

    try:
        return ToscaTemplate(str(path), parsed_params=inputs or None)
    except TOSCAException as exc:
        # the report interleaves tracebacks with "SomeError: message" lines: keep those
        lines = []
        for ln in str(exc).splitlines():
            ln = ln.strip()
            if _REPORT_LINE.match(ln) and ln not in lines and "parent_req is None" not in ln:
                lines.append(ln)
        raise InputError([("", f"TOSCA: {ln}{_stale_types(ln)}") for ln in lines or [str(exc)]],
                         str(path)) from None
    except Exception as exc:  # tosca-parser's own bugs on malformed input
        raise InputError(f"TOSCA: blueprint could not be parsed ({type(exc).__name__}: {exc})",
                         str(path)) from None
    finally:
        ExceptionCollector.stop()


def _stale_types(line: str) -> str:
    """What to add to tosca-parser's line about a field a MODAK type does not have: where
    this MODAK's types have it, that the blueprint imports a copy of ``modak-types.yaml``
    from an older MODAK (``modak init`` writes one beside the blueprint); else the field
    it is close to (``close_to``), of that data type, or of MODAK's node types for a
    template's properties."""
    m = _UNKNOWN_FIELD.match(line)
    node = _UNKNOWN_PROPERTY.match(line)
    if not m and not node:
        return ""
    try:
        types = load_document(installed_types())
        if node:
            return close_to(node.group(1), [
                k for t in types["node_types"].values() if str(t.get("derived_from", ""))
                .startswith("tosca.nodes") for k in (t.get("properties") or {})])
        known = types["data_types"][m.group(1)]["properties"]
    except (InputError, KeyError, TypeError, AttributeError):
        return ""
    if m.group(2) not in known:
        return close_to(m.group(2), known)
    return (f" (this MODAK's {m.group(1)} has it: the blueprint imports an older MODAK's "
            "modak-types.yaml; copy this one's beside it: cp \"$(modak tosca-types)\" DIR)")


def installed_types() -> Path:
    """MODAK's TOSCA types as installed with the library (``modak tosca-types``)."""
    return Path(__file__).resolve().parent.parent / "data" / "tosca" / "modak-types.yaml"


def _import_file(entry: Any) -> Any:
    """The file an ``imports`` entry names: ``- FILE``, ``- {file: FILE, ...}`` or
    ``- NAME: FILE`` / ``- NAME: {file: FILE}``; any repository is refused by the caller."""
    if isinstance(entry, dict):
        if "file" in entry or "repository" in entry:
            return entry
        if len(entry) == 1:
            (value,) = entry.values()
            return value if isinstance(value, dict) else {"file": value}
        return entry
    return {"file": entry}


def check_imports(doc: Any, path: Path, root: Path | None = None,
                  seen: set[Path] | None = None) -> None:
    """Confine TOSCA imports before tosca-parser opens anything: each must be a relative
    file inside the blueprint's own directory (or its CSAR), or MODAK's installed types; no
    URL, no absolute path, no ``repositories``. Imported files are checked the same way."""
    root = root or path.resolve().parent
    seen = seen if seen is not None else set()
    source = str(path)
    if not isinstance(doc, dict):
        return
    if doc.get("repositories"):
        raise InputError([("repositories", "TOSCA repositories are not used by MODAK (they "
                           "make the parser fetch from the network): import local files")],
                         source)
    imports = doc.get("imports") or []
    if not isinstance(imports, list):
        raise InputError([("imports", "must be a list")], source)
    types = installed_types()
    for i, entry in enumerate(imports):
        where = f"imports[{i}]"
        spec = _import_file(entry)
        if not isinstance(spec, dict) or spec.get("repository"):
            raise InputError([(where, "a repository import is refused: import a local file")],
                             source)
        name = spec.get("file")
        if not isinstance(name, str) or not name:
            raise InputError([(where, "names no file")], source)
        if "://" in name or name.startswith(("file:", "~")) or ":" in name.split("/")[0]:
            raise InputError([(where, f"{name[:200]!r}: only a relative file beside the "
                               "blueprint, or MODAK's types, can be imported")], source)
        target = (path.parent / name).resolve()
        if target == types or (target.name == types.name and target.is_file()
                               and target.read_bytes() == types.read_bytes()):
            continue  # MODAK's own types, wherever they were named from
        if name.startswith("/"):
            raise InputError([(where, f"{name[:200]!r}: only a relative file beside the "
                               "blueprint, or MODAK's types, can be imported")], source)
        if root != target and root not in target.parents:
            raise InputError([(where, f"{name[:200]!r} is outside the blueprint's directory "
                               f"{root}: refused")], source)
        if target in seen:
            continue
        seen.add(target)
        check_imports(load_document(target), target, root, seen)


class _Inputs:
    def __init__(self, template: Any, given: dict[str, Any], source: str):
        declared = [i.name for i in template.inputs]
        unknown = [str(k) for k in given if k not in declared]
        if unknown:  # a misspelt input would otherwise leave its default in place unsaid
            more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
            names = ", ".join(declared[:20]) + (", ..." if len(declared) > 20 else "")
            raise InputError([("topology_template.inputs",
                               f"no input named {unknown[0][:100]!r}{more} (given as an input; "
                               f"the blueprint declares: {names or 'none'})")], source)
        self.values = {i.name: i.default for i in template.inputs if i.default is not None}
        self.values.update(given)
        self.source = source

    def resolve(self, value: Any, where: str) -> Any:
        if isinstance(value, dict):
            if len(value) == 1:
                (key, arg), = value.items()
                if key == "get_input":
                    name = arg[0] if isinstance(arg, list) and len(arg) == 1 else arg
                    if not isinstance(name, str):
                        raise InputError([(where, "get_input takes the name of one input")],
                                         self.source)
                    if name not in self.values:
                        raise InputError([(where, f"input {name!r} has no value: pass it with "
                                           "--inputs or give it a default")], self.source)
                    return self.values[name]
                if key in ("get_property", "get_attribute", "get_operation_output", "concat",
                           "join", "token", "get_artifact"):
                    raise InputError([(where, f"{key} cannot be resolved at plan time; "
                                       "use get_input or a literal value")], self.source)
            return {k: self.resolve(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value


def read_tosca(path: str | Path, inputs: dict[str, Any] | None = None,
               base_target: Target | None = None, node: str | None = None) -> JobRequest:
    path = Path(path)
    source = str(path)
    doc = load_document(path)  # syntax errors with line numbers, limits, before tosca-parser
    check_imports(doc, path)  # tosca-parser would open whatever the imports name
    topology = doc.get("topology_template") if isinstance(doc, dict) else None
    if not isinstance(topology, dict) or not topology:
        # (a file of types only, such as MODAK's own, parses as one with no topology)
        what = "missing or empty" if not topology else \
            f"must be a mapping, not {type(topology).__name__}"
        raise InputError([("topology_template", f"{what}: a blueprint's topology holds a "
                           f"{JOB_TYPE} node")], source)
    template = _parse(path, inputs or {})
    resolver = _Inputs(template, inputs or {}, source)

    jobs = [n for n in template.nodetemplates if _is_a(n, JOB_TYPE)]
    if node is not None:
        jobs = [n for n in jobs if n.name == node]
        if not jobs:
            raise InputError([("topology_template.node_templates",
                               f"no {JOB_TYPE} node named {node!r}")], source)
    if not jobs:
        raise InputError([("topology_template.node_templates",
                           f"no node of type {JOB_TYPE}")], source)
    if len(jobs) > 1:
        names = ", ".join(n.name for n in jobs)
        raise InputError([("topology_template.node_templates",
                           f"several {JOB_TYPE} nodes ({names}): choose one with --node")], source)
    job = jobs[0]
    prefix = f"topology_template.node_templates.{job.name}"

    hosts = [t for r, t in job.relationships.items() if r.type == "tosca.relationships.HostedOn"]
    hosts = [t for t in hosts if _is_a(t, TARGET_TYPE)]
    if not hosts:
        raise InputError([(f"{prefix}.requirements",
                           f"the job needs a 'host' requirement on a {TARGET_TYPE} node")], source)
    target_node = hosts[0]
    tprefix = f"topology_template.node_templates.{target_node.name}.properties"

    def props(n: Any, where: str) -> dict[str, Any]:
        raw = n.entity_tpl.get("properties") or {}
        return resolver.resolve(raw, where)

    return request_from_nodes(job.name, props(job, f"{prefix}.properties"), target_node.name,
                              props(target_node, tprefix), source, base_target)


def request_from_nodes(job_name: str, job_props: dict[str, Any], target_name: str,
                       target_props: dict[str, Any], source: str,
                       base_target: Target | None = None) -> JobRequest:
    """The request of one AITrainingJob node and its HPCTarget host, from their properties
    (as written in a blueprint, or as an orchestrator such as xOpera evaluated them)."""
    prefix = f"topology_template.node_templates.{job_name}"
    tprefix = f"topology_template.node_templates.{target_name}.properties"
    # TOSCA has no null: "auto" and an accelerator of vendor "none" are the types' "unset"
    tprops = {k: v for k, v in target_props.items()
              if v is not None and v != "auto"
              and not (k == "accelerators" and isinstance(v, dict) and v.get("vendor") == "none")}
    base = base_target.model_dump(exclude_none=True) if base_target else {}
    target_data = resolve_host_values(merge_target({**base, "name": target_name}, tprops))
    target = validate(Target, target_data, source, tprefix)
    data = {
        "source": source,
        "source_format": "tosca",
        "job": job_props.get("job_options") or {},
        "application": job_props.get("application") or {},
        "optimisation": job_props.get("optimisation") or {},
        "environment": job_props.get("environment") or {},
        "target": target,
    }
    try:
        return JobRequest.model_validate(data)
    except ValidationError as exc:  # name the node's own property (job -> job_options)
        renamed = []
        for p, m in problems_of(exc, model=JobRequest):
            head, _, rest = p.partition(".")
            head = {"job": "job_options"}.get(head, head)
            renamed.append((f"{prefix}.properties.{head}{'.' + rest if rest else ''}", m))
        raise InputError(renamed, source) from None
