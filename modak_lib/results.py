"""The results store: every measured training run, in one SQLite file.

The benchmark campaign, every deploy and every autotuning trial append to it; the
performance model reads it (with pandas).  Appends are transactions, so concurrent
writers lose no row and a killed writer leaves the store as it was.  Standard
library only, so that the Ansible controller side can record without pandas.

Default location: ``$MODAK_RESULTS`` or ``~/.local/share/modak/results.sqlite``.
"""
from __future__ import annotations

import csv
import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

from .paths import data_file
from .errors import ModakError

SHIPPED = Path(__file__).parent / "data" / "measurements.csv"

# column -> SQLite type; the order is the CSV's
COLUMNS: dict[str, str] = {
    "recorded_at": "TEXT NOT NULL", "source": "TEXT NOT NULL", "run_id": "TEXT",
    "repeat": "INTEGER", "workload": "TEXT NOT NULL", "framework": "TEXT NOT NULL",
    "framework_version": "TEXT", "trainable_parameters": "INTEGER", "batch_size": "INTEGER",
    "image_size": "INTEGER", "compiler": "TEXT NOT NULL", "threads": "INTEGER",
    "allocator": "TEXT NOT NULL", "precision": "TEXT NOT NULL",
    "channels_last": "INTEGER NOT NULL", "onednn": "INTEGER NOT NULL", "image": "TEXT",
    "target": "TEXT", "cpu_model": "TEXT", "microarchitecture": "TEXT", "cores": "INTEGER",
    "accelerator": "TEXT", "steps": "INTEGER", "s_per_step": "REAL NOT NULL",
    "steps_per_s": "REAL", "samples_per_s": "REAL", "compile_s": "REAL", "peak_rss_mb": "REAL",
    "final_loss": "REAL", "accuracy": "REAL", "raw": "TEXT NOT NULL",
}
_INT = {k for k, v in COLUMNS.items() if v.startswith("INTEGER")}
_REAL = {k for k, v in COLUMNS.items() if v.startswith("REAL")}


class StoreError(ModakError):
    pass


def default_path() -> Path:
    return data_file("MODAK_RESULTS", "results.sqlite")


