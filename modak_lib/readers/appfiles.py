"""Which of the user's files a run directory receives, read from the controller's disk.

* ``application.files`` (paths relative to the request file's directory: files or whole
  directories) when the request lists them, and the script itself with them (a user who
  lists a data file still means the script to run);
* otherwise the script's own directory: for ``pkg/sub/train.py`` the tree ``pkg/``, for a
  top-level ``train.py`` the script, the ``.py`` modules beside it and the packages beside
  it (a directory with an ``__init__.py``, or one that the script or a module beside it
  imports by name: a namespace package), never the whole directory the request sits in,
  which may be a home directory.

Everything stays inside the request's directory: no absolute paths, no ``..``, no symbolic
link is followed (a link is skipped), hidden entries and bytecode caches are left out, and
the total is bounded.  The runtime (``modak_runtime``) always goes along.
"""
from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path
from typing import Optional

from modak_runtime.imports import syntax_tree

from ..errors import InputError
from ..models import JobRequest
from .common import load_document

MAX_FILES = 2000
MAX_BYTES = 512 * 1024 * 1024
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "node_modules"}


def request_dir(request: JobRequest) -> Optional[Path]:
    """The directory of the request file, when the request came from a file."""
    path = Path(request.source)
    return path.resolve().parent if path.is_file() else None


def _inside(path: Path, base: Path) -> bool:
    try:
        path.resolve().relative_to(base)
    except ValueError:
        return False
    return True


def through_link(base: Path, rel: str) -> bool:
    """Whether ``rel`` (relative to ``base``) is a symbolic link, or lies under one."""
    parts = Path(rel).parts
    return any(base.joinpath(*parts[:i + 1]).is_symlink() for i in range(len(parts)))


def _walk(top: Path, base: Path, out: list[tuple[str, str]], field: str, source: str,
          named: bool = False) -> None:
    """The files of ``top`` (a file, or a directory's tree) into ``out``; hidden entries
    and :data:`SKIP_DIRS` are left out, unless ``top`` is one the request ``named``."""
    if top.is_symlink() or (not named and (top.name.startswith(".") or top.name in SKIP_DIRS)):
        return
    if top.is_file():
        if top.suffix not in (".pyc", ".pyo"):
            out.append((str(top), top.relative_to(base).as_posix()))
        return
    for entry in sorted(top.iterdir()):
        _walk(entry, base, out, field, source)
        if len(out) > MAX_FILES:
            raise InputError([(field, f"more than {MAX_FILES} files to copy into the run "
                               "directory: list what the job needs in application.files")],
                             source)


def _syntax_tree(path: Path) -> Optional[ast.AST]:
    """A Python file's syntax tree, read with :mod:`ast`, never run; None for one that
    does not parse, cannot be read, or is too large (``modak_runtime.imports``)."""
    return syntax_tree(str(path))


def imported_names(paths: list[Path]) -> set[str]:
    """The top-level names the Python files ``paths`` import (``import a.b``, ``from a.b
    import c``: ``a``), read with :mod:`ast`, never run; a file that does not parse (or is
    too large) names none, and relative imports name nothing beside the script."""
    names: set[str] = set()
    for path in paths:
        tree = _syntax_tree(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".", 1)[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".", 1)[0])
    return names


def packages_beside(base: Path, modules: list[Path]) -> list[str]:
    """The directories of ``base`` that a top-level script may import as packages: those
    with an ``__init__.py``, and those that ``modules`` (the script and the modules beside
    it) import by name (a namespace package); hidden ones and :data:`SKIP_DIRS` aside."""
    imported = None
    found = []
    for d in sorted(base.iterdir()):
        if d.is_symlink() or not d.is_dir() or d.name.startswith(".") or d.name in SKIP_DIRS \
                or not d.name.isidentifier():
            continue
        if not (d / "__init__.py").is_file():
            if imported is None:
                imported = imported_names(modules)
            if d.name not in imported:
                continue
        found.append(d.name)
    return found


