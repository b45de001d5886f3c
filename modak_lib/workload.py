"""How MODAK names a request's workload before it has run, and knows it after.

A workload is known by its **fingerprint** (``modak_runtime`` measures it on the first
training step: parameters, FLOPs per step and their shares by layer kind, batch, input
shape).  Before a script has run, the planner can only know it by what the request says:
its **key** (framework, script as written, arguments) links a request to the fingerprints
its earlier runs measured.  The **label** (the request's ``model``, else the script's
name) is for people, and for a script never run under this key: a request that labels its
workload like measured runs of the same framework and batch says it is that workload.
"""
from __future__ import annotations

import hashlib
import json
import posixpath

from .models import Application


def label(app: Application) -> str:
    if app.model:
        return app.model
    if app.script:
        return posixpath.splitext(posixpath.basename(app.script))[0] or app.script
    return posixpath.basename(app.executable)


def key(app: Application) -> str:
    text = json.dumps([app.framework.value, app.script or app.executable, list(app.arguments)])
    return "wk-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def wrappable(app: Application) -> bool:
    """Whether the runtime can run the application (a Python script it can start)."""
    exe = posixpath.basename(app.executable)
    return bool(app.script) and app.script.endswith(".py") and exe.startswith("python")
