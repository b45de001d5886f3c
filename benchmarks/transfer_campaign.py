"""The transfer campaign: sixteen workload families (four also in Keras) x two batches x targets.

    .venv/bin/python benchmarks/transfer_campaign.py [--family F ...] [--target T ...]
        [--variant 0|1 ...] [--repeats 1 | --uncertain N | --unrepeated] [--steps 12]
        [--minutes M]
        [--config C ...] [--store PATH] [--merge STORE ...] [--max-busy 0.1]
        [--csv modak_lib/data/transfer-campaign.csv.gz] [--list]
    .venv/bin/python benchmarks/transfer_campaign.py --refingerprint \
        --csv modak_lib/data/transfer-campaign.csv.gz

Every family is an ordinary PyTorch script (``benchmarks/families/``) run through the
runtime (``python3 -m modak_runtime -- SCRIPT``), as a job runs it, with the MODAK_*
variables a job script sets, capped at ``--steps`` optimizer steps (``MODAK_MAX_STEPS``;
the runtime times the steps after its warm-up).  The targets are what this machine can be:

- ``2c``: both cores;
- ``1c``: one core (CPU affinity);
- ``avx2``: both cores, with oneDNN and ATen capped at AVX2 (no AVX-512, no native bf16:
  ``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``), named ``x86_64_v3``;
- ``gpu``: on a machine with a CUDA GPU, the scripts train there (every core of the host
  feeds it); the CPU targets hide it (``CUDA_VISIBLE_DEVICES=``), so that on such a machine
  ``2c`` is its many-core CPU (its rows say how many cores).  The row's ``accelerator`` is
  the GPU's model as the catalogue names it (``H100``), from the probe.

Each target is probed first (``modak_runtime.probe``: its GFLOP/s and bandwidth, the
features the model describes it by); the export describes each target of each machine
(``boot_id``) by the median of its probes: another session's machine, a host of the same
kind, is another target.  The configurations are a fraction of the full grid:
stock, torch.compile, bf16, both, tcmalloc (where the machine has it), and one thread where
there are two (not on the GPU).  Nine families are also Keras 3 scripts on TensorFlow
(``keras_*.py``: the small CNN, the MLP, the 1-D conv net, the LSTM LM, the GRU, the
autoencoder, the text classifier, the transformer LM and the mobile CNN, ``Model.fit``),
the ``-keras`` families, recorded under their PyTorch twin's name with their framework
(a family held out of the model is held out in both), with XLA
(``Model.compile(jit_compile=True)``) as their graph compiler.  A round
runs every configuration of one (family, batch, target) cell once, in a shuffled order, so
that load on this shared machine hits them alike.

It is **resumable**: it appends every run to the results store and skips what the store
already holds from this machine (``--repeats`` per configuration; another session's host,
another ``boot_id``, is another target and gets its own runs; a configuration that failed
on this machine is not run here again, one that failed on another is; so is one whose
process crashed, by a signal of its own such as oneDNN's abort where it has no bf16
primitive, recorded as failed with the signal and the last line of its error output; one
killed from outside or past its time is not recorded and runs again), so it can run in pieces
(``--minutes`` stops starting runs after so long); an empty store is first filled from
``--csv`` when that file exists (the committed campaign).  ``--csv`` then writes the
store's campaign rows: MODAK ships that file (``modak_lib/data``), so that every model
fit and ``modak model eval`` read it with the reference dataset (gzip-compressed, as
a ``--csv`` name ending in ``.gz`` is written and read).

On a GPU machine (a node of the cluster, or a lent one) the campaign runs as here, into a
store of its own, say ``--target gpu --store gpu.sqlite``; the CPU targets there are that
machine's many cores.  Back here, ``--merge gpu.sqlite --csv
modak_lib/data/transfer-campaign.csv.gz`` runs nothing: it adds that store's campaign rows
that this store lacks and writes the CSV.

A run is a measurement of its configuration only if it had the machine to itself: the
campaign reads the machine's CPU time (``/proc/stat``, the host's steal included) around
each run, takes out the run's own (its processes', waited for), and does not record a run
during which more than ``--max-busy`` of the machine (default 0.1: a tenth of all its
CPUs) went to anything else, a test suite or a noisy neighbour.  It then waits for five
quiet seconds (as it does before probing a target) and goes on; the run is measured again
when the campaign is run again.  A machine busy for ten minutes (or past ``--minutes``)
stops it.

Repeats go where the model is uncertain: ``--uncertain N`` runs one more round of the N
cells of this machine (of those selected by ``--family``/``--target``/``--variant``) whose
measurements the model predicts worst with their configuration held out (in 10 folds,
``uncertainty``): the cells whose runs disagree with each other or with every other cell.

``--unrepeated`` runs one more round of every cell of this machine (of those selected) whose
configurations all ran here, some of them only once: a configuration's figure is the median
of its runs, and one run is all scatter (held out, the configurations measured once were
26% off, those measured two or three times 20%).  As ``--uncertain``, a round of the whole
cell, stock among it (a run is compared with the stock run of its own round:
``fit.round_shift``), after the configurations measured fewer times than the cell's most
measured one have caught up.  A cell with only a stock run here (an anchor of this
machine's speed) is not one: its whole grid would run twice.

``--refingerprint`` runs nothing of the campaign: it fingerprints each (family, batch) once
(two steps, stock, through the runtime) and writes the fingerprint's columns that the
CSV's rows of that fingerprint lack, such as a figure a newer runtime counts
(``elements_per_step``); a fingerprint whose id differs from the rows' is an error (the
script or PyTorch changed: the measurements are of another workload), except on an
accelerator's rows of the same parameters, batch and input shape, whose device counted its
own operations (the H100's attention kernels): those get only what the runtime counts from
the model's modules and the script's Python (``recurrent_steps``, ``python_ops_per_step``,
``module_calls_per_step``), and a run that failed in its first step, whose fingerprint is
what it counted before it failed (a oneDNN primitive it could not create), is left as it
is.  ``--recount
FAMILY`` replaces that family's fingerprint instead, id included, where the runtime counted
it wrong (an operation it had no FLOP formula for), as long as the parameters, the batch
and the input shape are the rows' own.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.perf.features import TARGET_FIGURES  # noqa: E402
from modak_lib.perf.probe import run_here  # noqa: E402
from modak_lib.results import (COLUMNS, ResultsStore, open_csv, parse_fom_lines,  # noqa: E402
                               row_from_fom, write_csv)
from modak_runtime.record import Record  # noqa: E402
from modak_runtime.session import boot_id, host_facts, knobs_from_env  # noqa: E402

FAMILIES_DIR = ROOT / "benchmarks" / "families"
SOURCE = "transfer-campaign"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"

# family -> (script, [arguments of batch variant 0, of variant 1])
FAMILIES: dict[str, tuple[str, list[list[str]]]] = {
    "small-cnn": ("small_cnn.py", [["--batch-size", "32"], ["--batch-size", "128"]]),
    "resnet18": ("resnet.py", [["--depth", "18", "--batch-size", "8"],
                               ["--depth", "18", "--batch-size", "32"]]),
    "resnet50": ("resnet.py", [["--depth", "50", "--batch-size", "4", "--image-size", "64"],
                               ["--depth", "50", "--batch-size", "16", "--image-size", "64"]]),
    "mobile-cnn": ("mobile_cnn.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
    "mlp": ("mlp.py", [["--batch-size", "64"], ["--batch-size", "512"]]),
    "transformer-lm": ("transformer_lm.py", [["--batch-size", "4", "--length", "64"],
                                             ["--batch-size", "16", "--length", "128"]]),
    "gru": ("gru.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
    "recommender": ("recommender.py", [["--batch-size", "128"], ["--batch-size", "1024"]]),
    "lstm-lm": ("lstm_lm.py", [["--batch-size", "8"], ["--batch-size", "32"]]),
    "vit": ("vit.py", [["--batch-size", "8"], ["--batch-size", "32"]]),
    "conv1d": ("conv1d.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
    # second of a kind (depthwise convolutions; embedding tables; dense layers; a recurrent
    # cell stepped in Python, thousands of small operations a step) and an upsampling
    # network, added on a later machine
    "convnext": ("convnext.py", [["--batch-size", "8"], ["--batch-size", "32"]]),
    "text-classifier": ("text_classifier.py", [["--batch-size", "64"], ["--batch-size", "512"]]),
    "autoencoder": ("autoencoder.py", [["--batch-size", "32"], ["--batch-size", "256"]]),
    "unet": ("unet.py", [["--batch-size", "4"], ["--batch-size", "16"]]),
    "char-rnn": ("char_rnn.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
    # four of them again in Keras 3 on TensorFlow (``Model.fit``), at the same batch sizes,
    # with the graph compiler XLA in place of torch.compile
    "small-cnn-keras": ("keras_small_cnn.py", [["--batch-size", "32"], ["--batch-size", "128"]]),
    "mlp-keras": ("keras_mlp.py", [["--batch-size", "64"], ["--batch-size", "512"]]),
    "conv1d-keras": ("keras_conv1d.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
    "lstm-lm-keras": ("keras_lstm_lm.py", [["--batch-size", "8"], ["--batch-size", "32"]]),
    # and a second recurrent one, added later
    "gru-keras": ("keras_gru.py", [["--batch-size", "16"], ["--batch-size", "64"]]),
}
# then four more in Keras, at their PyTorch twin's batch sizes, so that a Keras family held
# out has more than four others of its framework to be predicted from (dense layers with
# batch norm; an embedding table; self-attention; depthwise convolutions), on a later machine
for _twin in ("autoencoder", "text-classifier", "transformer-lm", "mobile-cnn"):
    FAMILIES[f"{_twin}-keras"] = (f"keras_{_twin.replace('-', '_')}.py", FAMILIES[_twin][1])
# the Keras families' workloads: a family is its architecture, in either framework (held out
# of the model together); the record's framework tells them apart
KERAS_FAMILIES: dict[str, str] = {f: f.removesuffix("-keras") for f in FAMILIES
                                  if f.endswith("-keras")}


def workload_of(family: str) -> str:
    return KERAS_FAMILIES.get(family, family)


def framework_of(family: str) -> str:
    return "keras" if family in KERAS_FAMILIES else "pytorch"

# target -> (CPU affinity or None for all, environment, microarchitecture name)
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
TARGETS: dict[str, tuple[list[int] | None, dict[str, str], str | None]] = {
    "2c": (None, NO_GPU, None),
    "1c": ([0], NO_GPU, None),
    "avx2": (None, {**NO_GPU, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
             "x86_64_v3"),
    "gpu": (None, {}, None),
}
GPU_TARGETS = {"gpu"}

# configuration label -> environment (threads=1 only where the target has more than one core)
CONFIGS: dict[str, dict[str, str]] = {
    "stock": {},
    "compile": {"MODAK_TORCH_COMPILE": "default"},
    "bf16": {"MODAK_PRECISION": "bf16"},
    "compile+bf16": {"MODAK_TORCH_COMPILE": "default", "MODAK_PRECISION": "bf16"},
    "tcmalloc": {"LD_PRELOAD": TCMALLOC, "MODAK_ALLOCATOR": "tcmalloc"},
    "threads=1": {"MODAK_THREADS": "1"},
    # a Keras family's graph compiler
    "xla": {"MODAK_JIT_COMPILE": "1"},
    "xla+bf16": {"MODAK_JIT_COMPILE": "1", "MODAK_PRECISION": "bf16"},
}
COMPILERS = {"torch.compile": ("compile", "compile+bf16"), "xla": ("xla", "xla+bf16")}


def cores_of(target: str) -> int:
    cpus = TARGETS[target][0]
    return len(cpus) if cpus else len(os.sched_getaffinity(0))


def configs_for(target: str, family: str | None = None) -> list[str]:
    """The configurations a family (a PyTorch one when None) runs in on ``target``.  Not XLA
    on a target made by capping oneDNN's and ATen's ISA (``avx2``): XLA generates its own
    code for the host's CPU, which the caps do not reach, so it would measure this machine
    (its XLA with bf16 ran the 1-D conv net and the MLP at 0.59-0.70x stock's time there,
    where oneDNN's bf16 has no primitive at all), not a CPU without AVX-512 or native bf16."""
    other = COMPILERS["torch.compile" if family in KERAS_FAMILIES else "xla"]
    capped = "ONEDNN_MAX_CPU_ISA" in TARGETS[target][1]
    return [c for c in CONFIGS
            if not (c == "threads=1" and (cores_of(target) < 2 or target in GPU_TARGETS))
            and not (c == "tcmalloc" and not os.path.exists(TCMALLOC))
            and c not in other and not (capped and c in COMPILERS["xla"])]


def accelerator_model(probe: dict) -> str | None:
    """The GPU's model as the catalogue and the infrastructure files name it (``H100`` of
    ``NVIDIA H100 80GB HBM3``); None for a CPU target."""
    name = probe.get("accelerator")
    if not name:
        return None
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", name)
    return m.group(1) if m else name


def run_id(family: str, variant: int, target: str, config: str) -> str:
    return f"transfer/{family}/b{variant}/{target}/{config}"


# the signals a run's own process dies of (an abort, a fault): the same script and
# configuration on the same machine crash again, so a crash is recorded as a failure; a
# run killed from outside (SIGKILL: out of memory; SIGTERM) or past its time is not
CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGFPE}


