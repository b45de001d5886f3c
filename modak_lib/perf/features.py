"""The performance model's inputs: one function, used by fitting and by planning.

A row (a measurement from the store, or a candidate the planner asks about) is turned into
features that describe **what** runs and **where**, never **which** by name:

- the workload, by its measured fingerprint: trainable parameters, FLOPs per sample (of
  every micro-batch of a step that accumulates gradients), the batch, and the share of its
  forward FLOPs by layer kind (convolution, dense, attention, recurrent, normalisation; and
  of the convolutions', the grouped ones: depthwise);
- the target, by what its probe measured (``modak probe``): fp32 matrix GFLOP/s, the bf16
  to fp32 ratio (about 4 with native bf16 instructions, 1/50 without), memory bandwidth,
  and the threads the job gets;
- their meeting: the step's FLOPs over the target's GFLOP/s (a compute-bound time) and its
  parameter traffic over the bandwidth (a memory-bound time);
- the configuration: compiler, allocator, precision, channels-last, oneDNN, threads.

The model does not learn seconds from nothing: it learns how far a step is from its
**baseline** (:func:`baseline`), a roofline-like time at the rates the target's probe
measured: the step's arithmetic at its GFLOP/s, with the precision and the threads the
configuration gives it, plus the tensors the step writes (its fingerprint's elements per
step) written and read back once at the measured bandwidth, plus its normalisation layers'
elements at the cost of a normalisation's passes over them (:data:`NORM_BYTES_PER_ELEMENT`:
a BatchNorm's forward and backward in training pass over its tensor several times, slower
than its traffic at the measured bandwidth: measured, not fitted), plus its parameters'
traffic (weights, gradients, the optimizer's update) at that bandwidth, plus the operations
the step dispatches at a fixed cost each: on a GPU the time of one small operation its probe
measured (its launch overhead: a small step on a fast GPU is mostly that), on a CPU
eager PyTorch's dispatch (:func:`cpu_dispatch_us`: an operation, more for one Python called,
and each module call; a step of thousands of small operations, a recurrent cell stepped in
Python, is mostly that); and on a GPU the time steps of its fused
recurrent layers, a few kernels each in sequence (:data:`RECURRENT_KERNELS`). A target
whose bf16 rate is 1/50 of its fp32 rate (no native bf16) makes the arithmetic of a bf16
configuration 50x slower at baseline before any data says so, but not its memory traffic: a
step that is mostly traffic (embeddings, small layers) loses far less; a job given one
thread of two gets half the arithmetic rate. What the data must teach is only the
remaining efficiency: of a layer kind, of a compiler, of a small batch.

So a workload never measured on a target, or a target never seen, is described by numbers
the model has seen the like of.  Standard library only: the planner evaluates an exported
linear model with these features without pandas or scikit-learn.
"""
from __future__ import annotations

import math
from typing import Any, Optional

FEATURE_VERSION = 12  # a saved model of another version is refitted (fit.load)

CONFIG_KEYS = ["compiler", "threads", "allocator", "precision", "channels_last", "onednn"]
# the forward FLOPs' shares by layer kind (+ other = the rest), and ``grouped``: the part of
# conv's in grouped (depthwise) convolutions, which make much traffic for few FLOPs
SHARES = ["conv", "linear", "attention", "recurrent", "norm", "grouped"]
MATMUL = ["conv", "linear", "attention", "recurrent"]  # the shares reduced precision speeds up
CATEGORICAL = ["framework", "compiler", "allocator", "precision", "channels_last", "onednn",
               "accelerator"]
NUMERIC = ["log_params", "log_flops_per_sample", "log_batch",
           *[f"share_{k}" for k in SHARES],
           "log_threads", "thread_share", "log_gflops", "log_bf16_ratio", "log_bandwidth",
           "log_compute_s", "log_memory_s"]
