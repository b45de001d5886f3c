"""Give the shipped dataset's rows the fingerprint of their workload, measured by the runtime.

    .venv/bin/python benchmarks/fingerprint_dataset.py [--csv modak_lib/data/measurements.csv]

The dataset was measured before the runtime existed (schema 1).  For each (workload,
framework, batch, image size) in it, this runs workloads/train.py through the runtime for
two steps (``MODAK_MAX_STEPS=2``: the fingerprint is taken on the first step) and writes
the fingerprint's columns (id, parameters, FLOPs per step and their shares by layer kind,
the elements a step writes, input shape) into every row of that group, in the store's
column order.  Idempotent: a group is run again only while it lacks one of them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.results import COLUMNS, parse_fom_lines, row_from_fom  # noqa: E402

FIELDS = ["fingerprint", "trainable_parameters", "flops_per_step", "elements_per_step",
          "input_shape"] + \
    [c for c in COLUMNS if c.startswith("flops_") and c != "flops_per_step"]


def fingerprint(workload: str, framework: str, batch: int, image_size: int) -> dict:
    args = ["--framework", framework, "--model", workload, "--batch-size", str(batch),
            "--steps", "2", "--warmup", "0"]
    if workload != "mnist-cnn":
        args += ["--image-size", str(image_size)]
    env = dict(os.environ, MODAK_MAX_STEPS="2", MODAK_WORKLOAD=workload)
    proc = subprocess.run([sys.executable, "-m", "modak_runtime", "--",
                           str(ROOT / "workloads/train.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    recs = parse_fom_lines(proc.stdout)
    if not recs or recs[-1]["status"] == "failed":
        raise SystemExit(f"{workload}/{framework}: no fingerprint\n{proc.stderr[-2000:]}")
    return row_from_fom(recs[-1], source="campaign")


def main() -> int:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(ROOT / "modak_lib/data/measurements.csv"))
    a = p.parse_args()
    df = pd.read_csv(a.csv)
    for col in COLUMNS:
        if col not in df:
            df[col] = "ok" if col == "status" else None
    df["fingerprint"] = df["fingerprint"].astype(object)
    df["input_shape"] = df["input_shape"].astype(object)
    for key, g in df.groupby(["workload", "framework", "batch_size", "image_size"]):
        if g["fingerprint"].notna().all() and g["elements_per_step"].notna().all():
            continue
        row = fingerprint(key[0], key[1], int(key[2]), int(key[3]))
        print(f"{key}: {row['fingerprint']} params={row['trainable_parameters']} "
              f"flops/step={row['flops_per_step']:.4g} shape={row['input_shape']}")
        for field in FIELDS:
            df.loc[g.index, field] = json.dumps(row[field]) if isinstance(row[field], list) \
                else row[field]
    df[list(COLUMNS)].to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
