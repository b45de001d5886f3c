"""What one time step of a Keras recurrent layer costs in training on a CPU, beyond its FLOPs.

    .venv/bin/python benchmarks/recurrent_step_cost.py [--repeats 3]

Keras runs a recurrent layer's time steps on a CPU as a loop of its backend's graph
(TensorFlow's ``while_loop``): every step runs the cell's operations one after the other,
forward and backward, each paying the graph executor's overhead, and a layer a few units
wide is all overhead.  PyTorch's ``nn.LSTM``/``nn.GRU`` on a CPU run their steps in the
library's own loop instead, and a loop of cells in Python is counted by the fingerprint's
dispatched operations.  The performance model's baseline (``modak_lib.perf.features``)
adds a Keras step's ``recurrent_steps`` at ``features.KERAS_RECURRENT_STEP_US`` on a CPU;
this measures that figure: ``Model.fit`` of a one-layer model (LSTM, GRU, SimpleRNN; 8
units, batch 4) at sequence lengths 16 and 64, interleaved over ``--repeats`` rounds, the
difference of the best step times over the 48 steps between them.  A second row per layer
does the same at the LSTM language model's width (256 units, batch 8) and takes off the
extra FLOPs at the probe's fp32 rate: what is left is what the baseline does not count.
Prints a table (median, min, max of the rounds) in microseconds per time step.
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

from modak_runtime.keras_support import RECURRENT as GATES  # noqa: E402  (layer -> gates)

SHORT, LONG = 16, 64
CASES = [(kind, units, batch) for units, batch in ((8, 4), (256, 8)) for kind in GATES]
FEATURES = 16  # the input's width at each time step


def model(keras, kind, units, length):
    m = keras.Sequential([keras.Input((length, FEATURES)),
                          getattr(keras.layers, kind)(units, return_sequences=True),
                          keras.layers.Dense(1)])
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return m


def step_seconds(m, x, y, batch, steps=24):
    """The best of three epochs' mean step time (the first fit, which traces, not timed)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        m.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import keras
    import numpy as np

    from modak_runtime.probe import measure

    gflops = measure(4.0).get("gflops_fp32") or float("nan")
    rng = np.random.default_rng(0)
    built = {}
    for kind, units, batch in CASES:
        for length in (SHORT, LONG):
            x = rng.random((24 * batch, length, FEATURES), dtype=np.float32)
            y = rng.random((24 * batch, length, 1), dtype=np.float32)
            m = model(keras, kind, units, length)
            m.fit(x, y, batch_size=batch, epochs=1, verbose=0)
            built[kind, units, length] = (m, x, y, batch)
    rounds: dict[tuple, list[float]] = {c: [] for c in CASES}
    for _ in range(a.repeats):
        for kind, units, batch in CASES:
            short = step_seconds(*built[kind, units, SHORT])
            long = step_seconds(*built[kind, units, LONG])
            # the extra time steps' FLOPs (forward, and the backward twice) at the probe's rate
            flops = 3 * 2.0 * GATES[kind] * (FEATURES + units) * units * batch * (LONG - SHORT)
            rounds[kind, units, batch].append(
                ((long - short) - flops / (gflops * 1e9)) / (LONG - SHORT) * 1e6)
    print(f"probe: {gflops:.0f} GFLOP/s fp32; {a.repeats} rounds; microseconds a time step "
          "costs beyond its FLOPs")
    print(f"{'layer':<10} {'units':>5} {'batch':>5} {'median':>8} {'min':>8} {'max':>8}")
    for (kind, units, batch), v in rounds.items():
        print(f"{kind:<10} {units:>5} {batch:>5} {statistics.median(v):>8.0f} {min(v):>8.0f} "
              f"{max(v):>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
