"""How fast a CPU trains a depthwise convolution, and what XLA's CPU backend does to convolutions and bf16.

    .venv/bin/python benchmarks/conv_rate.py [--repeats 3]

The performance model's baseline (``modak_lib.perf.features.baseline``) counts a step's FLOPs at
the rate the target's probe measured for a matrix product.  This measures how far from that
rate three kinds of arithmetic run on a CPU, on single layers (no workload of the campaign):

- a depthwise (grouped) convolution's training step, in PyTorch and in Keras, as a share of the
  probe's fp32 rate (a few FLOPs per element loaded: it does not reach the matrix units);
- the same under XLA (Keras ``jit_compile=True``), whose CPU backend does not hand it to oneDNN;
- a dense 3x3 convolution under XLA against the same without it (a time ratio);
- a dense layer's step under XLA in bf16 (``mixed_bfloat16``) against fp32 (a time ratio).

The README's *Tried* list says what these figures did in the baseline of the XLA
configurations (not adopted).  ``--repeats`` interleaved rounds; prints the median, min and
max of each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# the best of three epochs' mean step time of a built Keras model (the first fit traces)
from recurrent_step_cost import step_seconds as keras_step_seconds  # noqa: E402

SIZE, CHANNELS, BATCH = 32, 64, 16  # a 32x32 image of 64 channels (256 for the depthwise)
STEPS = 8


def conv_flops(kernel: int, channels_in: int, channels_out: int, groups: int = 1) -> float:
    """A training step's FLOPs (the forward's and the backward's twice) of a same-padded 2-D
    convolution over the batch."""
    return 3 * 2.0 * SIZE * SIZE * channels_out * (channels_in // groups) * kernel ** 2 * BATCH


def torch_step_seconds(module, x) -> float:
    import torch

    opt = torch.optim.SGD(module.parameters(), 0.01)

    def step():
        opt.zero_grad()
        module(x).square().mean().backward()
        opt.step()

    for _ in range(2):
        step()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        best = min(best, (time.perf_counter() - start) / STEPS)
    return best


def keras_model(keras, layer, shape, jit: bool, precision: str):
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16"
                                            else "float32")
    m = keras.Sequential([keras.Input(shape), layer(), keras.layers.Flatten(),
                          keras.layers.Dense(1, dtype="float32")])
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=jit)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import keras
    import numpy as np
    import torch

    from modak_runtime.probe import measure

    gflops = measure(4.0).get("gflops_fp32") or float("nan")
    wide = 4 * CHANNELS
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    dw_torch = torch.nn.Conv2d(wide, wide, 3, padding=1, groups=wide)
    x_torch = torch.randn(BATCH, wide, SIZE, SIZE)

    def data(shape):
        return (rng.random((STEPS * BATCH, *shape), dtype=np.float32),
                rng.random((STEPS * BATCH, 1), dtype=np.float32))

    layers = {
        "depthwise": (lambda: keras.layers.DepthwiseConv2D(3, padding="same"), (SIZE, SIZE, wide)),
        "conv": (lambda: keras.layers.Conv2D(CHANNELS, 3, padding="same"),
                 (SIZE, SIZE, CHANNELS)),
        "dense": (lambda: keras.layers.Dense(1024), (1024,)),
    }
    built = {}
    for name, (layer, shape) in layers.items():
        for jit in (False, True):
            for precision in (("fp32", "bf16") if name == "dense" else ("fp32",)):
                if name == "dense" and not jit:
                    continue
                x, y = data(shape)
                m = keras_model(keras, layer, shape, jit, precision)
                m.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
                built[name, jit, precision] = (m, x, y)
    dw_flops = conv_flops(3, wide, wide, groups=wide)
    rows: dict[str, list[float]] = {k: [] for k in (
        "depthwise, PyTorch (share of the probe's rate)",
        "depthwise, Keras (share of the probe's rate)",
        "depthwise, Keras + XLA (share of the probe's rate)",
        "3x3 convolution, XLA over without (time ratio)",
        "dense layer under XLA, bf16 over fp32 (time ratio)")}
    names = list(rows)
    for _ in range(a.repeats):
        rows[names[0]].append(dw_flops / torch_step_seconds(dw_torch, x_torch) / 1e9 / gflops)
        t = {k: keras_step_seconds(m, x, y, BATCH, STEPS) for k, (m, x, y) in built.items()}
        rows[names[1]].append(dw_flops / t["depthwise", False, "fp32"] / 1e9 / gflops)
        rows[names[2]].append(dw_flops / t["depthwise", True, "fp32"] / 1e9 / gflops)
        rows[names[3]].append(t["conv", True, "fp32"] / t["conv", False, "fp32"])
        rows[names[4]].append(t["dense", True, "bf16"] / t["dense", True, "fp32"])
    print(f"probe: {gflops:.0f} GFLOP/s fp32; {a.repeats} rounds; batch {BATCH}, "
          f"{SIZE}x{SIZE} images")
    print(f"{'figure':<52} {'median':>8} {'min':>8} {'max':>8}")
    for name, v in rows.items():
        print(f"{name:<52} {statistics.median(v):>8.4f} {min(v):>8.4f} {max(v):>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
