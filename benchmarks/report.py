"""Report of the benchmark campaign: each configuration's median, spread and ratio to stock.

    .venv/bin/python benchmarks/report.py [--csv modak_lib/data/measurements.csv | --store PATH]
                                          [--png benchmarks/report.png]

Stock is the framework's defaults: eager, default threads, glibc malloc, fp32.  The ratio
is the configuration's median steps/s over stock's median steps/s (above 1: faster).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modak_lib.perf.evaluate import is_stock, label as _label  # noqa: E402
from modak_lib.report import table_lines  # noqa: E402
from modak_lib.results import SHIPPED, ResultsStore  # noqa: E402


def summarise(df):
    df = df.copy()
    df["config"] = df.apply(_label, axis=1)
    df["stock"] = df.apply(is_stock, axis=1)
    keys = ["workload", "framework", "cpu_model", "cores", "batch_size", "image_size"]
    rows = []
    for key, g in df.groupby(keys, dropna=False):
        stock = g[g["stock"]]["steps_per_s"].median() if g["stock"].any() else float("nan")
        for cfg, c in g.groupby("config"):
            s = c["steps_per_s"]
            rows.append({"workload": key[0], "framework": key[1],
                         "target": f"{key[3]} cores, batch {int(key[4])}, {int(key[5])}px",
                         "config": cfg, "n": len(s), "median": s.median(), "min": s.min(),
                         "max": s.max(), "ratio": s.median() / stock,
                         "compile_s": c["compile_s"].median()})
    rows.sort(key=lambda r: (r["workload"], r["framework"], -r["ratio"]))
    return rows


def draw(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["framework"]) for r in rows})
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 2.2 + 0.45 * len(rows)),
                             squeeze=False)
    for ax, (w, fw) in zip(axes[:, 0], groups):
        g = [r for r in rows if (r["workload"], r["framework"]) == (w, fw)]
        names = [r["config"] for r in g]
        stock = g[[r["config"] for r in g].index("stock")]["median"] if "stock" in names else 1
        ratio = [r["ratio"] for r in g]
        err = [[r["ratio"] - r["min"] / stock for r in g], [r["max"] / stock - r["ratio"] for r in g]]
        colors = ["tab:green" if x > 1.02 else "tab:red" if x < 0.98 else "tab:gray" for x in ratio]
        ax.barh(names, ratio, xerr=err, color=colors, capsize=3)
        ax.axvline(1.0, color="k", lw=1)
        ax.invert_yaxis()
        ax.set_title(f"{w} ({fw}): steps/s relative to stock (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help=f"a dataset (default {SHIPPED.relative_to(ROOT)})")
    ap.add_argument("--store", help="read a results store instead")
    ap.add_argument("--png", default=str(ROOT / "benchmarks/report.png"))
    ap.add_argument("--source", default="campaign", help="only rows of this source ('' = all)")
    a = ap.parse_args()
    import pandas as pd
    df = pd.DataFrame(ResultsStore(a.store).rows()) if a.store else pd.read_csv(a.csv or SHIPPED)
    if a.source:
        df = df[df["source"] == a.source]
    rows = summarise(df)
    table = [[r["workload"], r["framework"], r["target"], r["config"], str(r["n"]),
              f"{r['median']:.2f}", f"{r['min']:.2f}-{r['max']:.2f}", f"{r['ratio']:.2f}x",
              f"{r['compile_s']:.1f}" if r["compile_s"] == r["compile_s"] else "-"]
             for r in rows]
    print("\n".join(table_lines(table, ["workload", "framework", "target", "configuration", "n",
                                        "steps/s", "min-max", "vs stock", "compile s"])))
    draw(rows, Path(a.png))
    print(f"\nwrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
