"""A starting blueprint around a training script the user already has (``modak init
--script``), from what the script says of itself, read with :mod:`ast`, never run:

* the framework, from its imports (``keras`` for Keras 3, else ``tensorflow``, else
  ``torch``), and the newest CPU image of it in the catalogue for its version;
* its command-line options, from its ``argparse`` calls (``add_argument`` with literal
  names and defaults): an option of steps (``--steps``, ``--max-steps``, ``--iters``...)
  or of epochs becomes the blueprint's input and ``application.steps``/``epochs``, so that
  MODAK weighs a compiler's warm-up against the job's length; an option of the batch size
  gives ``application.batch_size`` (else a literal ``batch_size=N`` of its calls, a data
  loader's or ``model.fit``'s, where there is one value); every other option is listed in a
  comment, to pass in ``arguments``;
* the Python packages it imports that its image does not install (the image's own
  distributions, and with a wheelhouse their requirements' closure): ``pip_packages``;
* the run directory's files: as MODAK finds them for a script listed alone (the script,
  the modules and packages beside it), and where the script names data files or folders
  beside it (``pd.read_csv("houses.csv")``), ``application.files`` with all of them.

The blueprint is rendered from MODAK's own template (every value as a JSON string, which
YAML reads as it is), then read back by the TOSCA reader before anything is written.
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.utils import canonicalize_name

from modak_runtime.imports import required_imports, syntax_tree

from .errors import ModakError
from .imports import (ALWAYS, STDLIB, Wheelhouse, distribution_for, local_modules,
                      requirement_name)
from .readers.appfiles import (application_files, call_name, unsent_names,
                               written_constants)
from .validate import check_output, check_relative

# option names (without dashes, "_" as "-", lower case) that say how long the job trains
STEP_OPTIONS = frozenset({
    "steps", "max-steps", "num-steps", "total-steps", "train-steps", "n-steps", "nsteps",
    "iterations", "iters", "max-iters", "num-iters", "num-iterations", "max-iterations"})
EPOCH_OPTIONS = frozenset({"epochs", "num-epochs", "max-epochs", "n-epochs", "train-epochs",
                           "nepochs"})
OUTPUT_OPTIONS = frozenset({
    "out", "output", "out-dir", "output-dir", "outdir", "save-dir", "checkpoint-dir",
    "ckpt-dir", "checkpoints", "log-dir", "logdir", "model-dir", "results-dir", "save-path"})
BATCH_OPTIONS = frozenset({"batch-size", "batch", "bs", "batchsize", "train-batch-size",
                           "per-device-train-batch-size", "mini-batch-size"})
# script names that say nothing of the workload: its directory names it instead
GENERIC_STEMS = frozenset({"train", "main", "run", "script", "training", "fit", "job"})
# the modules that an image's own distributions always bring, where no wheelhouse tells
REQUIRED = {"tensorflow": {"numpy", "h5py"}, "keras": {"numpy", "h5py"}, "jax": {"numpy"}}
# a distribution's import name where it differs from the name (image packages only)
_SUFFIXES = ("-cpu", "-gpu")
MAX_OUTPUTS = 8  # outputs read from the script, at most
SHOWN_OPTIONS = 12  # options the comment lists; the rest are counted
MAX_DATA_BYTES = 256 * 1024 * 1024  # data beside the script sent with it, at most
MAX_FILES = 2000  # files of it


@dataclass(frozen=True)
class Option:
    """One ``add_argument`` of the script."""
    flag: str          # its longest name, as the script spells it: --batch-size, or data_dir
    default: object    # a literal default (int, float, str, bool), else None
    line: int
    required: bool = False

    @property
    def key(self) -> str:
        return self.flag.lstrip("-").replace("_", "-").lower()

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")

    def shown(self) -> str:
        if self.positional:
            return f"{self.flag} (positional)"
        if self.required:
            return f"{self.flag} (required)"
        return self.flag if self.default is None else f"{self.flag} ({self.default!r})"


@dataclass
class Facts:
    """What the blueprint says of the script."""
    script: str                       # relative to the blueprint's directory
    framework: str
    framework_version: Optional[str]
    keras_backend: Optional[str]
    image: Optional[str]              # the catalogue variant the version was taken from
    compiler: Optional[str]           # the graph compiler that image offers first
    model: str
    options: list[Option] = field(default_factory=list)
    length: Optional[Option] = None   # the option of steps or epochs
    length_kind: Optional[str] = None  # "steps" | "epochs"
    batch: Optional[Option] = None
    batch_size: Optional[int] = None
    batch_said: str = ""              # where the batch size was read
    pip_packages: list[str] = field(default_factory=list)
    guessed: list[str] = field(default_factory=list)  # distributions named as the import
    files: list[str] = field(default_factory=list)    # empty: as MODAK finds them
    data: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # what it writes (run directory)

    @property
    def unsent(self) -> list[str]:
        """The data it names beside it that ``files`` does not send."""
        return [d for d in self.data if d not in self.files]


def _literal(node: Optional[ast.AST]) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) \
            and not isinstance(node.operand.value, bool):
        return -node.operand.value
    return None


def options(tree: ast.AST) -> list[Option]:
    """The script's ``add_argument`` calls with literal names, in the order of its lines."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and call_name(node.func) == "add_argument"):
            continue
        names = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value]
        if not names or len(names) != len(node.args):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        flag = max(names, key=len)
        if not flag.startswith("-") and len(names) > 1:
            continue  # (not what argparse accepts)
        found.append(Option(flag, _literal(kw.get("default")), node.lineno,
                            _literal(kw.get("required")) is True))
    return sorted(found, key=lambda o: o.line)


