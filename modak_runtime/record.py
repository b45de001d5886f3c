"""The figure-of-merit record: one typed, versioned declaration.

The runtime writes it (one JSON line, ``{"modak": "fom", "schema": 2, ...}``); the results
store (``modak_lib.results``) derives its columns from :data:`STORE_COLUMNS`; the
performance model reads those columns.  No other file lists these fields.

A record says what was asked (``config``), what happened (``status``, ``effect``,
``knobs``), how fast (``metrics``), what the workload is (``fingerprint``) and where it ran
(``host``).  Status ``ok`` is a complete run, ``capped`` a run stopped by the trial cap
(``MODAK_MAX_STEPS``, or its time cap ``MODAK_MAX_SECONDS``; complete as a measurement when
it measured a step time, else ``error`` says so, type ``TimeCap``), ``failed`` a run that
raised or exited non-zero (``error`` says why, and which knob it is blamed on, if any).
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

SCHEMA = 2
FOM_KEY = "fom"
FLOP_KINDS = ("conv", "linear", "attention", "recurrent", "norm", "other")
STATUSES = ("ok", "capped", "failed")


@dataclass
class Config:
    """The configuration that was asked for, in the planner's words."""
    compiler: str = "off"           # off | torch.compile:MODE | xla
    threads: Optional[int] = None
    allocator: str = "glibc"
    precision: str = "fp32"
    channels_last: bool = False
    onednn: bool = True


@dataclass
class Fingerprint:
    """What the workload is, measured on one training step."""
    id: Optional[str] = None
    trainable_parameters: Optional[int] = None
    flops_per_step: Optional[float] = None   # forward + backward, counted on one step
    # tensor elements the operations of one step wrote (forward, backward, update; views
    # excluded): the step's memory traffic, which FLOPs alone do not show
    elements_per_step: Optional[float] = None
    # operations one step dispatched (forward, backward, update; views and casts excluded):
    # each pays the framework's per-operation overhead, which FLOPs and traffic do not show
    ops_per_step: Optional[int] = None
    # time steps one step's recurrent layers (nn.RNN, nn.LSTM, nn.GRU) ran in sequence in its
    # forward: each call's sequence length times its layers, summed.  A fused layer (cuDNN's,
    # oneDNN's) is one dispatched operation whatever its length, but its steps run one after
    # the other, each a few kernels on a GPU
    recurrent_steps: Optional[int] = None
    # of ``ops_per_step``, the calls from Python that dispatched them (a torch function, a
    # tensor's method, ``backward``: one call, one or many operations).  An operation
    # Python calls pays the interpreter's overhead too; those the library dispatches in its
    # own loop (a fused recurrent layer's time steps, the autograd engine's backward) less
    python_ops_per_step: Optional[int] = None
    # calls of modules (``nn.Module.__call__``: its hooks and the Python of its forward), a
    # container's and those it calls alike: a loop of cells calls one a time step
    module_calls_per_step: Optional[int] = None
    # micro-batches of ``batch_size`` the step trained on (gradient accumulation: the
    # optimizer steps once every so many): the fewer of its backward passes that reached
    # the optimizer's parameters and its trained modules' calls; None where it ran none
    # through ``torch.autograd.backward`` (its own ``torch.autograd.grad``; Keras)
    micro_batches: Optional[int] = None
    flop_share: dict[str, float] = field(default_factory=dict)  # FLOP_KINDS -> share (forward)
    # the share of the forward FLOPs in grouped convolutions (depthwise ones: a
    # MobileNet's, a ConvNeXt's), part of conv's: few FLOPs for the traffic they make
    grouped_share: Optional[float] = None
    batch_size: Optional[int] = None
    input_shape: Optional[list[int]] = None
    dtype: Optional[str] = None
    method: Optional[str] = None             # how the FLOPs were counted


@dataclass
class Metrics:
    steps: int = 0
    warmup_steps: int = 0
    timed_steps: int = 0
    s_per_step: Optional[float] = None       # mean of the steady-state steps
    s_per_step_median: Optional[float] = None
    steps_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    warmup_s: Optional[float] = None         # excess time of the warm-up steps (compilation)
    # a later one-off (a recompilation), in the warm-up, not the step time
    # (``session.one_off_stall``)
    stall_s: Optional[float] = None
    startup_s: Optional[float] = None        # runtime start -> training starts (imports, data)
    wall_s: Optional[float] = None
    peak_rss_mb: Optional[float] = None
    final_loss: Optional[float] = None
    # the mean of the losses sampled over the last half of the steps (:func:`end_loss`):
    # where the run's training had got to, less one batch's noise than ``final_loss``
    end_loss: Optional[float] = None
    # the first loss sampled (:func:`start_loss`): with ``end_loss``, how far the run
    # lowered its loss
    start_loss: Optional[float] = None
    losses: list[list[float]] = field(default_factory=list)  # [step, loss], sampled
    accuracy: Optional[float] = None
    # the optimizer steps one epoch makes, where the run shows it: counted over a whole pass
    # over the training data loader (or a Keras loop's tf.data dataset), else its batches
    # over the step's micro-batches, or Keras ``fit``'s steps per epoch
    # (``effect["steps_per_epoch"]`` says which); None for a loop over no loader of known
    # length.  A job stated in epochs is that many steps
    steps_per_epoch: Optional[int] = None


