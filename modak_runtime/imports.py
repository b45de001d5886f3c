"""The imports a script's Python files need, read with :mod:`ast`, never run.

One reader for the two places that ask: the plan on the controller (``modak_lib.imports``:
what an image would lack, before it is built) and the runtime in the job, which, once the
script failed on an import, names every other import of the run's files that the job's
Python lacks too (:func:`missing_here`), so that one failed run lists them all, not the
first of them.  Standard library only: it runs in the user's image.

An import is required unless a ``try`` that catches ``ImportError`` (an optional package) or
``if TYPE_CHECKING`` holds it; one in a function is required (it runs when that does).
"""
from __future__ import annotations

import ast
import importlib.util
import os
from typing import Iterable, NamedTuple, Optional

# a Python file larger than this is not read for its imports
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# the Python files of a run directory read after a failed import, at most, and the entries
# looked at to find them (a folder of data sent with the script is not walked whole)
MAX_FILES = 400
MAX_ENTRIES = 20000
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))
SKIP_DIRS = {"__pycache__", "modak_runtime", ".git", ".venv", "node_modules"}


class Import(NamedTuple):
    module: str  # its top-level name
    file: str  # the file that imports it, as the caller names it
    line: int

    def said(self) -> str:
        return f"{self.module!r} ({self.file} line {self.line})"


def syntax_tree(path: str) -> Optional[ast.AST]:
    """A Python file's syntax tree; None for one that does not parse (nested too deep for
    the parser too: ``1+1+...`` a hundred thousand times), cannot be read, or is larger
    than :data:`MAX_SOURCE_BYTES`."""
    try:
        if os.stat(path).st_size > MAX_SOURCE_BYTES:
            return None
        with open(path, "rb") as f:
            return ast.parse(f.read(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _catches_import_error(node: ast.AST) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            name = t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)
            if name in IMPORT_ERRORS:
                return True
    return False


def _type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def required(tree: ast.AST) -> list[tuple[str, int]]:
    """The absolute imports in ``tree`` that are not optional, as (top-level name, line),
    by line (a stack, not recursion: a tree as deep as the parser allows is walked whole)."""
    out: list[tuple[str, int]] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, optional = stack.pop()
        if isinstance(node, ast.Import):
            if not optional:
                out.extend((a.name.split(".", 1)[0], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not optional and node.module and not node.level:
                out.append((node.module.split(".", 1)[0], node.lineno))
        elif isinstance(node, TRY):
            guarded = optional or _catches_import_error(node)
            stack.extend((stmt, guarded) for stmt in node.body)
            stack.extend((part, optional)
                         for part in (*node.handlers, *node.orelse, *node.finalbody))
        elif isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend((stmt, optional) for stmt in node.orelse)
        else:
            stack.extend((child, optional) for child in ast.iter_child_nodes(node))
    return sorted(out, key=lambda n: n[1])


def required_imports(files: Iterable[tuple[str, str]]) -> list[Import]:
    """The required imports of the Python files among ``files`` (path to read, name to say),
    each module once, at its first place (files by name, then lines)."""
    found: dict[str, Import] = {}
    for path, name in sorted(files, key=lambda f: f[1]):
        if not name.endswith(".py"):
            continue
        tree = syntax_tree(path)
        if tree is not None:
            for module, line in required(tree):
                found.setdefault(module, Import(module, name, line))
    return list(found.values())


def _python_files(top: str) -> list[tuple[str, str]]:
    """The ``.py`` files under ``top`` (hidden entries, caches and the runtime aside), as
    (path, name relative to ``top``): at most :data:`MAX_FILES` of them, and no folder
    entered once :data:`MAX_ENTRIES` entries were looked at (``top``'s own are read first)."""
    out: list[tuple[str, str]] = []
    seen = 0
    for here, dirs, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(".py") and not name.startswith("."):
                path = os.path.join(here, name)
                out.append((path, os.path.relpath(path, top)))
                if len(out) >= MAX_FILES:
                    return out
        seen += len(dirs) + len(files)
        dirs[:] = [] if seen > MAX_ENTRIES else sorted(
            d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
    return out


def missing_here(script: str, run_dir: Optional[str] = None) -> list[Import]:
    """The required imports of the run directory's Python files (``run_dir``, default the
    working directory, and the script's own directory) that this Python cannot find, as
    the script would look for them (``sys.path`` as it is): what a run that failed on one
    import would fail on next.  Only top-level names are looked up (nothing is imported);
    the run directory's own modules are found where ``sys.path`` has them."""
    run_dir = os.path.abspath(run_dir or os.getcwd())
    tops = [run_dir]
    script_dir = os.path.dirname(os.path.abspath(script))
    if script_dir != run_dir and not script_dir.startswith(run_dir + os.sep):
        tops.append(script_dir)
    files: dict[str, str] = {}
    for top in tops:
        for path, name in _python_files(top):
            files.setdefault(path, os.path.relpath(path, run_dir) if top == run_dir else name)
    out = []
    for imp in required_imports(files.items()):
        if imp.module.startswith("__"):
            continue
        try:
            if importlib.util.find_spec(imp.module) is None:
                out.append(imp)
        except (ImportError, ValueError):
            out.append(imp)
    return out