def _batch_keywords(tree: ast.AST) -> list[tuple[int, int]]:
    """(value, line) of every literal ``batch_size=N`` keyword of a call."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for k in node.keywords:
                value = _literal(k.value)
                if k.arg == "batch_size" and isinstance(value, int) \
                        and not isinstance(value, bool) and value > 0:
                    out.append((value, node.lineno))
    return out


def _framework(modules: set[str]) -> Optional[str]:
    if "keras" in modules:
        return "keras"
    if "tensorflow" in modules:
        return "tensorflow"
    if modules & {"torch", "lightning", "pytorch_lightning"}:
        return "pytorch"
    return None


def _keras_backend(tree: ast.AST) -> Optional[str]:
    """The backend a Keras script sets for itself: ``os.environ["KERAS_BACKEND"] = "torch"``
    or ``os.environ.setdefault("KERAS_BACKEND", "torch")``, literally."""
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Subscript) \
                and _literal(node.targets[0].slice) == "KERAS_BACKEND":
            value = _literal(node.value)
        elif isinstance(node, ast.Call) and call_name(node.func) == "setdefault" \
                and len(node.args) == 2 and _literal(node.args[0]) == "KERAS_BACKEND":
            value = _literal(node.args[1])
        if value in ("tensorflow", "jax", "torch"):
            return str(value)
    return None


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", version))


def _image(framework: str, backend: Optional[str] = None):
    """The catalogue's newest CPU variant of ``framework`` (with Keras' ``backend``; for this
    machine's architecture where it has one), else None."""
    from .catalogue import load_catalogue
    machine = os.uname().machine
    found = [v for v in load_catalogue().variants
             if v.framework == framework and v.accelerator == "none"
             and (backend is None or backend in v.backends)]
    here = [v for v in found if v.arch == machine] or found
    return max(here, key=lambda v: _version_key(v.version), default=None)


def _workload_name(script: Path, base: Path) -> str:
    stem = script.stem if script.stem.lower() not in GENERIC_STEMS else base.name
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-._").lower()[:64]
    return name if name and name[0].isalnum() else "my-workload"


def _provided(variant, wheelhouse: Optional[Path]) -> set[str]:
    """The top-level modules the image installs: its own distributions' (and what those
    always bring, :data:`REQUIRED`), and with a wheelhouse, every module of the closure of
    its requirements over the wheels there."""
    own = list(variant.pip) if variant is not None else []
    names = set()
    for name in filter(None, map(requirement_name, own)):
        for suffix in _SUFFIXES:
            name = name.removesuffix(suffix)
        names.add(name.replace("-", "_"))
    names |= set().union(*(REQUIRED.get(n, set()) for n in names))
    if wheelhouse is not None and own:
        house = Wheelhouse.read(wheelhouse)
        for dist in house.installed(own, variant.arch) if house.distributions else ():
            names |= house.provides[dist]
    return names


