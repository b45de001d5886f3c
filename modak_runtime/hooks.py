"""Post-import hooks: run a function right after a framework's top-level module is imported.

The runtime imports no framework itself (a Keras script must not pay for importing torch);
it patches a framework the moment the user's script imports it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable

_HOOKS: dict[str, list[Callable]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for hook in _HOOKS.pop(self.name, []):
            hook(module)

    def __getattr__(self, attr):  # resources, get_code, is_package, ...
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_FINDER = _Finder()


def when_imported(name: str, hook: Callable) -> None:
    """Call ``hook(module)`` once ``name`` is imported (at once if it already is)."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    _HOOKS.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
