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

from ..errors import InputError
from ..models import JobRequest

MAX_FILES = 2000
MAX_BYTES = 512 * 1024 * 1024
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "node_modules"}
# a module beside the script larger than this is not read for its imports
MAX_SOURCE_BYTES = 4 * 1024 * 1024


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
    does not parse, cannot be read, or is larger than :data:`MAX_SOURCE_BYTES`."""
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return None
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


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
        steps = [base.joinpath(*Path(app.script).parts[:i + 1])
                 for i in range(len(Path(app.script).parts))]
        if path.is_file() and not any(s.is_symlink() for s in steps) and _inside(path, base):
            out.append((str(path), app.script))
    total = sum(os.path.getsize(src) for src, _ in out)
    if total > MAX_BYTES:
        raise InputError([("application.files", f"{total / 2**20:.0f} MiB to copy into the run "
                           f"directory (limit {MAX_BYTES // 2**20} MiB): keep data sets on the "
                           "cluster and pass their paths as arguments")], request.source)
    return sorted(set(out), key=lambda f: f[1])


# at most this many names a warning lists (the rest are counted)
UNSENT_SHOWN = 5


def unsent_names(request: JobRequest, files: list[tuple[str, str]],
                 base: "Optional[str | Path]" = None) -> list[str]:
    """Names that the Python files going to the run directory (``files``, as
    :func:`application_files` gives them) write as string constants, and that are files or
    folders beside the request here, inside its directory, but not going with them: a
    script's ``open("config.yaml")`` or ``Path("data") / name`` where the request lists no
    ``application.files``.  The job would not find them (a user's script failed every trial
    with "No such file" for its ``labels.txt``).  Read with :mod:`ast`, never run; a name
    the script writes (its output, left here by a run of it) is named too, so the caller
    warns, never refuses."""
    base = (Path(base).resolve() if base else None) or request_dir(request)
    if base is None:
        return []
    sent = {dest for _, dest in files}
    names: set[str] = set()
    for src, dest in files:
        tree = _syntax_tree(Path(src)) if dest.endswith(".py") else None
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    out = []
    for name in sorted(names):
        rel = os.path.normpath(name) if 0 < len(name) < 256 else ""
        if not rel or rel == "." or rel.startswith(("/", "-", "..")) or "\n" in rel \
                or "\0" in rel or any(part.startswith(".") for part in Path(rel).parts):
            continue
        if rel in sent or any(d.startswith(rel + "/") for d in sent):
            continue
        path = base / rel
        try:
            if not path.exists() or path.is_symlink() or not _inside(path, base):
                continue
        except (OSError, ValueError):
            continue
        out.append(rel)
    return out


def unsent_warning(names: list[str]) -> Optional[str]:
    """One line for :func:`unsent_names`' answer (None: nothing to say)."""
    if not names:
        return None
    shown = ", ".join(repr(n) for n in names[:UNSENT_SHOWN])
    more = f" and {len(names) - UNSENT_SHOWN} more" if len(names) > UNSENT_SHOWN else ""
    them = "them" if len(names) > 1 else "it"
    return (f"the script names {shown}{more}, beside the request here but not sent to the "
            f"run directory: if the job reads {them}, list {them} (with the script) in "
            "application.files")


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