def read_script(base: Path, script: str, framework: Optional[str] = None,
                wheelhouse: Optional[Path] = None) -> Facts:
    """What :func:`blueprint` writes of ``script`` (relative to ``base``)."""
    from .models import Application, JobRequest

    path = base / script
    tree = syntax_tree(str(path))
    if tree is None:
        raise ModakError(f"--script {script}: not a Python file MODAK can read (it does not "
                         "parse, or is larger than MODAK reads)")
    request = JobRequest(source=str(base / "blueprint.yaml"), source_format="tosca",
                         application=Application(script=script))
    sent = application_files(request, base)
    python = [(src, dest) for src, dest in sent if dest.endswith(".py")]
    local = local_modules(sent, script)
    modules = {i.module for i in required_imports(python)}
    # the framework: the script's own imports, and those of the modules it imports from
    # beside it (a model.py), not every file beside it
    own = {i.module for i in required_imports([(str(path), script)])}
    near = [(src, dest) for src, dest in python
            if dest.rsplit("/", 1)[-1][:-3] in own & local or dest.split("/", 1)[0] in own]
    framework = framework or _framework(own | {i.module for i in required_imports(near)})
    if framework is None:
        raise ModakError(f"--script {script}: it imports none of torch, tensorflow, keras: "
                         "name its framework with --framework")
    backend = _keras_backend(tree) if framework == "keras" else None
    variant = _image(framework, backend)
    version = ".".join(variant.version.split(".")[:2]) if variant is not None else None
    provided = _provided(variant, wheelhouse)
    facts = Facts(script=script, framework=framework, framework_version=version,
                  keras_backend=backend,
                  compiler=variant.compilers[0].value if variant and variant.compilers else None,
                  image=variant.id if variant is not None else None,
                  model=_workload_name(path, base), options=options(tree))
    for module in sorted(modules):
        if module in STDLIB or module in ALWAYS or module in local or module in provided \
                or module.startswith("_"):
            continue
        dist = distribution_for(module)
        if dist is None:
            dist = canonicalize_name(module)
            facts.guessed.append(module)
        if dist not in facts.pip_packages and dist.replace("-", "_") not in provided:
            facts.pip_packages.append(dist)
    for opt in facts.options:
        if opt.positional:
            continue
        if facts.length is None and opt.key in STEP_OPTIONS | EPOCH_OPTIONS \
                and _count(opt.default):
            facts.length = opt
            facts.length_kind = "steps" if opt.key in STEP_OPTIONS else "epochs"
        elif facts.batch is None and opt.key in BATCH_OPTIONS and _count(opt.default):
            facts.batch = opt
    if facts.batch is not None:
        facts.batch_size = facts.batch.default
        facts.batch_said = f"the default of its {facts.batch.flag}, line {facts.batch.line}"
    else:
        seen = _batch_keywords(tree)
        if seen and len({v for v, _ in seen}) == 1:
            facts.batch_size = seen[0][0]
            facts.batch_said = f"its batch_size={seen[0][0]}, line {seen[0][1]}"
    for opt in facts.options:
        if opt.key in OUTPUT_OPTIONS and isinstance(opt.default, str):
            _output(facts.outputs, opt.default)
    for src, dest in python:
        tree_ = syntax_tree(src)
        if tree_ is not None:
            written = written_constants(tree_) - _trailing(tree_)
            for node in ast.walk(tree_):
                if id(node) in written and len(facts.outputs) < MAX_OUTPUTS:
                    _output(facts.outputs, node.value)
    data = unsent_names(request, sent, base)
    sendable = [d for d in data if _valid(check_relative, d)]
    if sendable and _size(base, sendable) <= MAX_DATA_BYTES:
        tops = sorted({dest.split("/", 1)[0] for _, dest in sent if dest != script})
        facts.files = [script, *(t for t in tops if _valid(check_relative, t)), *sendable]
    facts.data = data
    return facts


def _trailing(tree: ast.AST) -> set[int]:
    """The ids of the constants that are not a path's first part (``"net.pt"`` of
    ``os.path.join(args.out, "net.pt")`` or of ``out / "net.pt"``): no output by themselves."""
    out: set[int] = set()
    for node in ast.walk(tree):
        rest: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            rest = [node.right]
        elif isinstance(node, ast.Call) and call_name(node.func) in ("join", "Path",
                                                                      "PurePath"):
            rest = node.args[1:]
        out.update(id(n) for r in rest for n in ast.walk(r) if isinstance(n, ast.Constant))
    return out


def _output(out: list[str], name: str) -> None:
    """``name`` (a path the script writes) as an output: its first part, where it is a
    plain relative path."""
    try:
        first = check_output(name).split("/", 1)[0]
    except ValueError:
        return
    if first not in out and not first.startswith(".") and first != "..":
        out.append(first)


def _count(value: object) -> bool:
    """A literal count: a positive int."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _valid(check, value: str) -> bool:
    try:
        check(value)
    except ValueError:
        return False
    return True


def _size(base: Path, names: list[str]) -> int:
    """The bytes of ``names`` (files or folders of ``base``), counted up to just past
    :data:`MAX_DATA_BYTES` or :data:`MAX_FILES` files (a data set's folder is not walked
    whole)."""
    total = count = 0
    for name in names:
        path = base / name
        if path.is_file():
            total += path.stat().st_size
            continue
        for root, dirs, files in os.walk(path):
            for f in files:
                count += 1
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
                if total > MAX_DATA_BYTES or count > MAX_FILES:
                    return MAX_DATA_BYTES + 1
    return total


def _yaml(value: object) -> str:
    """A value as YAML reads it back unchanged: JSON (strings always quoted)."""
    return json.dumps(value)


def blueprint(facts: Facts) -> str:
    """The blueprint's text (MODAK's template ``init/blueprint.yaml.j2``)."""
    from .render import render

    arguments: list[str] = []
    if facts.length is not None:
        arguments += [_yaml(facts.length.flag), "{get_input: %s}" % facts.length_kind]
    if facts.batch is not None:
        arguments += [_yaml(facts.batch.flag), _yaml(str(facts.batch_size))]
    length_default = facts.length.default if facts.length is not None else None
    listed = [o for o in facts.options if o not in (facts.length, facts.batch)]
    return render(
        "init/blueprint.yaml.j2", facts=facts, j=_yaml, arguments=", ".join(arguments),
        length_default=length_default, compiler=facts.compiler,
        listed=[o.shown() for o in listed[:SHOWN_OPTIONS]],
        more=max(0, len(listed) - SHOWN_OPTIONS))