# the bounded numbers a knob's effect is allowed to depend on in the linear model
CROSSED = [*[f"share_{k}" for k in SHARES], "thread_share", "log_bf16_ratio"]
# op_us: the time of one small operation, host call to device end (a GPU's probe measures
# it; a CPU's leaves it out: there the operations' overhead is not a term of the baseline)
TARGET_FIGURES = ("gflops_fp32", "gflops_bf16", "bandwidth_gbs", "op_us")
# the workload's figures from its fingerprint (besides its parameters and batch)
WORKLOAD_FIGURES = ("flops_per_step", "elements_per_step", "ops_per_step", "recurrent_steps",
                    "python_ops_per_step", "module_calls_per_step", "micro_batches",
                    *(f"flops_{k}" for k in SHARES))
BYTES_PER_PARAMETER = 16.0  # weights read twice, gradient written, update read+written
BYTES_PER_ELEMENT = 8.0  # an fp32 element a step's operation writes, and reads back once
# a normalisation layer's output element in training (forward and backward), in bytes at the
# target's measured bandwidth: benchmarks/norm_cost.py measures BatchNorm at 80-150 (medians,
# one and two threads, this project's CPU; LayerNorm 40-60, an activation 40-80). Not
# memory-bound: it runs slower than that traffic and with the threads, so the job's share
# of the cores scales it like the arithmetic. Its elements are not counted apart: the
# fingerprint counts NORM_FLOPS_PER_ELEMENT FLOPs an element of a normalisation's forward,
# and a step's FLOPs are STEP_OVER_FORWARD times its forward's (the backward twice:
# PyTorch's formulas and Keras's count alike)
NORM_BYTES_PER_ELEMENT = 100.0
NORM_FLOPS_PER_ELEMENT = 4.0
STEP_OVER_FORWARD = 3.0
# the cost of one operation a step dispatches on a target whose probe does not measure it (a
# CPU's): eager PyTorch's dispatch of an operation and its gradient, not measured but fitted:
# of 5, 10, 15 and 30 us, 10 gave the held-out families the lowest error (see the README).
# That is the cost where the fingerprint does not say where the operations came from (an
# older runtime's record); where it does, an operation is CPU_KERNEL_US, one Python called
# CPU_CALL_US more (the interpreter, the arguments' parsing), and each call of a module
# CPU_MODULE_US (``nn.Module.__call__``, its hooks, the Python of its forward): a layer
# that loops over its time steps in the library (``nn.GRU`` on a CPU: 4266 operations a
# step from 29 calls) costs less per operation than a loop of cells in Python (1897 from 74,
# and 51 module calls). Fitted likewise (the README's *Where a step's operations come from*:
# a dozen settings of 4-7, 0-40 and 0-100 us gave 18.5-18.9%); the probe does not
# measure them
CPU_OP_US = 10.0
CPU_KERNEL_US = 5.0
CPU_CALL_US = 20.0
CPU_MODULE_US = 50.0
# the kernels a GPU runs in sequence for each time step of each layer of a fused recurrent
# layer (cuDNN's LSTM or GRU: the hidden state's matrix product and the gates' element-wise
# kernel, in the forward and again in the backward), each at the probe's time of one small
# operation: the step's time steps are not in its dispatched operations (one call runs them
# all) and not in its FLOPs. Of 2, 4 and 8 kernels, 2 and 4 gave the held-out families the
# lowest error (see the README); 4 is the count. A CPU runs the steps in the library's loop
# (oneDNN's LSTM) or dispatches each step's operations, which ``ops_per_step`` counts
RECURRENT_KERNELS = 4.0
# the time of one time step of one recurrent layer of a Keras model on a CPU, beyond its
# FLOPs: Keras runs the steps as a loop of its backend's graph (TensorFlow's while_loop), each
# step's operations one after the other, forward and backward, where PyTorch's layers run
# them in the library's own loop.  Measured, not fitted: benchmarks/recurrent_step_cost.py
# on this project's CPU (2 cores), a layer of 8 units: LSTM 185, GRU 213, SimpleRNN 116 us
# (medians of 3 rounds); at 256 units 470, 398 and 144 beyond the FLOPs at the probe's rate
KERAS_RECURRENT_STEP_US = 200.0
# a configuration's knobs at their framework defaults (and its threads: all cores)
STOCK = {"compiler": "off", "allocator": "glibc", "precision": "fp32", "channels_last": 0,
         "onednn": 1}
