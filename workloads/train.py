"""Train a reference workload and print its figures of merit as one JSON line.

    python3 workloads/train.py --model mnist-cnn --steps 300
    python3 workloads/train.py --framework keras --model resnet50 --image-size 64 --steps 5
    python3 workloads/train.py --data /path/to/mnist --epochs 1 --eval

Options default to the MODAK_* variables that MODAK's job scripts export (threads,
compiler, precision, ...), so a job script needs no flags for them.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "workloads"

import numpy as np  # noqa: E402

from workloads import data as wdata  # noqa: E402
from workloads.fom import DATASET_SIZES, emit, host_facts, peak_rss_mb  # noqa: E402
from workloads.options import RunConfig, parse  # noqa: E402


def run(cfg: RunConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    classes = wdata.classes(cfg.model)
    if cfg.framework == "pytorch":
        from workloads.train_torch import setup
    else:
        from workloads.train_keras import setup
    step, evaluate, params, versions = setup(cfg, classes)

    test = None
    if cfg.data == "synthetic":
        if cfg.epochs:
            raise SystemExit("--epochs needs real data (--data DIR)")
        x, y = wdata.synthetic(cfg.model, cfg.image_size, cfg.batch_size, rng)
        source = iter(lambda: (x, y), None)
        total = cfg.warmup + cfg.steps
        data_note = "synthetic"
    else:
        if cfg.model != "mnist-cnn":
            raise SystemExit("real data is only wired for mnist-cnn")
        (trx, try_), test, data_note = wdata.real_mnist(cfg.data)
        source = wdata.batches(trx, try_, cfg.batch_size, rng, cfg.epochs)
        per_epoch = max(1, len(trx) // cfg.batch_size)
        total = per_epoch * cfg.epochs if cfg.epochs else cfg.warmup + cfg.steps

    times, losses = [], []
    t_start = time.perf_counter()
    for i, (bx, by) in zip(range(total), source):
        t0 = time.perf_counter()
        losses.append(step(bx, by))
        times.append(time.perf_counter() - t0)
        if (i + 1) % 50 == 0:
            print(f"step {i + 1}/{total} loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start
    if not np.isfinite(losses[-1]):
        raise SystemExit(f"training diverged: final loss {losses[-1]}")

    timed = times[cfg.warmup:] if len(times) > cfg.warmup else times
    steps_per_s = len(timed) / sum(timed)
    median = statistics.median(timed)
    metrics = {
        "steps": len(times), "timed_steps": len(timed), "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * cfg.batch_size,
        "s_per_epoch": DATASET_SIZES[cfg.model] / (steps_per_s * cfg.batch_size),
        "step_ms_median": median * 1e3, "step_ms_min": min(timed) * 1e3,
        "step_ms_max": max(timed) * 1e3, "first_step_s": times[0],
        "compile_s": max(0.0, times[0] - median) if cfg.compile != "off" else 0.0,
        "wall_s": wall, "peak_rss_mb": peak_rss_mb(), "final_loss": losses[-1],
        "trainable_parameters": params,
    }
    if test is not None and (cfg.eval or cfg.epochs):
        tx, ty = test
        metrics["accuracy"] = evaluate(wdata.normalise(tx)[:, None], ty.astype(np.int64))
        metrics["eval_data"] = data_note
    return {"metrics": metrics, "versions": versions, "data": data_note}


def main(argv=None) -> int:
    cfg = parse(argv)
    result = run(cfg)
    emit({"workload": cfg.model, "framework": cfg.framework, "config": cfg.as_dict(),
          "data": result["data"], "host": host_facts(result["versions"]),
          "metrics": result["metrics"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
