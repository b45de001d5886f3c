"""How long `modak plan` takes, library import included (target: < 0.5 s wall for a blueprint,
with the performance model deciding: its exported formula needs no scikit-learn).

    .venv/bin/python benchmarks/plan_speed.py [--repeats N]

Runs each command N times, interleaved (A B A B ...) so that load on this shared
machine hits every command alike, and prints median / min / max wall seconds and
the ratio to a bare `python -c pass` start measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.5


def commands(out: str) -> dict[str, list[str]]:
    py = sys.executable
    plan = [py, "-m", "modak_lib.cli", "plan"]
    return {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "plan blueprint, local host, model decides": [
            *plan, "examples/mnist-cnn/blueprint.yaml", "--infra", "examples/infra/local.yaml",
            "--out", f"{out}/a"],
        "plan blueprint, local host, --model none": [
            *plan, "examples/mnist-cnn/blueprint.yaml", "--infra", "examples/infra/local.yaml",
            "--model", "none", "--out", f"{out}/b"],
        "plan blueprint, hlrs infra (cold start)": [
            *plan, "examples/mnist-cnn/blueprint.yaml", "--infra",
            "examples/infra/hlrs-testbed.yaml", "--out", f"{out}/c"],
        "plan MODAK DSL (TF 2.1 + XLA, GPU)": [
            *plan, "examples/resnet50/request.json", "--out", f"{out}/d"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        # a model fitted once from the shipped dataset (the warm-up fits it), nothing else
        os.environ["MODAK_MODEL"] = f"{out}/model.joblib"
        os.environ["MODAK_RESULTS"] = f"{out}/empty-store.sqlite"
        cmds = commands(out)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for name, argv in cmds.items():  # warm-up: page cache, .pyc files
            subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
        for _ in range(args.repeats):
            for name, argv in cmds.items():
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["python -c pass (baseline)"])
    width = max(map(len, times))
    print(f"{'command':<{width}}  median_s  min_s   max_s   x_baseline  target")
    ok = True
    for name, ts in times.items():
        med = statistics.median(ts)
        is_plan = name.startswith("plan")
        verdict = ("ok" if med < TARGET_S else "SLOW") if is_plan else "-"
        ok &= verdict != "SLOW"
        print(f"{name:<{width}}  {med:8.3f}  {min(ts):6.3f}  {max(ts):6.3f}  {med / base:10.1f}  "
              f"{verdict}")
    print(f"({args.repeats} interleaved repeats; target: plan median < {TARGET_S} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