@dataclass
class Record:
    workload: str
    framework: str
    status: str = "ok"
    workload_key: Optional[str] = None
    framework_version: Optional[str] = None
    script: Optional[str] = None
    run_id: Optional[str] = None
    config: Config = field(default_factory=Config)
    # knob -> how it was applied / why it could not be
    applied: dict[str, str] = field(default_factory=dict)
    not_applied: dict[str, str] = field(default_factory=dict)
    # what was really in effect: autocast dtype seen by the matmuls, compiled, threads, ...
    effect: dict[str, Any] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    host: dict[str, Any] = field(default_factory=dict)
    # {type, message, knob}; after a failed import also missing: [[module, file, line], ...]
    error: Optional[dict[str, Any]] = None

    def to_json(self) -> str:
        return json.dumps({"modak": FOM_KEY, "schema": SCHEMA, **asdict(self)},
                          sort_keys=True, default=str)


def emit(record: Record, stream=None) -> None:
    stream = stream or sys.stdout
    stream.write("\n" + record.to_json() + "\n")
    stream.flush()


# ---------------------------------------------------------------------------
# the store's columns: name -> (SQLite type, where the value is in a record)
# A path of None is a column the recorder fills (where and when it was recorded).
STORE_COLUMNS: dict[str, tuple[str, Optional[str]]] = {
    "recorded_at": ("TEXT NOT NULL", None), "source": ("TEXT NOT NULL", None),
    "run_id": ("TEXT", None), "repeat": ("INTEGER", None),
    "workload": ("TEXT NOT NULL", "workload"), "workload_key": ("TEXT", "workload_key"),
    "fingerprint": ("TEXT", "fingerprint.id"),
    "framework": ("TEXT NOT NULL", "framework"),
    "framework_version": ("TEXT", "framework_version"),
    "trainable_parameters": ("INTEGER", "fingerprint.trainable_parameters"),
    "flops_per_step": ("REAL", "fingerprint.flops_per_step"),
    "elements_per_step": ("REAL", "fingerprint.elements_per_step"),
    "ops_per_step": ("INTEGER", "fingerprint.ops_per_step"),
    "recurrent_steps": ("INTEGER", "fingerprint.recurrent_steps"),
    "python_ops_per_step": ("INTEGER", "fingerprint.python_ops_per_step"),
    "module_calls_per_step": ("INTEGER", "fingerprint.module_calls_per_step"),
    "micro_batches": ("INTEGER", "fingerprint.micro_batches"),
    **{f"flops_{k}": ("REAL", f"fingerprint.flop_share.{k}") for k in FLOP_KINDS},
    "flops_grouped": ("REAL", "fingerprint.grouped_share"),
    "batch_size": ("INTEGER", "fingerprint.batch_size"),
    "input_shape": ("TEXT", "fingerprint.input_shape"),
    "image_size": ("INTEGER", None),
    "compiler": ("TEXT NOT NULL", "config.compiler"), "threads": ("INTEGER", "config.threads"),
    # the training ranks the run was one of (rank 0's record: None for a single process) and
    # what started them (torchrun, srun, mpirun; None where the script started its own)
    "ranks": ("INTEGER", "effect.ranks"), "launcher": ("TEXT", "effect.launcher"),
    "allocator": ("TEXT NOT NULL", "config.allocator"),
    "precision": ("TEXT NOT NULL", "config.precision"),
    "channels_last": ("INTEGER NOT NULL", "config.channels_last"),
    "onednn": ("INTEGER NOT NULL", "config.onednn"),
    "status": ("TEXT NOT NULL", "status"), "not_applied": ("TEXT", "not_applied"),
    "failed_knob": ("TEXT", "error.knob"), "error": ("TEXT", "error.message"),
    "image": ("TEXT", None), "target": ("TEXT", None), "cpu_model": ("TEXT", "host.cpu_model"),
    "microarchitecture": ("TEXT", "host.microarchitecture"), "cores": ("INTEGER", "host.cores"),
    "boot_id": ("TEXT", "host.boot_id"),
    "accelerator": ("TEXT", None),
    # the target's measured figures (its probe: modak_runtime.probe), filled by the recorder
    "gflops_fp32": ("REAL", None), "gflops_bf16": ("REAL", None),
    "bandwidth_gbs": ("REAL", None), "op_us": ("REAL", None),
    "steps": ("INTEGER", "metrics.steps"),
    "steps_per_epoch": ("INTEGER", "metrics.steps_per_epoch"),
    "s_per_step": ("REAL", "metrics.s_per_step"), "steps_per_s": ("REAL", "metrics.steps_per_s"),
    "samples_per_s": ("REAL", "metrics.samples_per_s"), "compile_s": ("REAL", "metrics.warmup_s"),
    "peak_rss_mb": ("REAL", "metrics.peak_rss_mb"), "final_loss": ("REAL", "metrics.final_loss"),
    "end_loss": ("REAL", "metrics.end_loss"), "start_loss": ("REAL", "metrics.start_loss"),
    "accuracy": ("REAL", "metrics.accuracy"),
    # the job's own clock around the launch (its job line's elapsed_s, through the job path:
    # the container's start, the runtime's start-up), filled by the recorder where the
    # job ran this one record: what a search's trial costs there besides its training
    "job_s": ("REAL", None),
    # what the deploy spent around that job up to its record, on the controller's clock (a
    # search's trial: its plan, staging, submission, wait and fetch), filled by the recorder
    # where it is told when the trial started: the rest of what a trial costs a user there
    "path_s": ("REAL", None),
    "raw": ("TEXT NOT NULL", None),
}