def application_files(request: JobRequest, base: "Optional[str | Path]" = None
                      ) -> list[tuple[str, str]]:
    """(controller path, path in the run directory) of every file the job needs; ``base``
    is the directory they are relative to when the request did not come from a file."""
    app = request.application
    base = (Path(base).resolve() if base else None) or request_dir(request)
    if base is None:
        if app.files:
            raise InputError([("application.files", "the request did not come from a file: "
                               "there is no directory to take these files from")],
                             request.source)
        return []
    out: list[tuple[str, str]] = []
    script = None  # the entry whose absence fails the job: the script, or its package
    if app.files:
        entries = [(f"application.files[{i}]", f) for i, f in enumerate(app.files)]
        if app.script:
            script = app.script
            entries.append(("application.script", script))
        named = len(entries)
    elif app.script:
        script = app.script.split("/", 1)[0]
        entries = [("application.script", script)]
        named = 1  # (what the request names; the rest is found beside it)
        if "/" not in app.script:  # the modules a top-level script imports from beside it
            modules = [p for p in sorted(base.glob("*.py")) if not p.is_symlink()]
            entries += [("application.script", p.name) for p in modules
                        if p.name != app.script]
            entries += [("application.script", d) for d in packages_beside(base, modules)]
    else:
        return []
    for i, (field, rel) in enumerate(entries):
        if rel.startswith("/"):
            raise InputError([(field, f"{rel!r}: give a path relative to the request's "
                               "directory")], request.source)
        path = base / rel
        if not path.exists():
            if field == "application.script":
                if rel == script:  # the script itself: say so, the deploy would fail
                    raise InputError([(field, f"{rel!r} not found in {base}: the run directory "
                                       "needs the script (paths are relative to the request "
                                       "file)")], request.source)
                continue
            raise InputError([(field, f"{rel!r} not found in {base}")], request.source)
        if path.is_symlink() or not _inside(path, base):
            raise InputError([(field, f"{rel!r} is a symbolic link or leads outside the "
                               "request's directory")], request.source)
        _walk(path, base, out, field, request.source, named=i < named)
    if app.script and not any(dest == app.script for _, dest in out):
        # the script itself, where its folder's walk left it out (``.train.py``, or a
        # script inside a hidden folder of its package): the request names it
        path = base / app.script
        if path.is_file() and not through_link(base, app.script) and _inside(path, base):
            out.append((str(path), app.script))
    total = sum(os.path.getsize(src) for src, _ in out)
    if total > MAX_BYTES:
        raise InputError([("application.files", f"{total / 2**20:.0f} MiB to copy into the run "
                           f"directory (limit {MAX_BYTES // 2**20} MiB): keep data sets on the "
                           "cluster and pass their paths as arguments")], request.source)
    return sorted(set(out), key=lambda f: f[1])


# at most this many names a warning lists (the rest are counted)
UNSENT_SHOWN = 5


# a call whose name is one of these writes the paths among its arguments (``os.makedirs``,
# ``torch.save(obj, path)``, ``np.save(path, a)``, ``fig.savefig``, ``df.to_csv``, Keras'
# ``model.save``); ``Path(p).write_text()`` and the like write the path they are called on
WRITING_CALLS = {"makedirs", "mkdir", "save", "savez", "savez_compressed", "savetxt",
                 "savefig", "save_weights", "to_csv", "to_json", "to_parquet", "to_pickle"}
WRITING_METHODS = {"mkdir", "write_text", "write_bytes", "touch"}
# a text file of settings the job's files name is read for the names it holds in turn
# (``--config settings.json`` whose ``"data": "series.csv"``), when no larger than this
MAX_SETTINGS_BYTES = 1024 * 1024
SETTINGS_SUFFIXES = (".json", ".yaml", ".yml", ".toml")


def call_name(func: ast.AST) -> Optional[str]:
    return func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else None


def _path_constants(node: ast.AST) -> list[ast.Constant]:
    """The string constants a path expression is made of: ``"a"``, ``Path("a") / "b"``,
    ``os.path.join("a", "b")``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _path_constants(node.left) + _path_constants(node.right)
    if isinstance(node, ast.Call) and call_name(node.func) in ("join", "Path", "PurePath"):
        return [c for a in node.args for c in _path_constants(a)]
    return []


def written_constants(tree: ast.AST) -> set[int]:
    """The ids of the string constants that a Python file uses as paths it writes: an
    ``open(p, "w")`` (or ``"a"``, ``"x"``, never ``"+"``), a call of
    :data:`WRITING_CALLS`, a :data:`WRITING_METHODS` call on ``Path(p)``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node.func)
        if name == "open" and node.args:
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) \
                    and set(mode.value) & set("wax") and "+" not in mode.value:
                out.update(id(c) for c in _path_constants(node.args[0]))
            continue
        if name in WRITING_CALLS:
            for arg in node.args:
                out.update(id(c) for c in _path_constants(arg))
        if name in WRITING_METHODS and isinstance(node.func, ast.Attribute):
            out.update(id(c) for c in _path_constants(node.func.value))
    return out


def _settings_strings(path: Path) -> list[str]:
    """The strings a settings file (JSON, YAML or TOML, by its name) holds, keys aside;
    none for one that does not parse, is larger than :data:`MAX_SETTINGS_BYTES`, or is
    past the limits MODAK reads its own inputs within (aliases, depth, values:
    ``common.load_document``)."""
    try:
        if path.stat().st_size > MAX_SETTINGS_BYTES:
            return []
        if path.suffix == ".toml":
            import tomllib
            data = tomllib.loads(path.read_text())
        else:
            data = load_document(path)
    except Exception:  # (any parser's error: a file that is not what its name says)
        return []
    out: list[str] = []
    todo = [data]
    while todo and len(out) < MAX_FILES:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return out


