"""What a normalisation layer costs in training, per element, in bytes at the probed bandwidth.

    .venv/bin/python benchmarks/norm_cost.py [--repeats 3] [--threads N]

The performance model's baseline (``modak_lib.perf.features.baseline``) adds a step's
normalisation elements at ``features.NORM_BYTES_PER_ELEMENT``: a BatchNorm's forward and
backward in training read and write its tensor several times, and on a CPU run slower
than that traffic at the bandwidth the probe measures.  This measures it: the probe's
bandwidth (its triad, ``modak_runtime.probe``) on this machine, then the forward and
backward of BatchNorm (2-D and 1-D), LayerNorm and, for comparison, an activation (ReLU6, GELU), on
tensors of the sizes the campaign's families have, interleaved over ``--repeats`` rounds so
that load on this shared machine hits them alike.  Each figure is the time of one forward
and backward of the layer over its output elements, times the bandwidth: the bytes a layer
"costs" an element, as the baseline counts it.  Prints a table (median, min, max of the
rounds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modak_runtime.probe import N_TRIAD, triad_torch  # noqa: E402

# (layer, input shape): the families' normalised tensors, small to large
CASES = [("BatchNorm2d", (16, 144, 16, 16)), ("BatchNorm2d", (16, 96, 32, 32)),
         ("BatchNorm2d", (8, 64, 56, 56)), ("BatchNorm2d", (64, 144, 16, 16)),
         ("BatchNorm1d", (16, 32, 1000)), ("BatchNorm1d", (16, 128, 62)),
         ("LayerNorm", (32, 256, 64)), ("LayerNorm", (8, 196, 192)),
         ("ReLU6", (16, 96, 32, 32)), ("GELU", (32, 256, 256))]


def layer(torch, name, shape):
    nn = torch.nn
    if name.startswith("BatchNorm"):
        return getattr(nn, name)(shape[1])
    if name == "LayerNorm":
        return nn.LayerNorm(shape[-1])
    return getattr(nn, name)()


def seconds(torch, mod, x, reps=20):
    for _ in range(3):
        mod(x).backward(torch.ones_like(x))
    start = time.perf_counter()
    for _ in range(reps):
        mod(x).backward(torch.ones_like(x))
    return (time.perf_counter() - start) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    figures: dict[int, list[float]] = {i: [] for i in range(len(CASES))}
    bandwidths = []
    for _ in range(a.repeats):
        bandwidths.append(triad_torch(torch, N_TRIAD, 1.0))
        for i, (name, shape) in enumerate(CASES):
            x = torch.randn(*shape, requires_grad=True)
            figures[i].append(seconds(torch, layer(torch, name, shape), x)
                              / x.numel() * bandwidths[-1] * 1e9)
    bw = statistics.median(bandwidths)
    print(f"{a.threads} threads; the probe's bandwidth {bw:.1f} GB/s (median of {a.repeats})")
    print(f"{'layer':<12} {'shape':<18} {'bytes/element':>13} {'min':>6} {'max':>6}")
    for i, (name, shape) in enumerate(CASES):
        v = figures[i]
        print(f"{name:<12} {'x'.join(map(str, shape)):<18} {statistics.median(v):>13.0f} "
              f"{min(v):>6.0f} {max(v):>6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
