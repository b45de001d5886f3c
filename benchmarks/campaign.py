"""Benchmark campaign: run a configuration grid of the reference workloads on this host.

    .venv/bin/python benchmarks/campaign.py [--grid NAME ...] [--repeats 3] [--store PATH]
                                            [--csv modak_lib/data/measurements.csv]

Each grid point is a separate process running workloads/train.py with the MODAK_*
variables a job script would set.  One untimed warm-up run per grid comes first, then
the repeats are interleaved (A B C, A B C, ...) so that load on a shared machine hits
every configuration alike.  Every run is appended to the results store (the one the
performance model reads); --csv also writes the whole store as CSV.  Then the report
(benchmarks/report.py) prints medians, spreads and ratios to the stock configuration.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.results import ResultsStore, parse_fom_lines, row_from_fom  # noqa: E402

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def alloc(name: str, path: str) -> dict[str, str]:
    return {"LD_PRELOAD": path, "MODAK_ALLOCATOR": name}


# grid name -> (train.py arguments, [(configuration label, environment)])
GRIDS: dict[str, tuple[list[str], list[tuple[str, dict[str, str]]]]] = {
    "mnist-torch": (["--framework", "pytorch", "--model", "mnist-cnn", "--steps", "60"], [
        ("stock", {}),
        ("torch.compile", {"MODAK_TORCH_COMPILE": "default"}),
        ("threads=1", {"MODAK_THREADS": "1"}),
        ("tcmalloc", alloc("tcmalloc", TCMALLOC)),
        ("jemalloc", alloc("jemalloc", JEMALLOC)),
        ("bf16", {"MODAK_PRECISION": "bf16"}),
        ("channels-last", {"MODAK_CHANNELS_LAST": "1"}),
        ("onednn-off", {"MODAK_ONEDNN": "off"}),
        ("tcmalloc+bf16", {**alloc("tcmalloc", TCMALLOC), "MODAK_PRECISION": "bf16"}),
    ]),
    "mnist-keras": (["--framework", "keras", "--model", "mnist-cnn", "--steps", "60"], [
        ("stock", {}),
        ("xla", {"MODAK_JIT_COMPILE": "1"}),
        ("threads=1", {"MODAK_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}),
        ("bf16", {"MODAK_PRECISION": "bf16"}),
    ]),
    "resnet18-torch": (["--framework", "pytorch", "--model", "resnet18", "--image-size", "64",
                        "--batch-size", "16", "--steps", "15"], [
        ("stock", {}),
        ("torch.compile", {"MODAK_TORCH_COMPILE": "default"}),
        ("bf16", {"MODAK_PRECISION": "bf16"}),
        ("tcmalloc", alloc("tcmalloc", TCMALLOC)),
    ]),
}


def run_one(args: list[str], env: dict[str, str]) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MODAK_")}
    full.update(env, KERAS_BACKEND=env.get("KERAS_BACKEND", "tensorflow"))
    proc = subprocess.run([sys.executable, str(ROOT / "workloads/train.py"), *args],
                          capture_output=True, text=True, env=full, timeout=900)
    recs = parse_fom_lines(proc.stdout)
    if proc.returncode != 0 or len(recs) != 1:
        raise RuntimeError(f"run failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return recs[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", action="append", choices=sorted(GRIDS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", help="results store (default: $MODAK_RESULTS or ~/.local/...)")
    ap.add_argument("--csv", help="write the whole store as CSV here afterwards")
    ap.add_argument("--run-id", default=time.strftime("campaign-%Y%m%dT%H%M%S"))
    a = ap.parse_args()
    store = ResultsStore(a.store)
    for grid in a.grid or list(GRIDS):
        args, points = GRIDS[grid]
        missing = [label for label, env in points
                   if env.get("LD_PRELOAD") and not Path(env["LD_PRELOAD"]).exists()]
        if missing:
            print(f"   skipping {', '.join(missing)}: apt-get install libgoogle-perftools4 "
                  "libjemalloc2 (scripts/frontend install does)", flush=True)
        points = [(label, env) for label, env in points if label not in missing]
        print(f"== {grid}: {len(points)} configurations x {a.repeats} repeats", flush=True)
        run_one(args, points[0][1])  # warm-up: page cache, kernels, .pyc
        for r in range(a.repeats):
            for label, env in points:
                t0 = time.perf_counter()
                rec = run_one(args, env)
                store.append([row_from_fom(rec, source="campaign", run_id=f"{a.run_id}/{grid}",
                                           repeat=r, image="host", target=rec["host"]["hostname"])])
                print(f"  repeat {r} {label:<15} {rec['metrics']['steps_per_s']:7.2f} steps/s "
                      f"({time.perf_counter() - t0:5.1f} s)", flush=True)
    if a.csv:
        n = store.export_csv(a.csv)
        print(f"wrote {n} rows to {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
