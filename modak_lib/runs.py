"""Runs: the same request for the same target is one run; a new run only when asked.

A plan's run id is a hash of its job script, so that anything that changes the script is
another run.  But the script depends on the model's choice, and the model is refitted after
every run: planning the same request again could choose differently and submit it again.  So
the first plan of a request is *pinned*: a key over everything the request is made of (the
files' contents, inputs, target overrides, the application's files, trial settings) names a
small record of that run, and planning the same request again reuses its plan.  Asking for a
new run plans again, with everything measured since, under a fresh run id.

The Ansible action (``modak_plan``) keeps its pins in ``requests/`` beside the plans, and
``modak plan --out DIR`` in ``DIR/.modak-requests/`` (``Pins(folder)``).
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from .files import write_atomic


def file_digest(path: Optional[str | Path]) -> str:
    """The SHA-256 of a file's bytes ("" for no file): what of a file a key depends on."""
    if not path:
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def request_key(parts: Mapping[str, Any]) -> str:
    """The pin key of a request made of ``parts`` (JSON-able; files given by digest)."""
    text = json.dumps(dict(parts), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def new_run_id(run_id: str, now: Optional[float] = None) -> str:
    """A run id for planning the same request again: the plan's own, with the time."""
    return "%s-%s" % (run_id, time.strftime("%Y%m%dT%H%M%S", time.localtime(now)))


class Pins:
    """Pinned runs in ``folder``: one JSON record per request key."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def get(self, key: str) -> Optional[dict[str, Any]]:
        """The pinned run's record with its ``plan`` (plan.json) read back, or None when
        there is no pin or its plan is gone (then the request is planned again)."""
        try:
            record = json.loads((self.folder / f"{key}.json").read_text())
            plan_file = Path(record["plan_dir"]) / "plan.json"
            record["plan"] = json.loads(plan_file.read_text())
            if record["plan"]["run_id"] != record["run_id"]:  # another run's plan since
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return record

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Pin a run: ``record`` must name its ``plan_dir`` and ``run_id``."""
        if "plan_dir" not in record or "run_id" not in record:
            raise ValueError("a pinned run needs plan_dir and run_id")
        write_atomic(self.folder, f"{key}.json",
                     json.dumps({k: v for k, v in record.items() if k != "plan"}))
