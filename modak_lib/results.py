"""The results store: every measured training run, in one SQLite file.

The benchmark campaign, every deploy and every autotuning trial append to it; the
performance model reads it (with pandas).  Appends are transactions, so concurrent
writers lose no row and a killed writer leaves the store as it was.  Standard
library only, so that the Ansible controller side can record without pandas.

Default location: ``$MODAK_RESULTS`` or ``~/.local/share/modak/results.sqlite``.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

from modak_runtime import record

from .paths import data_file
from .perf.features import HOST_IMAGE, TARGET_FIGURES
from .errors import ModakError

SHIPPED = Path(__file__).parent / "data" / "measurements.csv"
# the transfer campaign (benchmarks/transfer_campaign.py): sixteen workload families (four also
# in Keras) on the targets it ran on, the data the model transfers from; shipped so that an
# installed MODAK has it
# (gzip-compressed: each row's raw runtime record makes it 6 MB as text, 0.6 MB compressed)
CAMPAIGN = SHIPPED.with_name("transfer-campaign.csv.gz")
SHIPPED_DATASETS = (SHIPPED, CAMPAIGN)

# column -> SQLite type, in the CSV's order: declared once, with the record they come from
COLUMNS: dict[str, str] = {name: sql for name, (sql, _) in record.STORE_COLUMNS.items()}
# the columns a store or CSV older than them gets from each row's record (its losses, its
# ranks)
DERIVED = (*record.LOSS_FIGURES, *record.EFFECT_FIGURES)
# a run's losses where training had got to: SQLite keeps no NaN (it stores NULL, which reads
# as a run that had no loss at all), so a loss that became NaN (a reduced precision's
# overflow, late in a job) is kept as infinite, a result changed beyond any tolerance
DIVERGED = ("final_loss", "end_loss")
_INT = {k for k, v in COLUMNS.items() if v.startswith("INTEGER")}
_REAL = {k for k, v in COLUMNS.items() if v.startswith("REAL")}
parse_fom_lines = record.parse_lines


class StoreError(ModakError):
    pass


def open_csv(path: str | Path, mode: str = "r"):
    """A measurements CSV opened as text (``"r"`` or ``"w"``), gzip-compressed when its
    name ends in ``.gz``.  A compressed file is written without a time stamp in its
    header, so that the same rows give the same bytes (a committed dataset changes only
    when its rows do)."""
    if mode not in ("r", "w"):
        raise ValueError(f"mode {mode!r}: 'r' or 'w'")
    if not str(path).endswith(".gz"):
        return open(path, mode, newline="", encoding="utf-8")
    # (mtime=0: no time stamp in the header; the name it stores is the file's own)
    return io.TextIOWrapper(gzip.GzipFile(path, mode + "b", mtime=0), encoding="utf-8",
                            newline="")


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> int:
    """``rows`` as a measurements CSV (the store's columns, in order; other keys left out),
    through :func:`open_csv`; how many were written."""
    with open_csv(path, "w") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return len(rows)


def default_path() -> Path:
    return data_file("MODAK_RESULTS", "results.sqlite")


# where what a script failed to import may be listed: said wherever MODAK reports a script's
# ModuleNotFoundError (the deploy's failure line, stock's failed trial); in a container, the
# image's packages; with none (runtime none), the Python the job runs, which
# application.pip_packages does not reach (they go into an image's recipe only)
MISSING_MODULE = ("a package the image lacks: list it in application.pip_packages; or a module "
                  "of the user's the run directory lacks: list it in application.files")
MISSING_MODULE_HOST = ("a package the Python the job runs lacks: install it there (no "
                       "container runs the job, and application.pip_packages go into an image "
                       "only); or a module of the user's the run directory lacks: list it in "
                       "application.files")


# how a deploy asks for a new run of the same request: the playbook's variable, and the
# environment variable that an `opera deploy` (tosca/playbooks/job-create.yml) reads
NEW_RUN = "-e modak_new_run=true (to opera deploy: MODAK_NEW_RUN=1 in its environment)"
# what a deploy of the same request does after a run the script failed: it is the same run,
# found as it ended (README, *Deploying*), so a fix outside the request's files (a package
# installed where the job runs, a dataset put in place) needs a new run
RUN_AGAIN = ("a deploy of the same request finds this run as it ended: once it is fixed "
             "outside the request and its files (an edited script or request is a new run by "
             f"itself), add {NEW_RUN}")
# the same, after a run that failed under one of MODAK's knobs: a new run is planned without
# that configuration (which is not offered again)
RUN_AGAIN_WITHOUT_KNOB = ("a deploy of the same request finds this run as it ended: add "
                          f"{NEW_RUN} to plan it again without that configuration")


def missing_module_hint(runtime: Optional[str]) -> str:
    """Where to list what a script could not import, for a plan's ``runtime``."""
    return MISSING_MODULE_HOST if runtime == "none" else MISSING_MODULE


def missing_module(text: str) -> bool:
    """Whether a script's error ``text`` (its type or message) is a module it could not
    import."""
    return "ModuleNotFoundError" in text or "No module named" in text


def script_failure(error: Any, runtime: Optional[str] = None) -> Optional[str]:
    """A run record's ``error`` as the deploy's failure line says it, ``TYPE: MESSAGE``
    (with :func:`missing_module_hint` for an import that failed, for the plan's
    ``runtime``); None where the run did not fail in the script itself (no error, one
    blamed on a knob, one without a message, the runtime's own time cap)."""
    if not isinstance(error, dict) or error.get("knob") or not error.get("message") \
            or error.get("type") == "TimeCap":
        return None
    kind = str(error.get("type") or "error")
    kind = kind[len("builtins."):] if kind.startswith("builtins.") else kind
    message = " ".join(str(error["message"]).split())
    if len(message) > 300:
        message = message[:297] + "..."
    said = f"{kind}: {message}"
    if missing_module(f"{kind} {message}"):
        return (f"{said} ({missing_here(error.get('missing'), message)}"
                f"{missing_module_hint(runtime)})")
    return said


def missing_here(missing: Any, message: str) -> str:
    """What the runtime found the job's Python lacks (``error["missing"]``: module, file and
    line of each import of the run's files, the failed one first), said before the hint;
    empty where it found nothing but the module the ``message`` names."""
    try:
        said = [f"{m!r} ({f} line {int(n)})" for m, f, n in missing or []]
        alone = len(said) == 1 and repr(str(missing[0][0])) in message
    except (TypeError, ValueError, IndexError):
        return ""
    if not said or alone:
        return ""
    return (f"the run's files import {len(said)} module{'s' if len(said) > 1 else ''} that "
            f"the job's Python lacks: {', '.join(said)}; ")


def kept(rec: dict[str, Any]) -> bool:
    """Whether the store keeps a figure-of-merit record: a run that measured a step time,
    or one that failed (kept so that its configuration is not offered there again), or one
    still compiling (:func:`still_compiling`).  Any other trial stopped at its time cap
    before it measured a step time (``error`` type ``TimeCap``) is not: its configuration
    did not fail, and there is nothing to learn from."""
    if rec.get("status") == "failed" or still_compiling(rec) is not None:
        return True
    return bool(((rec.get("metrics") or {}).get("s_per_step") or 0) > 0)


def still_compiling(rec: dict[str, Any]) -> Optional[float]:
    """How long a compiled trial's training ran before its time cap stopped it while it
    had measured no step time (on the runtime's clock, its start-up left out: the
    compiler's warm-up takes at least that), or None for any other record.  Kept in the
    store (status ``capped``, no step time, never fitted on: ``perf.fit.training_frame``),
    so that the next plan does not count on a shorter compilation of this workload there
    and the next search does not cap it as short again: a user's diffusion MLP was
    capped compiling at 9.5 s in one deploy, and without it the next deploy's search
    would give the same compilation the same share."""
    m, err = rec.get("metrics") or {}, rec.get("error") or {}
    compiler = str((rec.get("config") or {}).get("compiler") or "off")
    if rec.get("status") != "capped" or err.get("type") != "TimeCap" or compiler == "off" \
            or (m.get("s_per_step") or 0) > 0:
        return None
    try:
        ran = float(m["wall_s"]) - float(m["startup_s"])
    except (KeyError, TypeError, ValueError):  # (stopped before its training began)
        return None
    return ran if 0 < ran < math.inf else None


def job_elapsed(text: str, run_id: Optional[str] = None) -> Optional[float]:
    """The job's own clock around its launch in a job's output: ``elapsed_s`` of its job
    line (``{"modak": "job", ...}``, of run ``run_id`` where given), which the job script
    prints after the runtime's record; None where there is none after the last record (a
    job killed before its end: a line the script printed is not it) or it is not a
    non-negative number."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and parse_fom_lines(line):
            return None
        if not line.startswith('{"modak": "job",'):
            continue
        try:
            rec = json.loads(line)
            value = float(rec.get("elapsed_s"))
        except (TypeError, ValueError, AttributeError):
            return None
        if run_id is not None and rec.get("run_id") != run_id:
            return None
        return value if math.isfinite(value) and value >= 0 else None
    return None


def row_from_fom(rec: dict[str, Any], *, source: str, run_id: Optional[str] = None,
                 repeat: Optional[int] = None, image: Optional[str] = None,
                 target: Optional[str] = None, accelerator: Optional[str] = None,
                 microarchitecture: Optional[str] = None, cores: Optional[int] = None,
                 probe: Optional[dict[str, Any]] = None,
                 job_s: Optional[float] = None, path_s: Optional[float] = None) -> dict:
    """One store row from a figure-of-merit record printed by the runtime (``modak_runtime``).

    ``microarchitecture`` and ``cores`` name the target as the planner knew it (a run inside
    a container may not see them); they replace what the run reported of its host.
    ``probe``: the target's probe record (``modak_runtime.probe``), whose figures the
    performance model describes the target by.  ``job_s``: the job's clock around the
    launch of the one run it made (:func:`job_elapsed`); ``path_s``: what the deploy spent
    around that job up to its record (a search's trial's tasks).
    """
    try:
        row = record.flatten(rec)
    except (AttributeError, TypeError, ValueError) as exc:
        raise StoreError(f"not a figure-of-merit record MODAK can read ({exc})") from None
    if not kept(rec):
        raise StoreError("a run that did not fail measured no step time (fewer than 2 steps?)")
    shape = rec.get("fingerprint", {}).get("input_shape") or []
    row.update(recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               source=source, run_id=run_id, repeat=repeat, image=image or HOST_IMAGE,
               target=target, accelerator=accelerator,
               image_size=shape[-2] if len(shape) >= 3 else None, job_s=job_s,
               path_s=path_s,
               raw=json.dumps(rec, sort_keys=True))
    if microarchitecture:
        row["microarchitecture"] = microarchitecture
    if cores:
        row["cores"] = cores
    if row["threads"] is None:
        row["threads"] = row["cores"]
    for key in TARGET_FIGURES:
        value = (probe or {}).get(key)
        row[key] = float(value) if value else None
    return row


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
            self._migrate(con)
        return con

    def _migrate(self, con: sqlite3.Connection) -> None:
        """Bring a store of an earlier MODAK up to these columns (in one transaction)."""
        info = {r[1]: r for r in con.execute("PRAGMA table_info(measurements)")}
        missing = [c for c in COLUMNS if c not in info]
        relax = [c for c in COLUMNS if c in info and info[c][3] and "NOT NULL" not in COLUMNS[c]]
        if not missing and not relax:
            return
        con.execute("BEGIN IMMEDIATE")
        try:
            if relax:  # SQLite cannot drop NOT NULL: copy into a table of the new shape
                cols = ", ".join(f'"{k}" {v}' for k, v in COLUMNS.items())
                kept = [c for c in COLUMNS if c in info or c == "status"]
                values = ", ".join(f'"{c}"' if c in info else "'ok'" for c in kept)
                names = ", ".join(f'"{c}"' for c in kept)
                con.execute(f"CREATE TABLE measurements_new (id INTEGER PRIMARY KEY, {cols})")
                con.execute(f"INSERT INTO measurements_new (id, {names}) "
                            f"SELECT id, {values} FROM measurements")
                con.execute("DROP TABLE measurements")
                con.execute("ALTER TABLE measurements_new RENAME TO measurements")
            else:
                for c in missing:
                    default = " DEFAULT 'ok'" if c == "status" else ""
                    sql = COLUMNS[c].replace(" NOT NULL", "")
                    con.execute(f'ALTER TABLE measurements ADD COLUMN "{c}" {sql}{default}')
            if "status" in missing:
                con.execute("UPDATE measurements SET status = 'ok' WHERE status IS NULL")
            for c in DERIVED:  # (from each run's record, as the CSVs' are read)
                if c in missing:
                    con.executemany(f'UPDATE measurements SET "{c}" = ? WHERE id = ?', [
                        (v, i) for i, raw in con.execute("SELECT id, raw FROM measurements")
                        if (v := _from_record(raw, c)) is not None])
            con.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            con.execute("ROLLBACK")
            con.close()
            raise StoreError(f"{self.path}: cannot bring the results store up to date "
                             f"({exc})") from None

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
                if key in DIVERGED and value != value:
                    value = math.inf
            out[key] = value
        for c in DERIVED:  # (a CSV written before the column was)
            if out[c] is None and out["raw"]:
                out[c] = _from_record(out["raw"], c)
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

    def trial_clocks(self, target: str, limit: int = 50) -> list[dict[str, Any]]:
        """The latest search trials at ``target`` that kept their job's clock (``job_s``)
        and did not fail, newest first (at most ``limit``): their workload, image,
        ``job_s`` and record (``search.measured_overhead`` reads them)."""
        if not self.path.exists():
            return []
        con = self._connect(create=False)
        try:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(
                "SELECT workload, image, job_s, path_s, raw FROM measurements "
                "WHERE source = 'autotune' "
                "AND target = ? AND job_s IS NOT NULL AND status != 'failed' "
                "ORDER BY id DESC LIMIT ?", (target, limit))]
        finally:
            con.close()

    def import_csv(self, path: str | Path) -> int:
        with open_csv(path) as f:
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

    def latest(self) -> Optional[str]:
        """When its newest measurement was recorded (ISO 8601, UTC, to the second); None
        for an empty store or none yet."""
        if not self.path.exists():
            return None
        con = self._connect(create=False)
        try:
            return con.execute("SELECT max(recorded_at) FROM measurements").fetchone()[0]
        finally:
            con.close()

    def export_csv(self, path: str | Path) -> int:
        return write_csv(path, self.rows())


def load_frame(store: ResultsStore | None = None, include_shipped: bool = True,
               extra: Iterable[str | Path] = ()):
    """All measurements as a pandas DataFrame: the shipped datasets (``SHIPPED_DATASETS``),
    ``extra`` CSV files (a campaign's, as ``export_csv`` writes them; a shipped one named
    again is read once) and the store."""
    import pandas as pd

    frames = []
    shipped = [p for p in SHIPPED_DATASETS if include_shipped and p.exists()]
    extra = [p for p in extra if not any(_same_file(p, s) for s in shipped)]
    for path in [*shipped, *extra]:
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: cannot read measurements ({exc})") from None
        for c in DERIVED:  # (written before the column was)
            if c not in frame and "raw" in frame:
                frame[c] = frame["raw"].map(lambda raw, c=c: _from_record(raw, c))
        frames.append(frame)
    if store is not None and store.path.exists():
        frames.append(pd.DataFrame(store.rows()).drop(columns=["id"]))
    if not frames:
        raise StoreError("no measurements: the store is empty and no dataset is shipped")
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise StoreError("no measurements: the store and the shipped dataset are empty")
    return df


def _from_record(raw: Any, column: str) -> Any:
    """A stored record's ``end_loss`` (``record.end_loss``) or ``start_loss``
    (``record.start_loss``) from its losses, or its ``ranks`` or ``launcher`` from its
    effect: for rows recorded before the store kept them."""
    if column in record.EFFECT_FIGURES:
        return record.effect_figure(raw, column)
    try:
        m = json.loads(raw).get("metrics") or {}
    except (TypeError, ValueError, AttributeError):
        return None
    return record.loss_figures(m)[column]


def _same_file(a: str | Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve() or Path(a).samefile(b)
    except OSError:
        return False