def _beside(name: str, base: Path) -> Optional[str]:
    """``name`` as a path relative to ``base`` when it is a file or folder there (no
    link, nothing hidden, nothing outside), else None."""
    rel = os.path.normpath(name) if 0 < len(name) < 256 else ""
    if not rel or rel == "." or rel.startswith(("/", "-", "..")) or "\n" in rel \
            or "\0" in rel or any(part.startswith(".") for part in Path(rel).parts):
        return None
    path = base / rel
    try:
        if not path.exists() or path.is_symlink() or not _inside(path, base):
            return None
    except (OSError, ValueError):
        return None
    return rel


def unsent_names(request: JobRequest, files: list[tuple[str, str]],
                 base: "Optional[str | Path]" = None) -> list[str]:
    """Names that the job's files and arguments give and that are files or folders beside
    the request here, inside its directory, but not going to the run directory with
    ``files`` (as :func:`application_files` gives them): a script's ``open("config.yaml")``
    or ``Path("data") / name`` where the request lists no ``application.files``, an
    argument's ``--config settings.json`` (or ``--config=settings.json``), and the strings
    of a settings file named so (its ``"data": "series.csv"``).  The job would not find
    them (a user's script failed every trial with "No such file" for its ``labels.txt``).
    Read with :mod:`ast`, :mod:`json`, YAML's safe loader or :mod:`tomllib` (Python 3.11+),
    never run.  A name a script only writes (``os.makedirs("checkpoints")``,
    ``torch.save(m, "checkpoints/best.pt")``, ``open("metrics.json", "w")``: its output,
    left here by a run of it) is not named; one it also reads (a checkpoint it resumes
    from) is.  The caller warns, never refuses: a name may still be an output."""
    base = (Path(base).resolve() if base else None) or request_dir(request)
    if base is None:
        return []
    sent = {dest for _, dest in files}
    names: set[str] = set()  # the string constants used otherwise than as a path written
    for src, dest in files:
        tree = _syntax_tree(Path(src)) if dest.endswith(".py") else None
        if tree is None:
            continue
        writes = written_constants(tree)
        names.update(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and id(node) not in writes)
    for arg in request.application.arguments:
        names.add(str(arg))
        if str(arg).startswith("-") and "=" in str(arg):
            names.add(str(arg).partition("=")[2])
    found = {rel for rel in (_beside(n, base) for n in names) if rel}
    # the settings files the job's files and arguments name, sent or not: their strings
    for rel in sorted(found | sent):
        if rel.endswith(SETTINGS_SUFFIXES) and (base / rel).is_file():
            found.update(r for r in (_beside(n, base) for n in _settings_strings(base / rel))
                         if r)
    return sorted(rel for rel in found
                  if rel not in sent and not any(d.startswith(rel + "/") for d in sent))


def unsent_warning(names: list[str]) -> Optional[str]:
    """One line for :func:`unsent_names`' answer (None: nothing to say)."""
    if not names:
        return None
    shown = ", ".join(repr(n) for n in names[:UNSENT_SHOWN])
    more = f" and {len(names) - UNSENT_SHOWN} more" if len(names) > UNSENT_SHOWN else ""
    them = "them" if len(names) > 1 else "it"
    return (f"the job names {shown}{more} (its script, arguments or settings), beside the "
            f"request here but not sent to the run directory: if the job reads {them}, list "
            f"{them} (with the script) in application.files")


def tree_files(paths: list[str], source: str = "files") -> list[tuple[str, str]]:
    """Controller paths named explicitly (a role's ``modak_job_files``): each file, or each
    directory's tree, under its own name in the run directory."""
    out: list[tuple[str, str]] = []
    for i, p in enumerate(paths):
        path = Path(p).resolve()
        if not path.exists():
            raise InputError([(f"files[{i}]", f"{p!r} does not exist")], source)
        _walk(path, path.parent, out, f"files[{i}]", source)
    return sorted(set(out), key=lambda f: f[1])


def files_digest(files: list[tuple[str, str]]) -> str:
    """One hash of the files' names and contents: an edited script is another run."""
    h = hashlib.sha256()
    for src, dest in sorted(files, key=lambda f: f[1]):
        h.update(dest.encode() + b"\0")
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16] if files else ""


def runtime_files() -> list[tuple[str, str]]:
    """The runtime package, which every run directory receives."""
    import modak_runtime

    root = Path(modak_runtime.__file__).parent
    return [(str(p), f"modak_runtime/{p.name}") for p in sorted(root.glob("*.py"))]
