"""Train a reference workload: an ordinary script, with its own loop and progress prints.

    python3 workloads/train.py --model mnist-cnn --steps 300
    python3 workloads/train.py --framework keras --model resnet50 --image-size 64 --steps 5
    python3 workloads/train.py --data /path/to/mnist --epochs 1 --eval

MODAK runs it like any user's script, through its runtime
(``python3 -m modak_runtime -- workloads/train.py ...``), which applies the plan's knobs and
measures the run; this script reads no MODAK variable and prints no MODAK record.
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "workloads"

import numpy as np  # noqa: E402

from workloads import data as wdata  # noqa: E402
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

    loss = float("nan")
    for i, (bx, by) in zip(range(total), source):
        loss = step(bx, by)
        if (i + 1) % 50 == 0:
            print(f"step {i + 1}/{total} loss {loss:.4f}", file=sys.stderr, flush=True)
    if not np.isfinite(loss):
        raise SystemExit(f"training diverged: final loss {loss}")
    result = {"final_loss": loss, "trainable_parameters": params, "versions": versions}
    if test is not None and (cfg.eval or cfg.epochs):
        tx, ty = test
        result["accuracy"] = evaluate(wdata.normalise(tx)[:, None], ty.astype(np.int64))
        result["eval_data"] = data_note
    return result


def main(argv=None) -> int:
    cfg = parse(argv)
    result = run(cfg)
    print(f"{cfg.model} ({cfg.framework}): final loss {result['final_loss']:.4f}"
          + (f", test accuracy {result['accuracy']:.4f} ({result['eval_data']})"
             if "accuracy" in result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
