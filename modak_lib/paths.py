"""Where MODAK keeps its own files: the results store, the fitted model, plans, fetched
results and the wheelhouse — in the user's data directory, never in the installed package.

``$MODAK_HOME`` if set, else ``$XDG_DATA_HOME/modak`` (``~/.local/share/modak``); single
files also have their own variable (``$MODAK_RESULTS``, ``$MODAK_MODEL``).
"""
from __future__ import annotations

import os
from pathlib import Path


def user_dir(sub: str = "") -> Path:
    """MODAK's directory of the user (or a folder of it), not created here."""
    if os.environ.get("MODAK_HOME"):
        base = Path(os.environ["MODAK_HOME"])
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "modak"
    return base / sub if sub else base


def data_file(env_var: str, name: str) -> Path:
    """``$ENV_VAR`` if set, else ``NAME`` in :func:`user_dir`."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    return user_dir(name)