# the knobs the runtime may refuse (as it names them), each switched on in a configuration
# row when its value is not the stock one (threads: when they are not all cores)
KNOBS = ("compiler", "precision", "allocator", "channels_last", "onednn", "threads")
# where a run ran: the image (``HOST_IMAGE``: outside any container) and the target (its
# CPU, cores and accelerator, none for a CPU node)
PLACE_KEYS = ("image", "microarchitecture", "cores", "accelerator")
HOST_IMAGE = "host"


def machine(row: dict[str, Any]) -> str:
    """Which machine a row ran on, as the model knows machines: its target's measured
    figures (:data:`TARGET_FIGURES`: the campaign describes each machine by the median of
    its probes, a deploy records its target's cached probe), each to 6 significant digits
    ("-" where not measured).  Two machines of one nominal target (the same CPU and cores)
    differ by these."""
    out = []
    for k in TARGET_FIGURES:
        v = _float(row.get(k))
        out.append(f"{v:.6g}" if v == v else "-")
    return "|".join(out)


def knob_value(row: dict[str, Any], knob: str) -> Optional[str]:
    """The value a configuration row sets ``knob`` to, None when it leaves it at stock."""
    if knob == "threads":
        threads, cores = _float(row.get("threads")), _float(row.get("cores"))
        return (None if not threads > 0 or not cores > 0 or threads == cores
                else str(int(threads)))
    value = _text(row.get(knob), str(STOCK[knob]))
    if knob in ("channels_last", "onednn"):
        value = _flag(row.get(knob), STOCK[knob])
    return None if value == str(STOCK[knob]) else value


def place(row: dict[str, Any]) -> dict[str, Any]:
    """:data:`PLACE_KEYS` of a row, as one place compares with another (:func:`same_place`)."""
    cores = _float(row.get("cores"))
    return {"image": _text(row.get("image"), HOST_IMAGE),
            "microarchitecture": _text(row.get("microarchitecture"), "unknown"),
            "cores": None if cores != cores else cores,
            "accelerator": _text(row.get("accelerator"), "") or None}


def same_image(recorded: Optional[str], here: Optional[str], host_for_all=True) -> bool:
    """Whether a run recorded in image ``recorded`` answers for one in ``here``: the same
    image; with ``host_for_all``, a run outside any image stands for every image (a
    measurement: the shipped campaigns ran on the host).  None (not recorded) matches any."""
    return recorded is None or recorded == here or (host_for_all and recorded == HOST_IMAGE)


def same_place(recorded: dict[str, Any], here: dict[str, Any], host_for_all=True) -> bool:
    """Whether what was recorded at ``recorded`` (a :func:`place`) answers for a run at
    ``here``: the same target, and the same image (:func:`same_image`).  A key ``recorded``
    lacks (a record of an older MODAK) matches any."""
    for k in PLACE_KEYS:
        if k not in recorded:
            continue
        mine, theirs = recorded[k], here.get(k)
        if k == "image":
            if not same_image(mine, theirs, host_for_all):
                return False
        elif k == "cores":
            if mine is not None and theirs is not None and float(mine) != float(theirs):
                return False
        elif (mine or None) != (theirs or None):
            return False
    return True