def end_loss(losses: Any, steps: Any) -> Optional[float]:
    """The mean of the losses sampled (``[step, loss]`` pairs) after the first half of
    ``steps`` steps: where a run's training had got to, averaged over the second half of
    it.  One step's loss is one batch's, and a loss that blew up mid-trial and came back
    is seen.  Two runs of the same steps average over the same steps.  None where no loss
    was sampled there."""
    try:
        n = int(steps or 0)
        tail = [float(v) for s, v in losses or () if n and 2 * float(s) > n]
    except (TypeError, ValueError):
        return None
    if not tail:
        return None
    return sum(tail) / len(tail)


def losses_after(losses: Any, steps: int) -> Optional[tuple[float, float]]:
    """A run's last loss sampled in the second half of its first ``steps`` steps and the
    mean over that half (``final_loss``, ``end_loss`` as they stood then), from its sampled
    ``[step, loss]`` pairs: what a longer run is compared by with a shorter one (the search's
    trials).  None where no loss was sampled in that half."""
    try:
        tail = sorted((int(s), float(v)) for s, v in losses or ()
                      if steps < 2 * int(s) <= 2 * steps)
    except (TypeError, ValueError):
        return None
    if not tail:
        return None
    return tail[-1][1], sum(loss for _step, loss in tail) / len(tail)


def start_loss(losses: Any) -> Optional[float]:
    """The loss of the first step sampled (``[step, loss]`` pairs): where a run's training
    started from.  With :func:`end_loss`, how far the run lowered its loss: a trial whose
    loss went near 0 is judged against stock's by that, not by its last digits
    (``modak_lib.perf.search.changes_result``).  None where no loss was sampled."""
    try:
        first = min(((float(s), float(v)) for s, v in losses or ()), default=None)
    except (TypeError, ValueError):
        return None
    return first[1] if first is not None and math.isfinite(first[1]) else None


# the store's columns from a record's ``effect`` that a record printed before the store kept
# them still has (:func:`effect_figure`)
EFFECT_FIGURES = ("ranks", "launcher")


def effect_figure(raw: Any, name: str) -> Any:
    """One of :data:`EFFECT_FIGURES` from a record as stored (its JSON text), or None, read
    at its column's path as :func:`flatten` reads it (most runs, single processes, name
    none: :func:`stored_value`)."""
    return stored_value(raw, STORE_COLUMNS[name][1])


def stored_value(raw: Any, path: str) -> Any:
    """The value at the dotted ``path`` of a record as stored (its JSON text), as
    :func:`flatten` reads it, or None; the text is parsed only where it names the path's
    last key (most records do not)."""
    if not isinstance(raw, str) or '"%s"' % path.rsplit(".", 1)[-1] not in raw:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return _get(rec, path) if isinstance(rec, dict) else None


# the loss figures a record's metrics carry that :func:`loss_figures` can derive from its
# losses (a runtime before them printed none)
LOSS_FIGURES = ("end_loss", "start_loss")


def loss_figures(metrics: Any) -> dict[str, Optional[float]]:
    """A record's ``end_loss`` and ``start_loss``: as its runtime printed them, else (a
    runtime before them) from its sampled losses."""
    m = metrics if isinstance(metrics, dict) else {}
    out = {name: m.get(name) for name in LOSS_FIGURES}
    if out["end_loss"] is None:
        out["end_loss"] = end_loss(m.get("losses"), m.get("steps"))
    if out["start_loss"] is None:
        out["start_loss"] = start_loss(m.get("losses"))
    return out


def _get(rec: dict[str, Any], path: str) -> Any:
    value: Any = rec
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    if isinstance(value, dict):  # not_applied: the knob names
        return ",".join(sorted(value)) or None
    if isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def flatten(rec: dict[str, Any]) -> dict[str, Any]:
    """A record (as parsed JSON) -> the store's columns that come from it."""
    if rec.get("schema") != SCHEMA:
        raise ValueError(f"figure-of-merit schema {rec.get('schema')!r}, this MODAK reads {SCHEMA}")
    if rec.get("status") not in STATUSES:
        raise ValueError(f"status {rec.get('status')!r} is not one of {STATUSES}")
    row = {name: _get(rec, spec[1]) for name, spec in STORE_COLUMNS.items() if spec[1]}
    row.update(loss_figures(rec.get("metrics")))
    return row


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The figure-of-merit records in a job's output, in order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"modak"' in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("modak") == FOM_KEY:
                out.append(rec)
    return out
