"""Where MODAK keeps its own files (the results store, the fitted model)."""
from __future__ import annotations

import os
from pathlib import Path


def data_file(env_var: str, name: str) -> Path:
    """``$ENV_VAR`` if set, else ``$XDG_DATA_HOME/modak/NAME`` (``~/.local/share/modak/NAME``)."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "modak" / name