def parse_fom_lines(text: str) -> list[dict[str, Any]]:
    """The figure-of-merit records (``{"modak": "fom", ...}`` lines) in a job's output."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"modak"' in line:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("modak") == "fom":
                out.append(rec)
    return out


def compiler_name(framework: str, compile_option: str) -> str:
    """The planner's name for a workload's --compile value ('off' when none)."""
    if compile_option in ("off", "", None):
        return "off"
    if framework == "pytorch":
        return f"torch.compile:{compile_option}"
    return compile_option  # keras: xla


def row_from_fom(rec: dict[str, Any], *, source: str, run_id: Optional[str] = None,
                 repeat: Optional[int] = None, image: Optional[str] = None,
                 target: Optional[str] = None, accelerator: Optional[str] = None,
                 microarchitecture: Optional[str] = None, cores: Optional[int] = None) -> dict:
    """One store row from a figure-of-merit record printed by workloads/train.py.

    ``microarchitecture`` and ``cores`` name the target as the planner knew it (a run inside
    a container may not see them); they replace what the run reported of its host.
    """
    try:
        cfg, host, m = rec["config"], rec["host"], rec["metrics"]
        fw = rec["framework"]
        versions = host.get("frameworks", {})
        steps_per_s = float(m["steps_per_s"])
        if not steps_per_s > 0:
            raise ValueError(f"steps_per_s {steps_per_s}")
        return {
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": source, "run_id": run_id, "repeat": repeat,
            "workload": rec["workload"], "framework": fw,
            "framework_version": versions.get("torch" if fw == "pytorch" else "keras"),
            "trainable_parameters": m.get("trainable_parameters"),
            "batch_size": cfg["batch_size"],
            "image_size": 28 if rec["workload"] == "mnist-cnn" else cfg.get("image_size"),
            "compiler": compiler_name(fw, cfg["compile"]),
            "threads": cfg.get("threads") or cores or host.get("cores"),
            "allocator": cfg.get("allocator") or "glibc", "precision": cfg["precision"],
            "channels_last": int(bool(cfg.get("channels_last"))),
            "onednn": int(bool(cfg.get("onednn", True))), "image": image or "host",
            "target": target, "cpu_model": host.get("cpu_model"),
            "microarchitecture": microarchitecture or host.get("microarchitecture"),
            "cores": cores or host.get("cores"),
            "accelerator": accelerator, "steps": m.get("timed_steps"),
            "s_per_step": 1.0 / steps_per_s, "steps_per_s": steps_per_s,
            "samples_per_s": m.get("samples_per_s"), "compile_s": m.get("compile_s"),
            "peak_rss_mb": m.get("peak_rss_mb"), "final_loss": m.get("final_loss"),
            "accuracy": m.get("accuracy"), "raw": json.dumps(rec, sort_keys=True),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"not a complete figure-of-merit record ({exc})") from None


class ResultsStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()

    # -- connection -----------------------------------------------------------------
    def _connect(self, create: bool) -> sqlite3.Connection:
        if not self.path.exists():
            if not create:
                raise StoreError(f"{self.path}: no results store here yet")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            con.execute("PRAGMA busy_timeout = 60000")
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            con.close()
            raise StoreError(f"{self.path}: not a MODAK results store ({exc})") from None
        if "measurements" not in tables:
            if tables:
                con.close()
                raise StoreError(f"{self.path}: not a MODAK results store (no 'measurements' "
                                 f"table; found {sorted(tables)})")
            cols = ", ".join(f'"{k}" {v}' for k, v in COLUMNS.items())
            con.execute(f"CREATE TABLE IF NOT EXISTS measurements "
                        f"(id INTEGER PRIMARY KEY, {cols})")
        else:
            have = {r[1] for r in con.execute("PRAGMA table_info(measurements)")}
            missing = set(COLUMNS) - have
            if missing:
                con.close()
                raise StoreError(f"{self.path}: results store lacks columns {sorted(missing)}")
        return con

    # -- writing --------------------------------------------------------------------
    def append(self, rows: Iterable[dict[str, Any]]) -> int:
        rows = [self._clean(r) for r in rows]
        if not rows:
            return 0
        con = self._connect(create=True)
        try:
            names = list(COLUMNS)
            sql = (f"INSERT INTO measurements ({', '.join(chr(34) + n + chr(34) for n in names)})"
                   f" VALUES ({', '.join('?' for _ in names)})")
            con.execute("BEGIN IMMEDIATE")
            try:
                con.executemany(sql, [tuple(r.get(n) for n in names) for r in rows])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.close()
        return len(rows)

    @staticmethod
    def _clean(row: dict[str, Any]) -> dict[str, Any]:
        unknown = set(row) - set(COLUMNS) - {"id"}
        if unknown:
            raise StoreError(f"unknown result fields {sorted(unknown)}")
        out = {}
        for key, spec in COLUMNS.items():
            value = row.get(key)
            if value in ("", None):
                if "NOT NULL" in spec:
                    raise StoreError(f"result field {key!r} is required")
                value = None
            elif key in _INT:
                value = int(float(value))
            elif key in _REAL:
                value = float(value)
            out[key] = value
        return out

    def raws_of_run(self, run_id: str) -> set[str]:
        """The records already stored for ``run_id`` (to record a run only once)."""
        if not self.path.exists():
            return set()
        con = self._connect(create=False)
        try:
            return {r[0] for r in con.execute("SELECT raw FROM measurements WHERE run_id = ?",
                                              (run_id,))}
        finally:
            con.close()

    def import_csv(self, path: str | Path) -> int:
        with open(path, newline="", encoding="utf-8") as f:
            return self.append(list(csv.DictReader(f)))

    # -- reading --------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        con = self._connect(create=False)
        try:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute("SELECT * FROM measurements ORDER BY id")]
        finally:
            con.close()

    def count(self) -> int:
        if not self.path.exists():
            return 0
        con = self._connect(create=False)
        try:
            return con.execute("SELECT count(*) FROM measurements").fetchone()[0]
        finally:
            con.close()

    def export_csv(self, path: str | Path) -> int:
        rows = self.rows()
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        return len(rows)


def load_frame(store: ResultsStore | None = None, include_shipped: bool = True):
    """All measurements as a pandas DataFrame: the shipped dataset plus the store."""
    import pandas as pd

    frames = []
    if include_shipped and SHIPPED.exists():
        frames.append(pd.read_csv(SHIPPED))
    if store is not None and store.path.exists():
        frames.append(pd.DataFrame(store.rows()).drop(columns=["id"]))
    if not frames:
        raise StoreError("no measurements: the store is empty and no dataset is shipped")
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise StoreError("no measurements: the store and the shipped dataset are empty")
    return df
