"""python3 -m modak_runtime.probe [--seconds S]: what this target really delivers.

Measures, in about ``S`` seconds (default 8), with the threads and CPU features the job has
(its CPU affinity, ``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``):

- dense matrix multiplication in fp32 and bf16, GFLOP/s (PyTorch when the image has it,
  else NumPy for fp32 only);
- memory bandwidth, GB/s (a triad ``c = a + s*b`` on arrays far larger than the caches);

each the best rate it reached, the measurements taking turns in slices so that each one's
best is of the whole time (:func:`_best_rates`); on the job's GPU instead when PyTorch sees
one (``torch.cuda.is_available()``: a training script then runs there): its products and
its memory's triad, each timed to the GPU's end, with the time one small operation takes
from the host's call to the GPU's end of it (``op_us``: what a step of many small
operations pays per operation), and the GPU's name;

and prints one JSON line ``{"modak": "probe", "schema": 1, ...}`` with the host's facts.
The performance model uses these figures as the target's features, so that a target it has
never measured is described by what it does, not by its name.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Optional

from .session import host_facts

SCHEMA = 1
PROBE_KEY = "probe"
N_TRIAD = 16 * 1024 * 1024  # the bandwidth triad's vectors, in fp32 elements
# a CPU's measurements take turns, each this many times round (:func:`_best_rates`)
SLICES = 4


def _best_rate(run: Callable[[], None], work: float, seconds: float,
               warm: bool = True) -> float:
    """The best rate (work per second) of ``run`` over about ``seconds`` (after a warm-up
    run, unless ``warm`` is False); at least one timed run."""
    if warm:
        run()
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        run()
        dt = time.perf_counter() - t
        if dt > 0:
            best = max(best, work / dt)
        if time.perf_counter() > end:
            return best


def _best_rates(runs: dict[str, tuple[Callable[[], None], float]], seconds: float,
                slices: int = SLICES) -> dict[str, float]:
    """The best rate (work per second) of each of ``runs`` (name: the run, its work) over
    about ``seconds`` in all: each run once to warm up, then each in turn for an equal slice,
    ``slices`` times round.  Each one's best is then taken over the whole time rather than
    over a stretch of its own: a shared machine's rates change from one second to the next
    (an Intel Xeon with AMX here: its bf16 products at 357-368 or 1035-1180 GFLOP/s in
    turn, for seconds each), and a measurement that fell in a slow stretch from end to end
    would describe the target by it."""
    for run, _work in runs.values():
        run()
    best = dict.fromkeys(runs, 0.0)
    each = seconds / (len(runs) * slices) if runs else 0.0
    for _round in range(slices):
        for name, (run, work) in runs.items():
            best[name] = max(best[name], _best_rate(run, work, each, warm=False))
    return best


def _matmul_run(torch: Any, dtype: Any, n: int, seconds: float
                ) -> tuple[Callable[[], None], float]:
    """An n x n product (the run, its FLOPs); a smaller n where one product would take more
    than a tenth of ``seconds`` (bf16 without native instructions is 100x slower)."""
    def run(size: int) -> tuple[Callable[[], None], float]:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        out = torch.empty(size, size, dtype=dtype)
        return (lambda: torch.mm(a, b, out=out)), 2.0 * size ** 3
    small = 256
    guess = _best_rate(*run(small), 0.0)
    while n > small and 2.0 * n ** 3 / guess > seconds / 10:
        n //= 2
    return run(n)


def _triad_run(torch: Any, n: int) -> tuple[Callable[[], None], float]:
    """A triad over vectors of ``n`` fp32 (the run, the bytes it moves)."""
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    return (lambda: torch.add(a, b, alpha=1.5, out=c)), 3.0 * 4 * n


def triad_torch(torch: Any, n: int, seconds: float) -> float:
    """The bandwidth in GB/s of a triad over vectors of ``n`` fp32 (the probe's, with
    ``N_TRIAD``), the best of about ``seconds``."""
    return _best_rate(*_triad_run(torch, n), seconds) / 1e9


def _matmul_numpy(np: Any, n: int) -> tuple[Callable[[], None], float]:
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    out = np.empty((n, n), dtype=np.float32)
    return (lambda: np.matmul(a, b, out=out)), 2.0 * n ** 3


def _triad_numpy(np: Any, n: int) -> tuple[Callable[[], None], float]:
    a, b = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
    c = np.empty(n, dtype=np.float32)

    def triad() -> None:
        np.multiply(b, 1.5, out=c)
        np.add(a, c, out=c)
    return triad, 4.0 * 4 * n  # b, c read; c written twice; a read


def _best_rate_cuda(torch: Any, run: Callable[[], None], work: float, seconds: float,
                    repeat: int = 1) -> float:
    """:func:`_best_rate` of ``repeat`` calls of ``run`` on the GPU, each timed to its end."""
    def timed() -> None:
        for _step in range(repeat):
            run()
        torch.cuda.synchronize()
    return _best_rate(timed, work * repeat, seconds)


def _gpu(torch: Any, seconds: float) -> dict[str, Any]:
    """The GPU's figures: fp32 and bf16 products (n = 8192, as the framework's defaults
    run them: no TF32 for fp32 unless the job asks), a triad over 3 x 256 MB, and the
    per-operation time of a one-element addition (host call to GPU end, 200 in a row)."""
    dev = torch.device("cuda")
    share = seconds / 4.0
    out: dict[str, Any] = {"device": "cuda", "accelerator": torch.cuda.get_device_name(dev),
                           "accelerator_count": torch.cuda.device_count()}
    n = 8192
    for dtype, key in ((torch.float32, "gflops_fp32"), (torch.bfloat16, "gflops_bf16")):
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        out[key] = round(_best_rate_cuda(torch, lambda: torch.mm(a, b, out=c), 2.0 * n ** 3,
                                         share) / 1e9, 2)
        del a, b, c
    m = 64 * 1024 * 1024
    x, y, z = (torch.rand(m, device=dev) for _vector in range(3))
    out["bandwidth_gbs"] = round(_best_rate_cuda(
        torch, lambda: torch.add(x, y, alpha=1.5, out=z), 3.0 * 4 * m, share, 10) / 1e9, 2)
    del x, y, z
    one = torch.zeros(1, device=dev)
    ops = 200
    rate = _best_rate_cuda(torch, lambda: one.add_(1.0), 1.0, share, ops)  # ops per second
    out["op_us"] = round(1e6 / rate, 2)
    torch.cuda.empty_cache()
    return out


def measure(seconds: float = 8.0) -> dict[str, Any]:
    """The probe's figures (``seconds``: its whole budget, shared by the measurements)."""
    started = time.perf_counter()
    facts = host_facts()
    threads = facts.get("cores") or 1
    out: dict[str, Any] = {"modak": PROBE_KEY, "schema": SCHEMA, "host": facts,
                           "threads": threads, "gflops_fp32": None, "gflops_bf16": None,
                           "bandwidth_gbs": None, "library": None,
                           "isa_caps": {k: os.environ[k] for k in
                                        ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
                                        if os.environ.get(k)}}
    share = seconds / 4.0
    n_mm = 1024  # 8 MB matrices (and N_TRIAD's 64 MB vectors)
    try:
        import torch
        torch.set_num_threads(threads)
        out["library"] = f"torch {torch.__version__}"
        out["aten_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            out.update(_gpu(torch, seconds))
            out["seconds"] = round(time.perf_counter() - started, 2)
            return out
        out["device"] = "cpu"
        rates = _best_rates({"gflops_fp32": _matmul_run(torch, torch.float32, n_mm, share),
                             "gflops_bf16": _matmul_run(torch, torch.bfloat16, n_mm, share),
                             "bandwidth_gbs": _triad_run(torch, N_TRIAD)}, 3 * share)
        out.update({k: round(v / 1e9, 2) for k, v in rates.items()})
    except ImportError:
        try:
            import numpy as np
            out["library"] = f"numpy {np.__version__}"
            rates = _best_rates({"gflops_fp32": _matmul_numpy(np, n_mm),
                                 "bandwidth_gbs": _triad_numpy(np, N_TRIAD)}, 2 * share)
            out.update({k: round(v / 1e9, 2) for k, v in rates.items()})
        except ImportError:
            out["error"] = "neither torch nor numpy in this image: nothing to measure with"
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def parse(text: str) -> Optional[dict[str, Any]]:
    """The last probe line in a job's output, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and f'"modak": "{PROBE_KEY}"' in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("schema") == SCHEMA:
                return rec
    return None


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    seconds = 8.0
    if argv[:1] == ["--seconds"] and len(argv) == 2:
        seconds = max(1.0, min(60.0, float(argv[1])))
    elif argv:
        print("usage: python3 -m modak_runtime.probe [--seconds S]", file=sys.stderr)
        return 2
    print(json.dumps(measure(seconds), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