class Crashed(RuntimeError):
    """A run whose process died of one of :data:`CRASH_SIGNALS`, before any record."""

    def __init__(self, message: str, signum: int, stderr: str):
        super().__init__(message)
        self.signum, self.stderr = signum, stderr

    def reason(self) -> str:
        """The signal's name and the last line of the run's error output that says why."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if "error" in ln.lower()
                    or "what()" in ln), lines[-1] if lines else "")
        why = " ".join(why.split())
        return f"{signal.Signals(self.signum).name}: {why}"[:500]


def crash_record(family: str, target: str, config: str, exc: Crashed,
                 fingerprint: dict | None) -> dict:
    """The figure-of-merit record of a run that crashed (:class:`Crashed`), as the runtime
    writes one (``Record``): status failed, the configuration it ran (the runtime's reading
    of its environment, :data:`CONFIGS`), this machine, the workload's fingerprint as its
    other runs recorded it, the signal as its error."""
    rec = json.loads(Record(
        workload=workload_of(family),
        framework=framework_of(family), status="failed",
        script=FAMILIES[family][0], config=knobs_from_env(CONFIGS[config]),
        host={**host_facts(), "cores": cores_of(target)},
        error={"type": "signal", "message": exc.reason()}).to_json())
    if fingerprint:  # (as recorded: a field an older runtime wrote is kept)
        rec["fingerprint"] = fingerprint
    return rec


def fingerprint_of(store: ResultsStore, family: str, variant: int) -> dict | None:
    """The workload fingerprint the family's runs at this batch recorded (any target's)."""
    prefix = f"transfer/{family}/b{variant}/"
    for r in _campaign_rows(store):
        if (r.get("run_id") or "").startswith(prefix) and r.get("raw"):
            fp = json.loads(r["raw"]).get("fingerprint")
            if fp:
                return fp
    return None


def run_one(family: str, variant: int, target: str, config: str, steps: int,
            seconds: float | None = None) -> dict:
    """One run through the runtime, capped at ``steps`` (and at ``seconds``: a search's
    trial); its figure-of-merit record."""
    script, variants = FAMILIES[family]
    cpus, target_env, micro = TARGETS[target]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAK_")}
    env.update(target_env, **CONFIGS[config], MODAK_MAX_STEPS=str(steps),
               MODAK_WORKLOAD=workload_of(family),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    if micro:
        env["MODAK_MICROARCHITECTURE"] = micro
    if family in KERAS_FAMILIES:
        env["KERAS_BACKEND"] = "tensorflow"
    if seconds:
        env["MODAK_MAX_SECONDS"] = f"{seconds:g}"

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, set(cpus))

    proc = subprocess.run([sys.executable, "-m", "modak_runtime", "--", script,
                           *variants[variant], "--steps", "100000"],
                          cwd=FAMILIES_DIR, capture_output=True, text=True, env=env,
                          preexec_fn=pin if cpus else None, timeout=900)
    recs = parse_fom_lines(proc.stdout)
    if not recs and -proc.returncode in CRASH_SIGNALS:
        raise Crashed(f"{family} b{variant} {target} {config}: crashed "
                      f"({signal.Signals(-proc.returncode).name}): {proc.stderr[-800:]}",
                      -proc.returncode, proc.stderr[-4000:])
    if not recs:
        raise RuntimeError(f"{family} b{variant} {target} {config}: no record "
                           f"({proc.returncode}): {proc.stderr[-800:]}")
    return recs[-1]


def cpu_clock() -> tuple[float, float] | None:
    """The machine's busy CPU seconds since boot (user, nice, system, irq, softirq) and
    those its host stole from it (a virtual machine's neighbours), from ``/proc/stat``;
    ``None`` where there is no such file."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, *rest = fields + [0] * 8
    return (user + nice + system + irq + softirq) / tick, (rest[0] if rest else 0) / tick


def children_cpu() -> float:
    """CPU seconds of this process's children that have been waited for (with theirs)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Disturbance:
    """How much of the machine went to something other than the runs started inside it
    (other processes, the host's steal), as a share of all its CPUs over the wall time:
    a run measured beside a test suite or a noisy neighbour is not a measurement of its
    configuration.  ``share`` is ``None`` where the machine does not say (no
    ``/proc/stat``) or the wall time was under a second."""

    def __init__(self) -> None:
        self.share: float | None = None

    def __enter__(self) -> "Disturbance":
        self._clock, self._children = cpu_clock(), children_cpu()
        self._wall = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        clock, wall = cpu_clock(), time.monotonic() - self._wall
        if clock is None or self._clock is None or wall < 1:
            return  # (under a second: the clock's ticks are too coarse to tell)
        busy = clock[0] - self._clock[0] - (children_cpu() - self._children)
        stolen = clock[1] - self._clock[1]
        self.share = (max(0.0, busy) + max(0.0, stolen)) / (wall * (os.cpu_count() or 1))


def wait_quiet(limit: float, deadline: float, window: float = 5.0) -> bool:
    """Wait until ``window`` seconds pass with at most ``limit`` of the machine busy
    (:class:`Disturbance` of nothing), but not past ``deadline`` (``time.time()``): whether
    it is quiet (or does not say)."""
    while True:
        with Disturbance() as d:
            time.sleep(window)
        if d.share is None or d.share <= limit:
            return True
        if time.time() >= deadline:
            return False


ANY = "*"  # every machine


def _campaign_rows(store: ResultsStore, boot: str | None = ANY):
    """The campaign's rows in ``store`` measured on the machine ``boot`` (:func:`machine`;
    ``None``: rows of runtimes that recorded none; ``ANY``: every machine's)."""
    if not store.path.exists():
        return
    for r in store.rows():
        if r.get("source") == SOURCE and (boot == ANY or r.get("boot_id") == boot):
            yield r


def done(store: ResultsStore, boot: str | None = ANY) -> dict[str, int]:
    """Runs the store holds, per run id (a cell's configuration), measured on the machine
    ``boot`` (:func:`_campaign_rows`): another session's host is another target, whose
    cells its own rounds fill."""
    counts: dict[str, int] = {}
    for r in _campaign_rows(store, boot):
        counts[r["run_id"]] = counts.get(r["run_id"], 0) + 1
    return counts


def failed(store: ResultsStore, boot: str | None = ANY) -> set[str]:
    """Run ids (a cell's configuration) that failed on the machine ``boot`` (as
    :func:`done`): not run there again, as a deploy never offers a configuration that failed
    for the workload there again.  Another machine runs them: a failure belongs to its
    place (the LSTM LM's bf16, which oneDNN had no primitive for on a CPU without native
    bf16, is a run like any other on one with it)."""
    return {r["run_id"] for r in _campaign_rows(store, boot) if r.get("status") == "failed"}


def probe(target: str, seconds: float = 6.0) -> dict:
    cpus, env, _ = TARGETS[target]
    return run_here(seconds=seconds, env=env, cpus=cpus)


def machine(row: dict) -> tuple:
    """Which machine a row ran on: its target on one machine as booted (``boot_id``; the
    rows of runtimes that did not record it count as one machine)."""
    return row.get("target"), row.get("boot_id")


def descriptions(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """Per target of one machine (:func:`machine`), the median of each figure over the
    distinct probes of it (each row carries its invocation's probe): one description per
    target and machine.  Not the best: one machine's bandwidth probes here measured 49,
    54 and 88 GB/s.  Another session's machine, a host of the same kind, is another
    target: this CPU's bf16 products measured 435 GFLOP/s on one and 964 on another, and
    the same scripts ran 1.4-2.2x faster there.  (Rounded: the median of two is their mean.)"""
    import statistics

    probes: dict[tuple, set] = {}
    for r in rows:
        if r.get("source") == SOURCE and r.get("gflops_fp32"):
            probes.setdefault(machine(r), set()).add(tuple(
                float(r[k]) if r.get(k) else None for k in TARGET_FIGURES))
    return {m: {k: round(statistics.median(v), 4) for i, k in enumerate(TARGET_FIGURES)
                if (v := [p[i] for p in seen if p[i] is not None])}
            for m, seen in probes.items()}


def export(store: ResultsStore, path: Path) -> int:
    """The store's campaign rows (each raw record once) as CSV, for
    ``modak model eval --data PATH``; each target of each machine described by
    :func:`descriptions`."""
    rows, seen = [], set()
    all_rows = store.rows()
    described = descriptions(all_rows)
    for r in all_rows:
        if r.get("source") == SOURCE and r.get("raw") not in seen:
            rows.append({**r, **described.get(machine(r), {})})
            seen.add(r.get("raw"))
    return write_csv(path, rows)


def merge(store: ResultsStore, other: Path) -> int:
    """The campaign rows of another store (a run on another machine, such as a GPU node's,
    whose store came back as a file) that this one lacks (by their raw record)."""
    have = {r.get("raw") for r in store.rows()} if store.path.exists() else set()
    rows = [{k: v for k, v in r.items() if k in COLUMNS} for r in ResultsStore(other).rows()
            if r.get("source") == SOURCE and r.get("raw") not in have]
    if rows:
        store.append(rows)
    return len(rows)


def seed(store: ResultsStore, path: Path) -> int:
    """The campaign rows of an exported CSV appended to an empty store, so that a fresh
    checkout resumes the committed campaign instead of starting again."""
    import csv

    with open_csv(path) as f:
        rows = [{k: (v if v != "" else None) for k, v in r.items() if k in COLUMNS}
                for r in csv.DictReader(f) if r.get("source") == SOURCE]
    if rows:
        store.append(rows)
        print(f"resuming from the {len(rows)} runs in {path}", flush=True)
    return len(rows)


# the fingerprint's columns, as the store names them
FINGERPRINT_COLUMNS = ["trainable_parameters", "flops_per_step", "elements_per_step",
                       "ops_per_step", "recurrent_steps", "python_ops_per_step",
                       "module_calls_per_step", "input_shape",
                       *(c for c in COLUMNS if c.startswith("flops_") and c != "flops_per_step")]


SAME_WORKLOAD = ("trainable_parameters", "batch_size", "input_shape")
# what the runtime counts from the model's modules and the script's Python, not from the
# operations the device dispatched: the same on any device
DEVICE_FREE = ("recurrent_steps", "python_ops_per_step", "module_calls_per_step")


def _same_workload(fp: dict, row: dict) -> bool:
    """Whether a CSV row has the fingerprint ``fp``'s parameters, batch and input shape
    (:data:`SAME_WORKLOAD`; a value the row lacks is not compared)."""
    import json

    return all(str(fp.get(c)) == str(json.loads(row[c]) if c == "input_shape"
                                     else int(float(row[c])))
               for c in SAME_WORKLOAD if row.get(c))


def refingerprint(path: Path, recount: tuple[str, ...] = ()) -> int:
    """Fill the fingerprint columns the CSV's rows lack; for the ``recount`` families,
    replace them all (see the module docstring)."""
    import csv
    import json

    with open_csv(path) as f:
        rows = list(csv.DictReader(f))
    filled = 0
    for family in FAMILIES:
        for variant in (0, 1):
            prefix = f"transfer/{family}/b{variant}/"
            mine = [r for r in rows if (r.get("run_id") or "").startswith(prefix)]
            if not mine or family not in recount and not any(
                    not r.get(c) for r in mine for c in FINGERPRINT_COLUMNS
                    if c != "input_shape"):
                continue
            fp = row_from_fom(run_one(family, variant, "2c", "stock", 2), source=SOURCE)
            for r in mine:
                columns = FINGERPRINT_COLUMNS
                if r.get("status") == "failed" and r.get("fingerprint") \
                        and r["fingerprint"] != fp["fingerprint"]:
                    continue  # (a run that failed in its first step: what it counted stays)
                if family not in recount and r.get("accelerator") and r.get("fingerprint") \
                        and r["fingerprint"] != fp["fingerprint"] and _same_workload(fp, r):
                    # an accelerator's fingerprint counts the operations its device ran (the
                    # H100's attention kernels): of this one, only what the modules say
                    columns = DEVICE_FREE
                else:
                    if family in recount and _same_workload(fp, r):
                        # (an accelerator's row keeps the operations its device dispatched:
                        # a GPU runs a GRU as one fused call where the CPU runs it step by
                        # step)
                        r.update(fingerprint="", **{
                            c: "" for c in FINGERPRINT_COLUMNS
                            if c != "ops_per_step" or not r.get("accelerator")})
                    if r.get("fingerprint") and r["fingerprint"] != fp["fingerprint"]:
                        raise SystemExit(f"{family} b{variant}: the fingerprint is now "
                                         f"{fp['fingerprint']}, the CSV's rows have "
                                         f"{r['fingerprint']}: not the measured workload")
                    if not r.get("fingerprint"):
                        r["fingerprint"] = fp["fingerprint"]
                for c in columns:
                    if not r.get(c) and fp.get(c) is not None:
                        v = fp[c]
                        r[c] = json.dumps(v) if isinstance(v, list) else str(v)
                        filled += 1
            print(f"{family} b{variant}: {fp['fingerprint']}, elements/step "
                  f"{fp.get('elements_per_step')}, operations/step {fp.get('ops_per_step')}",
                  flush=True)
    write_csv(path, rows)
    return filled


UNCERTAINTY_FOLDS = 10


def uncertainty(store: ResultsStore, boot: str | None = ANY) -> dict[tuple[str, int, str], float]:
    """Per cell (family, batch variant, target) of the machine ``boot`` (as :func:`done`),
    how far the model is from what was measured with its configuration held out of the fit
    (gradient boosting; the configurations dealt into :data:`UNCERTAINTY_FOLDS` folds, each
    held out in turn, as ``modak model eval``'s LOCO: a fit per configuration is hours on
    the campaign's thousands of rows): the
    error of the cell's worst-predicted configuration (the median over its runs of
    |log(predicted / measured)|, as a ratio less 1).  Where it is largest, a
    configuration's runs disagree with each other or with every other cell, and another
    round tells which.  The fit learns from every machine's rows."""
    import numpy as np
    import pandas as pd

    from modak_lib.perf.fit import held_out_predictions, training_frame, usable

    rows = [r for r in store.rows() if r.get("source") == SOURCE] if store.path.exists() else []
    if not rows:
        return {}
    df = usable(training_frame(pd.DataFrame(rows)))
    error = np.abs(held_out_predictions(df, "gbr", "configuration", folds=UNCERTAINTY_FOLDS)
                   - df["y"].to_numpy())
    per_run: dict[str, list[float]] = {}
    boots = df["boot_id"] if "boot_id" in df else pd.Series(None, index=df.index)
    for rid, e, b in zip(df["run_id"], error, boots.astype(object)):
        b = None if b is None or b != b else b
        if e == e and (boot == ANY or b == boot):
            per_run.setdefault(str(rid), []).append(float(e))
    out: dict[tuple[str, int, str], float] = {}
    for rid, errors in per_run.items():
        _, family, variant, target, _ = rid.split("/")
        cell = (family, int(variant[1:]), target)
        out[cell] = max(out.get(cell, 0.0), float(np.exp(np.median(errors)) - 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--target", action="append", choices=sorted(TARGETS))
    ap.add_argument("--variant", action="append", type=int, choices=[0, 1])
    ap.add_argument("--config", action="append", choices=list(CONFIGS),
                    help="only these configurations (default: each the target takes)")
    ap.add_argument("--repeats", type=int, default=1)  # (or --uncertain N)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--minutes", type=float, default=0, help="start no run after so long")
    ap.add_argument("--max-busy", type=float, default=0.1, metavar="SHARE",
                    help="record no run during which more than this share of the machine's "
                         "CPU went to anything else (default 0.1; 1 records every run)")
    ap.add_argument("--store", help="results store (default: $MODAK_RESULTS or ~/.local/...)")
    ap.add_argument("--csv", help="then write the campaign's rows as CSV")
    ap.add_argument("--list", action="store_true", help="say what is left, run nothing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--uncertain", type=int, metavar="N", default=0,
                    help="one more round of the N cells the model predicts worst")
    ap.add_argument("--unrepeated", action="store_true",
                    help="one more round of every cell whose configurations all ran on "
                         "this machine, some only once")
    ap.add_argument("--merge", action="append", default=[], metavar="STORE",
                    help="run nothing: add the campaign rows of another store (another "
                         "machine's, a GPU node's) to --store, then write --csv")
    ap.add_argument("--refingerprint", action="store_true",
                    help="only fill the fingerprint columns the --csv rows lack")
    ap.add_argument("--recount", action="append", default=[], choices=sorted(FAMILIES),
                    help="with --refingerprint: replace this family's fingerprint (a count "
                         "the runtime lacked), if its parameters, batch and input match")
    a = ap.parse_args()
    if a.refingerprint:
        if not a.csv:
            ap.error("--refingerprint needs --csv")
        print(f"filled {refingerprint(Path(a.csv), tuple(a.recount))} values in {a.csv}")
        return 0
    store = ResultsStore(a.store)
    if a.csv and Path(a.csv).exists() and not done(store):
        seed(store, Path(a.csv))  # a fresh store goes on from the committed campaign
    if a.merge:  # runs nothing: another machine's rows joined to this store (and the CSV)
        for other in a.merge:
            print(f"merged {merge(store, Path(other))} runs from {other}", flush=True)
        if a.csv:
            print(f"wrote {export(store, Path(a.csv))} rows to {a.csv}")
        return 0
    rng = random.Random(a.seed)
    families = a.family or list(FAMILIES)
    targets = a.target or list(TARGETS)
    variants = a.variant or [0, 1]
    counts, broken = done(store, boot_id()), failed(store, boot_id())

    def configs(target: str, family: str) -> list[str]:
        return [c for c in configs_for(target, family) if not a.config or c in a.config]

    def measured(cell: tuple) -> list[int]:  # runs here of each configuration of a cell
        return [counts.get(run_id(*cell, k), 0) for k in configs(cell[2], cell[0])]

    # variant 0 everywhere before variant 1 (in each round: see ``rounds``)
    cells = [(f, v, t) for v in variants for t in targets for f in families]
    want = {cell: a.repeats for cell in cells}  # runs per configuration, per cell
    if a.uncertain:
        scores = uncertainty(store, boot_id())
        ranked = sorted((c for c in dict.fromkeys(cells) if c in scores),
                        key=lambda c: -scores[c])[:a.uncertain]
        want = {c: 1 + max(measured(c)) for c in ranked}
        cells = ranked
        for c in ranked:
            print(f"  {c[0]} b{c[1]} {c[2]}: held-out error {scores[c]:.0%}, round {want[c]}")
    if a.unrepeated:  # (after --uncertain's choice, if both: of those cells)
        # a cell whose whole grid ran here, some of it once (not one with only a stock run
        # here, an anchor of this machine's speed: that would be its grid twice)
        once = [c for c in dict.fromkeys(cells)
                if min([counts.get(run_id(*c, k), 0) for k in configs(c[2], c[0])
                        if run_id(*c, k) not in broken] or [0]) == 1]
        want = {c: 1 + max(measured(c)) for c in once}
        cells = once
    # the rounds: round r of every cell (one run of each configuration measured fewer than r
    # times here) before round r + 1 of any
    rounds = [(r, f, v, t) for r in range(1, max(want.values(), default=0) + 1)
              for f, v, t in dict.fromkeys(cells) if r <= want[(f, v, t)]]

    def todo_of(r: int, f: str, v: int, t: str) -> list[str]:
        return [c for c in configs(t, f) if counts.get(run_id(f, v, t, c), 0) < r
                and run_id(f, v, t, c) not in broken]

    left = [(f, v, t, c) for f, v, t in dict.fromkeys(cells) for c in configs(t, f)
            if run_id(f, v, t, c) not in broken
            for _ in range(max(0, want[(f, v, t)] - counts.get(run_id(f, v, t, c), 0)))]
    print(f"{len(left)} runs left"
          f" (repeats {a.repeats if not (a.uncertain or a.unrepeated) else 'one more round'})",
          flush=True)
    if a.list:
        for f, v, t, c in left:
            print(f"  {f} b{v} {t} {c}")
        return 0
    started = time.time()
    figures: dict[str, dict] = {}
    disturbed = 0

    def quiet() -> bool:  # the machine to itself, or give up after 10 minutes (or --minutes)
        end = time.time() + 600
        if a.minutes:
            end = min(end, started + a.minutes * 60)
        if wait_quiet(a.max_busy, end):
            return True
        print(f"the machine stays busy with something else (over {a.max_busy:.0%} of it): "
              "run again later to go on", flush=True)
        return False

    for r, f, v, t in rounds:
        todo = todo_of(r, f, v, t)
        if not todo:
            continue
        if a.minutes and time.time() - started > a.minutes * 60:
            print("time is up: run again to go on", flush=True)
            break
        if t not in figures:
            if a.max_busy < 1 and not quiet():  # the target's figures, measured alone
                break
            figures[t] = p = probe(t)
            if t in GPU_TARGETS and not p.get("accelerator"):
                print(f"== target {t}: no GPU here, skipped", flush=True)
            else:
                print(f"== target {t}: fp32 {p['gflops_fp32']} GFLOP/s, bf16 "
                      f"{p['gflops_bf16']}, {p['bandwidth_gbs']} GB/s "
                      f"{p.get('accelerator') or ''}", flush=True)
        if t in GPU_TARGETS and not figures[t].get("accelerator"):
            continue
        rng.shuffle(todo)
        busy = False
        for c in todo:
            if a.minutes and time.time() - started > a.minutes * 60:
                break
            t0 = time.perf_counter()
            crashed = None
            try:
                with Disturbance() as d:
                    rec = run_one(f, v, t, c, a.steps)
            except Crashed as exc:  # recorded as failed: not run on this machine again
                crashed = exc.reason()
                rec = crash_record(f, t, c, exc, fingerprint_of(store, f, v))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"  {f} b{v} {t} {c}: {exc}", flush=True)
                continue
            rid = run_id(f, v, t, c)
            if a.max_busy < 1 and d.share is not None and d.share > a.max_busy:
                # not stored: the next invocation (or round) runs it again
                disturbed += 1
                print(f"  {f} b{v} {t} {c}: {d.share:.0%} of the machine went to something "
                      "else meanwhile: not recorded; waiting for it to be quiet", flush=True)
                if not quiet():
                    busy = True
                    break
                continue
            try:
                row = row_from_fom(rec, source=SOURCE, run_id=rid, repeat=counts.get(rid, 0),
                                   image="host", target=t, probe=figures[t],
                                   accelerator=accelerator_model(figures[t]),
                                   microarchitecture=TARGETS[t][2])
            except Exception as exc:  # a run that measured nothing
                print(f"  {f} b{v} {t} {c}: not recorded ({exc})", flush=True)
                continue
            store.append([row])
            counts[rid] = counts.get(rid, 0) + 1
            m = rec["metrics"]
            print(f"  {f:<15} b{v} {t:<4} {c:<13} {rec['status']:<7} "
                  + (f"{(m.get('s_per_step') or 0):8.4f} s/step  loss {m.get('final_loss')}"
                     if crashed is None else crashed[:200])
                  + f"  ({time.perf_counter() - t0:5.1f} s)", flush=True)
        if busy:
            break
    if disturbed:
        print(f"{disturbed} runs were not recorded, the machine being busy with something "
              "else: run again to measure them", flush=True)
    if a.csv:
        print(f"wrote {export(store, Path(a.csv))} rows to {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
