"""The chosen configuration against stock, measured side by side in one run (not taken
from the dataset): MODAK plans MNIST-CNN for this machine with its performance model, then
both configurations train interleaved (A B A B ...) and the table shows the speedup.

    .venv/bin/python benchmarks/speedup.py [--repeats 5] [--steps 60]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.catalogue import load_catalogue  # noqa: E402
from modak_lib.perf.predictor import load_predictor  # noqa: E402
from modak_lib.pipeline import make_plan, option_environment  # noqa: E402
from modak_lib.readers import read_request  # noqa: E402
from modak_lib.report import table_lines  # noqa: E402
from modak_lib.results import parse_fom_lines  # noqa: E402


def run(env: dict[str, str], steps: int) -> float:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MODAK_")} | env
    proc = subprocess.run([sys.executable, str(ROOT / "workloads/train.py"), "--model",
                           "mnist-cnn", "--steps", str(steps)], capture_output=True, text=True,
                          env=full, timeout=900)
    recs = parse_fom_lines(proc.stdout)
    if proc.returncode or len(recs) != 1:
        raise SystemExit(f"run failed: {proc.stderr[-2000:]}")
    return recs[0]["metrics"]["steps_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    request = read_request(ROOT / "examples/mnist-cnn/blueprint.yaml",
                           infra=ROOT / "examples/infra/local.yaml")
    plan = make_plan(request, predictor=load_predictor("auto")).plan
    cat = load_catalogue()
    variant = cat.variant(plan.chosen.image)
    chosen_env = option_environment(plan.chosen, variant, request, cat)
    stock_env: dict[str, str] = {}
    preload = chosen_env.get("LD_PRELOAD")
    if preload and not Path(preload).exists():
        raise SystemExit(f"the chosen allocator needs {preload}: apt-get install "
                         "libgoogle-perftools4 libjemalloc2 (scripts/frontend install does)")
    print(f"plan ({plan.decided_by}): {plan.chosen.label()}")
    for note in plan.notes:
        print(f"note: {note}")
    speeds: dict[str, list[float]] = {"stock": [], "chosen": []}
    run(stock_env, 5)  # warm-up
    for _ in range(a.repeats):
        speeds["stock"].append(run(stock_env, a.steps))
        speeds["chosen"].append(run(chosen_env, a.steps))
    base = statistics.median(speeds["stock"])
    rows = [[name, f"{statistics.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}",
             f"{statistics.median(v) / base:.2f}x"] for name, v in speeds.items()]
    print("\n".join(table_lines(rows, ["configuration", "steps/s (median)", "min-max",
                                       "vs stock"])))
    print(f"chosen = {plan.chosen.label()}; {a.repeats} interleaved repeats of {a.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
