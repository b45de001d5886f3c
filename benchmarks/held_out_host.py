"""Each host held out of the performance model in turn: how well it predicts a machine it
has never measured.

    .venv/bin/python benchmarks/held_out_host.py [--estimator extra-trees] [--data CSV ...]

``modak model eval`` holds out a configuration, a workload family or a target; a target
(``fit.target_id``: the CPU as archspec names it, its cores, its GPU) is often measured on
several hosts, the campaign's sessions' machines, and archspec gives one name to unlike CPUs
(``x86_64_v4``).  This holds out a host (``fit.host_labels``: one boot of one machine, all the
targets the campaign made of it) and fits on every other, as the model meets a new machine:
its targets' probed figures known, none of its runs, its machine effect
(``fit.machine_effects``) not yet learned.  The shipped datasets (and ``--data``) are read
as ``modak model eval`` reads them, without the results store.

Prints, per host and framework: the measured configurations, the MAPE of the held-out
predictions on their medians, and the median ratio predicted/measured (above 1: predicted
too slow).  Rows recorded before the runtime kept a boot id are one host (``no boot id``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modak_lib.perf.fit import (  # noqa: E402
    ESTIMATORS, config_groups, held_out_predictions, host_labels, mape, target_id,
    training_frame, usable)
from modak_lib.results import load_frame  # noqa: E402


def held_out_by_host(df, estimator: str):
    """Per configuration (median of its repeats) of each host: measured and predicted
    seconds per step, the host held out of the fit."""
    import numpy as np

    df = usable(training_frame(df)).copy()
    df["host"] = host_labels(df)
    df["predicted"] = np.exp(held_out_predictions(df, estimator, "host"))
    df["measured"] = np.exp(df["y"])  # each run's time less its round's drift
    df["configuration"] = config_groups(df)
    df["target"] = target_id(df)
    return (df.groupby(["host", "framework", "configuration"], dropna=False)
              .agg(measured=("measured", "median"), predicted=("predicted", "median"),
                   cpu=("cpu_model", "first"), target=("target", "first"))
              .reset_index())


def table(cfg) -> list[dict]:
    import numpy as np

    rows = []
    for (host, framework), g in cfg.groupby(["host", "framework"], dropna=False):
        if g["predicted"].isna().all():
            continue
        rows.append({"host": host[:8], "cpu": str(g["cpu"].iloc[0])[:28],
                     "targets": ", ".join(sorted(g["target"].unique())),
                     "framework": framework, "configurations": len(g),
                     "mape": mape(g["measured"], g["predicted"]),
                     "ratio": float(np.median(g["predicted"] / g["measured"]))})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--estimator", default="extra-trees", choices=ESTIMATORS)
    ap.add_argument("--data", action="append", default=[], help="another campaign's CSV")
    a = ap.parse_args()
    cfg = held_out_by_host(load_frame(extra=a.data), a.estimator)
    rows = table(cfg)
    head = ["host", "cpu", "targets", "framework", "configs", "MAPE", "predicted/measured"]
    cells = [[r["host"], r["cpu"], r["targets"], r["framework"], str(r["configurations"]),
              f"{r['mape']:.1%}", f"{r['ratio']:.2f}"] for r in rows]
    width = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print(f"estimator {a.estimator}; each host held out of the fit in turn; MAPE on medians "
          "of repeats")
    print("  ".join(h.ljust(w) for h, w in zip(head, width)))
    print("  ".join("-" * w for w in width))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, width)))
    print(f"all hosts: {mape(cfg['measured'], cfg['predicted']):.1%} MAPE over "
          f"{len(cfg)} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