def _float(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def whole(v: Any) -> Any:
    """A float that is a whole number as an int (20000.0 -> 20000: a pandas column with a
    gap holds floats), anything else as it is: runs are matched by such values' text."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _log(v: Any) -> float:
    f = _float(v)
    return math.log(f) if f > 0 else math.nan


def _text(v: Any, default: str) -> str:
    return default if v is None or (isinstance(v, float) and v != v) else str(v)


def _flag(v: Any, default: int) -> str:
    f = _float(v)
    return str(default if f != f else int(f))


def missing(row: dict[str, Any]) -> list[str]:
    """What a row lacks for the model to speak about it (empty: nothing)."""
    out = []
    if not _float(row.get("flops_per_step")) > 0:
        out.append("the workload's FLOPs per step (its fingerprint: it has not run yet)")
    if not _float(row.get("trainable_parameters")) > 0:
        out.append("the workload's parameter count")
    if not _float(row.get("gflops_fp32")) > 0 or not _float(row.get("bandwidth_gbs")) > 0:
        out.append("the target's measured GFLOP/s and bandwidth (run `modak probe`)")
    return out


def features(row: dict[str, Any]) -> tuple[list[str], list[float]]:
    """The categorical and numeric inputs of one row, in CATEGORICAL and NUMERIC order."""
    cats = [_text(row.get("framework"), "none"), _text(row.get("compiler"), "off"),
            _text(row.get("allocator"), "glibc"), _text(row.get("precision"), "fp32"),
            _flag(row.get("channels_last"), 0), _flag(row.get("onednn"), 1),
            _text(row.get("accelerator"), "none")]
    flops, batch = _float(row.get("flops_per_step")), _float(row.get("batch_size"))
    # a step that accumulates gradients over micro-batches of ``batch`` trains on each
    micro = _float(row.get("micro_batches"))
    samples = batch * (micro if micro >= 1 else 1.0)
    params = _float(row.get("trainable_parameters"))
    threads, cores = _float(row.get("threads")), _float(row.get("cores"))
    gflops, bf16 = _float(row.get("gflops_fp32")), _float(row.get("gflops_bf16"))
    bandwidth = _float(row.get("bandwidth_gbs"))
    shares = [_float(row.get(f"flops_{k}")) for k in SHARES]
    nums = [_log(params), _log(flops / samples if samples > 0 else math.nan), _log(batch),
            *[0.0 if s != s else s for s in shares],
            _log(threads), threads / cores if cores > 0 else math.nan, _log(gflops),
            _log(bf16 / gflops) if gflops > 0 and bf16 > 0 else 0.0, _log(bandwidth),
            _log(flops / (gflops * 1e9)) if gflops > 0 else math.nan,
            _log(params * BYTES_PER_PARAMETER / (bandwidth * 1e9)) if bandwidth > 0
            else math.nan]
    return cats, nums


def as_stock(cats: list[str], nums: list[float]) -> tuple[list[str], list[float]]:
    """:func:`features` of the same workload, batch and target under the stock
    configuration: :data:`STOCK`'s knobs, every core (the thread share 1, the threads those
    of the cores)."""
    cats, nums = list(cats), list(nums)
    for name, value in STOCK.items():
        cats[CATEGORICAL.index(name)] = str(value)
    i, j = NUMERIC.index("log_threads"), NUMERIC.index("thread_share")
    share = nums[j]
    if share > 0:  # (NaN or none: the threads as given)
        nums[i] -= math.log(share)
    nums[j] = 1.0
    return cats, nums


def baseline(row: dict[str, Any]) -> float:
    """log seconds of a step at the target's measured rates: its FLOPs at the fp32 rate, the matrix
    share of them (:data:`MATMUL`) at the bf16 rate under bf16, the rate scaled by the share
    of the cores the job's threads get; plus, when the fingerprint counted them, the
    elements the step writes (``elements_per_step``) at :data:`BYTES_PER_ELEMENT` over the
    measured bandwidth; plus its normalisations' elements (:func:`norm_elements`) at
    :data:`NORM_BYTES_PER_ELEMENT` over it, at the threads' share of the cores; plus its
    trainable parameters at :data:`BYTES_PER_PARAMETER` over that bandwidth; plus the
    operations the step dispatches (``ops_per_step``) at the time of one operation the
    target's probe measured (``op_us``: a GPU's), else at :func:`cpu_dispatch_us`; plus, on a
    GPU (``op_us`` measured), its recurrent layers' time steps (``recurrent_steps``) at
    :data:`RECURRENT_KERNELS` operations each, and on a CPU a Keras model's at
    :data:`KERAS_RECURRENT_STEP_US` each. NaN when a figure is missing (``missing`` says
    which)."""
    flops, gflops = _float(row.get("flops_per_step")), _float(row.get("gflops_fp32"))
    if not (flops > 0 and gflops > 0):
        return math.nan
    threads, cores = _float(row.get("threads")), _float(row.get("cores"))
    share = min(1.0, threads / cores) if threads > 0 and cores > 0 else 1.0
    seconds = flops / (gflops * 1e9 * share)
    bf16 = _float(row.get("gflops_bf16"))
    if _text(row.get("precision"), "fp32") == "bf16" and bf16 > 0:
        shares = [_float(row.get(f"flops_{k}")) for k in MATMUL]
        matmul = sum(v for v in shares if v == v)
        matmul = min(1.0, matmul) if matmul > 0 else 1.0
        seconds *= (1.0 - matmul) + matmul * gflops / bf16
    elements, bandwidth = _float(row.get("elements_per_step")), _float(row.get("bandwidth_gbs"))
    params = _float(row.get("trainable_parameters"))
    if bandwidth > 0:
        if elements > 0:
            seconds += elements * BYTES_PER_ELEMENT / (bandwidth * 1e9)
        seconds += norm_elements(row) * NORM_BYTES_PER_ELEMENT / (bandwidth * 1e9 * share)
        if params > 0:
            seconds += params * BYTES_PER_PARAMETER / (bandwidth * 1e9)
    ops, op_us = _float(row.get("ops_per_step")), _float(row.get("op_us"))
    if ops > 0:
        seconds += (ops * op_us if op_us > 0 else cpu_dispatch_us(row)) * 1e-6
    steps = _float(row.get("recurrent_steps"))
    if steps > 0 and op_us > 0:
        seconds += steps * RECURRENT_KERNELS * op_us * 1e-6
    elif steps > 0 and _text(row.get("framework"), "none") == "keras":
        seconds += steps * KERAS_RECURRENT_STEP_US * 1e-6
    return math.log(seconds)


def cpu_dispatch_us(row: dict[str, Any]) -> float:
    """Microseconds a CPU spends a step dispatching its operations in eager mode: each of
    ``ops_per_step`` at :data:`CPU_KERNEL_US`, those Python called
    (``python_ops_per_step``) :data:`CPU_CALL_US` more, and each module call
    (``module_calls_per_step``) :data:`CPU_MODULE_US`; every operation at
    :data:`CPU_OP_US` where the fingerprint does not count the calls."""
    ops, calls = _float(row.get("ops_per_step")), _float(row.get("python_ops_per_step"))
    if not ops > 0:
        return 0.0
    if not calls > 0:
        return ops * CPU_OP_US
    modules = _float(row.get("module_calls_per_step"))
    return (ops * CPU_KERNEL_US + min(calls, ops) * CPU_CALL_US
            + (modules if modules > 0 else 0.0) * CPU_MODULE_US)


def norm_elements(row: dict[str, Any]) -> float:
    """The elements a step's normalisation layers put out in its forward, from the
    fingerprint's FLOPs: the normalisations' share of the forward's (``flops_norm``) at
    :data:`NORM_FLOPS_PER_ELEMENT` each, the forward :data:`STEP_OVER_FORWARD` times fewer
    FLOPs than the step's.  0 where the fingerprint gives no share."""
    share, flops = _float(row.get("flops_norm")), _float(row.get("flops_per_step"))
    if not (share > 0 and flops > 0):
        return 0.0
    return share * flops / STEP_OVER_FORWARD / NORM_FLOPS_PER_ELEMENT


def baselines(df):
    """:func:`baseline` of every row of a pandas frame, as a numpy array."""
    import numpy as np

    return np.array([baseline(r) for r in df.to_dict("records")], dtype=float)


def frame(df):
    """:func:`features` of every row of a pandas frame, as a frame (for scikit-learn)."""
    import pandas as pd

    records = df.to_dict("records")
    rows = [dict(zip(CATEGORICAL, c), **dict(zip(NUMERIC, n)))
            for c, n in map(features, records)]
    return pd.DataFrame(rows, index=df.index, columns=CATEGORICAL + NUMERIC)


def target_figures(probe: Optional[dict[str, Any]]) -> dict[str, Optional[float]]:
    """The store's target columns from a probe record (``modak_runtime.probe``)."""
    probe = probe or {}
    return {k: (float(probe[k]) if probe.get(k) else None) for k in TARGET_FIGURES}
