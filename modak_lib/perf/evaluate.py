"""Honest evaluation of the performance model, on medians of repeats.

A configuration's measured time is the median of its runs, each run first corrected by its
round's drift (``fit.round_shift``: the median over the round's runs of how far each is
from its configuration's level): on a shared machine the configurations of one
interleaved round are compared under the same load, and a round that ran slow for everyone
does not count as the configuration's time.

- **LOCO**: a configuration held out (the workload and the target were measured): the
  configurations are dealt into ``fit.LOCO_FOLDS`` folds, each held out in turn (one fit per
  configuration, 800 of them, took minutes and gave the same figure within a point);
- **LOWO**: a whole workload family held out (every batch size and configuration of it):
  how the model speaks for a user's new script;
- **LOTO**: a whole target held out: how it speaks for a machine it never measured;

each also **after the stock run** of the held-out (workload, batch, target): the model's
ratios to stock applied to that one measured time, as the planner does once a new workload's
first run (the budgeted search's stock trial) measured it; MAPE then on the other
configurations.  And the decisions those predictions make: for every (workload, batch, target) measured with
two or more configurations, the configuration the held-out model ranks fastest against the
best measured one (regret) and against stock (speed-up).  The seed paper's linear model and
the non-linear estimators are compared the same way.  Beside them, how far the data scatter:
within one machine (:func:`repeatability`) and between like machines
(:func:`reproducibility`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .features import TARGET_FIGURES
from .fit import (CONFIG_KEYS, ESTIMATORS, LOCO_FOLDS, LOSS_NAMES, TARGET_KEYS, ModelError,
                  config_groups, groups_of, held_out_predictions, machine_effects,
                  machine_labels, mape, ratios_to_stock, recorded_times, round_labels,
                  row_labels, stock_mask, target_id, training_frame, usable)

HOLD_OUT = {"loco": "configuration", "lowo": "workload", "loto": "target"}
# held out, then told the one stock run of the cell (what the budgeted search measures first
# of a new workload, and what the planner then corrects the model's level with); for LOCO
# (the workload and target known) it is how well the knobs' ratios to stock are learned when
# the family is in the data: beside LOWO's, the part of a new family's error that is its
# knobs' effects, not its level
ANCHORED = ("loco", "lowo", "loto")


def is_stock(row) -> bool:
    """Framework defaults: eager, all cores, glibc malloc, fp32, oneDNN on, NCHW."""
    import pandas as pd
    return bool(stock_mask(pd.DataFrame([dict(row)])).iloc[0])


def evaluate(df, estimator: str = "linear", compare=True) -> dict[str, Any]:
    """Held-out errors and decision quality (see the module docstring); ``compare``: the
    estimators to compare by their held-out MAPE (True: every one; their LOCO with the
    configurations dealt into ``fit.LOCO_FOLDS`` folds, as a fit estimates it)."""
    import numpy as np

    df = usable(training_frame(df)).copy()
    if df.empty:
        raise ModelError("nothing to evaluate: no measurement has both a workload fingerprint "
                         "and its target's measured figures (`modak probe`)")
    df["target"] = target_id(df)
    df["steady"] = np.exp(df["y"])  # each run's time less its round's drift
    df["configuration"] = config_groups(df)
    shared: dict = {}  # (the features and each fold's machine effects, for every estimator)
    for name, by in HOLD_OUT.items():  # (nothing to hold out of a single group)
        df[f"pred_{name}"] = (np.exp(held_out_predictions(
            df, estimator, by, LOCO_FOLDS if name == "loco" else None, shared))
            if groups_of(df, by).nunique() > 1 else np.nan)
    keys = TARGET_KEYS + CONFIG_KEYS + ["target"]
    cfg = (df.groupby(keys, dropna=False)
             .agg(measured=("steady", "median"), low=("steady", "min"),
                  high=("steady", "max"), n=("steady", "size"),
                  configuration=("configuration", "first"),
                  **{k: (f"pred_{k}", "median") for k in HOLD_OUT})
             .reset_index())
    cell = ["workload", "framework", "target", "batch_size", "image_size", *TARGET_FIGURES]
    cfg["stock"] = stock_mask(cfg) if len(cfg) else False
    for how in ANCHORED:  # after the stock trial: its measured level, the model's ratios
        cfg[f"{how}_stock"] = np.nan
        for _, g in cfg.groupby(cell, dropna=False):
            s = g[g["stock"]]
            if len(s) and s[how].notna().all():
                shift = s["measured"].iloc[0] / s[how].iloc[0]
                rest = g.index[~g["stock"]]
                cfg.loc[rest, f"{how}_stock"] = cfg.loc[rest, how] * shift
    runs = trial_runs(df)
    cells = row_labels(cfg, cell) if len(cfg) else None
    decisions = []
    for key, g in cfg.groupby(cell, dropna=False):
        if len(g) < 2:
            continue
        best = g.loc[g["measured"].idxmin()]
        kept = best_keeping_fp32(g)
        stock = g[g["stock"]]
        row = {"workload": key[0], "framework": key[1], "target": key[2],
               "batch_size": key[3], "best": label(best), "configurations": len(g)}
        if kept is not None:
            row["best_fp32"] = label(kept)
        for how in HOLD_OUT:
            if g[how].isna().all():
                continue
            chosen = planned(g, how)
            row[f"chosen_{how}"] = label(chosen)
            row[f"regret_{how}"] = float(chosen["measured"] / best["measured"] - 1)
            if kept is not None:
                row[f"regret_fp32_{how}"] = float(chosen["measured"] / kept["measured"] - 1)
            row[f"vs_stock_{how}"] = (float(stock["measured"].iloc[0] / chosen["measured"])
                                      if len(stock) else float("nan"))
            if how in ANCHORED and len(stock):
                found = searched(g, how, runs)
                row[f"searched_{how}"] = label(found)
                row[f"regret_search_{how}"] = float(found["measured"] / best["measured"] - 1)
                row[f"vs_stock_search_{how}"] = float(stock["measured"].iloc[0]
                                                      / found["measured"])
        decisions.append(row)

    def summary(by: str) -> list[dict[str, Any]]:
        out = []
        for name, g in cfg.groupby(by):
            d = [x for x in decisions if x[by] == name]
            rec = {by: name, "configurations": len(g)}
            for how in HOLD_OUT:
                rec[f"mape_{how}"] = mape(g["measured"], g[how])
                if how in ANCHORED:
                    rec[f"mape_{how}_stock"] = mape(g["measured"], g[f"{how}_stock"])
                r = [x[f"regret_{how}"] for x in d if f"regret_{how}" in x]
                v = [x[f"vs_stock_{how}"] for x in d if f"vs_stock_{how}" in x
                     and x[f"vs_stock_{how}"] == x[f"vs_stock_{how}"]]
                rec[f"regret_{how}"] = float(np.median(r)) if r else float("nan")
                rec[f"worst_vs_stock_{how}"] = float(min(v)) if v else float("nan")
            out.append(rec)
        return out

    overall = {}
    for how in HOLD_OUT:
        r = [x[f"regret_{how}"] for x in decisions if f"regret_{how}" in x]
        rf = [x[f"regret_fp32_{how}"] for x in decisions if f"regret_fp32_{how}" in x]
        v = [x[f"vs_stock_{how}"] for x in decisions if f"vs_stock_{how}" in x
             and x[f"vs_stock_{how}"] == x[f"vs_stock_{how}"]]
        rs = [x[f"regret_search_{how}"] for x in decisions if f"regret_search_{how}" in x]
        vs = [x[f"vs_stock_search_{how}"] for x in decisions if f"vs_stock_search_{how}" in x]
        overall[how] = {"mape": mape(cfg["measured"], cfg[how]),
                        "mape_after_stock": (mape(cfg["measured"], cfg[f"{how}_stock"])
                                             if how in ANCHORED else float("nan")),
                        "mape_level_given": (level_given(cfg["measured"], cfg[how], cells)
                                             if how in ANCHORED else float("nan")),
                        "median_regret": float(np.median(r)) if r else float("nan"),
                        "median_regret_fp32": float(np.median(rf)) if rf else float("nan"),
                        "worst_vs_stock": float(min(v)) if v else float("nan"),
                        "median_regret_search": float(np.median(rs)) if rs else float("nan"),
                        "worst_vs_stock_search": float(min(vs)) if vs else float("nan"),
                        "decisions": len(r)}
    estimators = {}
    for name in (ESTIMATORS if compare is True else compare or ()):
        if name not in ESTIMATORS:
            raise ModelError(f"unknown estimator {name!r} (one of {', '.join(ESTIMATORS)})")
        estimators[name] = {how: mape(np.exp(df["y"]), np.exp(held_out_predictions(
            df, name, by, LOCO_FOLDS if how == "loco" else None, shared)))
            for how, by in HOLD_OUT.items() if groups_of(df, by).nunique() > 1}
    return {"estimator": estimator, "overall": overall, "per_family": summary("workload"),
            "per_target": summary("target"), "decisions": decisions, "configurations": cfg,
            "estimators": estimators, "rows": int(len(df)), "machines": machines(df),
            "repeatability": repeatability(df), "reproducibility": reproducibility(df),
            "round_scatter": round_scatter(df)}


def planned(g, how: str):
    """The configuration the planner runs from the held-out predictions ``g[how]`` of one
    cell: the fastest predicted, unless it would not make a step ``search.MIN_GAIN`` shorter
    than stock's prediction (``planner._within_margin``): then stock.  The fastest reduces
    precision: the fastest predicted that keeps fp32 instead, where there is one
    (``planner._unchecked_precision``: a held-out configuration has no run that shows it
    keeps the script's loss; the search's trials check it)."""
    from .search import clears_margin

    predicted = g[g[how].notna()].sort_values(how, kind="stable")
    fp32 = predicted[predicted["precision"] == "fp32"]
    chosen = fp32.iloc[0] if len(fp32) else predicted.iloc[0]
    stock = g[g["stock"] & g[how].notna()]
    if len(stock) and not chosen["stock"] and \
            not clears_margin(chosen[how], stock[how].iloc[0]):
        return stock.iloc[0]
    return chosen


def best_keeping_fp32(g):
    """The fastest measured configuration of a cell that keeps fp32 (None: none does).  The
    model alone chooses among these (``planned``): a reduced precision needs a run that
    shows it keeps the loss, which only the search's trials give; its regret against this
    one is how well it ranks what it may choose, its regret against the best measured one
    also counts the bf16 gains only a trial can take."""
    fp32 = g[g["precision"] == "fp32"]
    return fp32.loc[fp32["measured"].idxmin()] if len(fp32) else None


def level_given(measured, predicted, cells) -> float:
    """MAPE of ``predicted`` once each cell's level is given: every prediction divided by
    the geometric mean of its cell's predicted-over-measured ratios, so what is left is how
    far the configurations' times relative to one another are off, plus the scatter of the
    measured medians.  A held-out error far above it is the level of a new workload or
    target (how fast it runs at all); near it, the knobs' effects."""
    import numpy as np
    import pandas as pd

    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    ok = ~np.isnan(p) & (m > 0) & (p > 0)
    if not ok.any():
        return float("nan")
    err = pd.Series(np.log(p[ok] / m[ok]))
    level = err.groupby(np.asarray(cells)[ok]).transform("mean").to_numpy()
    return float(np.mean(np.abs(np.exp(err.to_numpy() - level) - 1.0)))


def machines(df) -> list[dict[str, Any]]:
    """Per machine (its target's probe figures) of a target measured on two or more: its
    runs and its effect on all the data (``fit.machine_effects``, None where it shares no
    run with another), as a factor on time."""
    import math

    labels = machine_labels(df)
    effects = machine_effects(df, labels)
    out = []
    for (target, label), g in df.groupby([df["target"], labels], sort=True):
        out.append({"target": target, "machine": label, "runs": int(len(g)),
                    "factor": math.exp(effects[label]) if label in effects else None})
    counts: dict[str, int] = {}
    for m in out:
        counts[m["target"]] = counts.get(m["target"], 0) + 1
    return [m for m in out if counts[m["target"]] > 1]


def repeatability(df) -> dict[str, Any]:
    """How well the measurements predict themselves: each run of a configuration measured
    two or more times against the median of its other runs (round-corrected, as the model
    sees them), as a MAPE.  The medians the model is judged on carry this scatter (less,
    by the number of repeats), so a held-out MAPE near it is as good as the data can show.
    Stock runs are left out: the round correction makes them their cell's level by
    construction."""
    import numpy as np

    errors, repeated = [], 0
    for _, g in df[~stock_mask(df).to_numpy()].groupby("configuration"):
        times = g["steady"].to_numpy(dtype=float)
        if len(times) < 2:
            continue
        repeated += 1
        for i in range(len(times)):
            rest = np.median(np.delete(times, i))
            errors.append(abs(times[i] - rest) / rest)
    return {"mape": float(np.mean(errors)) if errors else float("nan"),
            "configurations": repeated}


def round_scatter(df) -> dict[str, Any]:
    """How far a configuration's time ratio to stock scatters from one interleaved round to
    the next: per configuration measured beside its cell's stock run in two or more rounds
    (``fit.round_labels``), the standard deviation of its log time ratio to that stock run
    over the rounds; their median (robust to the few cells whose runs went wild).  What one
    round of the budgeted search can tell apart from noise: ``search.TRIAL_SCATTER`` is
    this figure on the shipped data, and a gain over n rounds must clear it over sqrt(n)."""
    import numpy as np
    import pandas as pd

    rounds = round_labels(df)
    d = pd.DataFrame({"config": config_groups(df).to_numpy(), "round": rounds,
                      "ratio": ratios_to_stock(np.log(df["s_per_step"].astype(float)),
                                               rounds, rounds, stock_mask(df))})
    per_round = d.dropna(subset="ratio").groupby(["config", "round"])["ratio"].median()
    spread = per_round.groupby(level="config").agg(["std", "size"])
    spread = spread[spread["size"] >= 2]["std"]
    return {"scatter": float(spread.median()) if len(spread) else float("nan"),
            "configurations": int(len(spread))}


def reproducibility(df) -> dict[str, Any]:
    """How far a configuration's time scatters between like machines (the same nominal
    target: CPU, cores and GPU; a machine: the figures its probe measured, as in
    ``fit.TARGET_KEYS``), once each machine's own speed is taken out: the machines'
    factors are estimated from the **other** families' medians (median polish of
    configuration and machine, ``fit._polish``), and each configuration measured on two or
    more machines is judged against its best single value (the one of least MAPE over
    those machines).

    That is what a model that gives like machines one prediction, and knows the workload
    perfectly, still misses: the part of a workload's speed that the target's description
    does not carry.  Beside ``repeatability`` (the scatter within one machine), it says how
    much of a held-out error the data themselves explain."""
    import numpy as np

    from .fit import _polish

    machine_keys = [k for k in TARGET_FIGURES if k in df]
    out = {"mape": float("nan"), "configurations": 0, "targets": 0}
    if not machine_keys or df.empty:
        return out
    d = df.assign(_machine=row_labels(df, machine_keys))
    keys = ["workload", "framework", "batch_size", "image_size", *CONFIG_KEYS]
    med = (d.groupby(["target", "_machine", *keys], dropna=False)["steady"].median()
           .reset_index())
    med["_config"] = row_labels(med, keys).to_numpy()
    errors, targets = [], set()
    for target, g in med.groupby("target", dropna=False):
        machines = g["_machine"].to_numpy()
        if len(set(machines)) < 2:
            continue
        index = {m: i for i, m in enumerate(sorted(set(machines)))}
        rounds = np.array([index[m] for m in machines])
        y, configs = np.log(g["steady"].to_numpy(dtype=float)), g["_config"].to_numpy()
        family = g["workload"].astype(str).to_numpy()
        for w in set(family):
            mine, others = family == w, family != w
            effect = np.full(len(index), np.nan)
            seen = np.unique(rounds[others])
            if len(seen) < 2:
                continue
            effect[rounds[others]] = _polish(y[others], configs[others], rounds[others])
            for c in set(configs[mine]):
                rows = mine & (configs == c) & ~np.isnan(effect[rounds])
                if rows.sum() < 2:
                    continue
                times = np.exp(y[rows] - effect[rounds[rows]])
                best = _least_mape(times)
                errors += list(np.abs(best / times - 1))
                targets.add(str(target))
                out["configurations"] += 1
    out.update(mape=float(np.mean(errors)) if errors else float("nan"), targets=len(targets))
    return out


def _least_mape(values):
    """The single value of least mean |p / v - 1| over ``values``: their median weighted
    by 1 / v (the sum is piecewise linear in p, with slopes changing by 2 / v at each v)."""
    import numpy as np

    v = np.sort(np.asarray(values, dtype=float))
    weights = np.cumsum(1.0 / v)
    return float(v[np.searchsorted(weights, weights[-1] / 2.0)])


@dataclass(frozen=True)
class _Candidate:
    """A measured configuration as the search sees it (its label, as the evaluation
    prints it, and its compiler: None when off)."""
    name: str
    compiler: Any = None

    def label(self) -> str:
        return self.name


# a run's loss columns, which :class:`.search.Trial` names alike
LOSSES = tuple(col for col, _name in LOSS_NAMES)


def trial_runs(df) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """Per measured configuration, its runs in the order they ran: (s/step, its losses:
    the last, the mean over the run's second half, the first sampled; None where not
    recorded)."""
    import pandas as pd

    d = df.assign(_t=recorded_times(df) if "recorded_at" in df else 0)
    for col in LOSSES:
        loss = d[col] if col in d else pd.Series(None, index=d.index)
        d = d.assign(**{"_" + col: pd.to_numeric(loss, errors="coerce")})
    d = d.sort_values("_t", kind="stable")
    out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for key, g in d.groupby("configuration"):
        out[key] = [(float(r["s_per_step"]), {c: None if r["_" + c] != r["_" + c]
                                              else float(r["_" + c]) for c in LOSSES})
                    for _, r in g.iterrows()]
    return out


def searched(g, how: str, runs: dict):
    """The configuration the budgeted search (:class:`.search.Halving`) settles on when the
    held-out model proposes its top ``planner.AUTOTUNE_K`` (as the planner takes them,
    :func:`.search.first_round`: nothing of the held-out family was measured) and stock is
    added: every trial is one recorded run of the configuration (round n of the search,
    its n-th run, as measured, loss included), so the search decides on single noisy runs
    while the regret is judged on the medians.  Compile time is left out (amortised over a
    long job), as the regret leaves it out."""
    from ..planner import AUTOTUNE_K, LOSS_TOLERANCE
    from .search import Halving, Trial, first_round

    rows = {label(r): r for _, r in g.iterrows()}
    stock = _Candidate(label(g[g["stock"]].iloc[0]))
    top = first_round([(_Candidate(label(r), None if r["compiler"] == "off" else r["compiler"]),
                        False) for _, r in g.sort_values(how).iterrows()], AUTOTUNE_K, stock)
    h = Halving(top, stock, job_steps=1, budget_s=float("inf"),
                loss_tolerance=LOSS_TOLERANCE)
    while (step := h.next_round()) is not None:
        trials = []
        for c in step[0]:
            measured = runs.get(rows[c.name]["configuration"]) or []
            s, losses = measured[h.out.rounds % len(measured)] if measured else (None, {})
            trials.append(Trial(c, steps=step[1], s_per_step=s, **losses,
                                failed=None if measured else "not measured"))
        h.record(trials)
    return rows[h.outcome().chosen.name]


def label(row) -> str:
    parts = [] if row["compiler"] == "off" else [row["compiler"]]
    if float(row["threads"]) != float(row["cores"]):
        parts.append(f"threads={int(row['threads'])}")
    if row["allocator"] != "glibc":
        parts.append(row["allocator"])
    if row["precision"] != "fp32":
        parts.append(row["precision"])
    if int(row["channels_last"]):
        parts.append("channels-last")
    if not int(row["onednn"]):
        parts.append("onednn-off")
    return "+".join(parts) or "stock"



def plot(result: dict[str, Any], path: Path) -> Path:
    """Predicted (configuration held out) against measured seconds per step: one colour per
    workload and framework, min-max of the repeats as error bars, and the band that holds
    90% of the held-out errors around the diagonal."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cfg = result["configurations"]
    groups = list(cfg.groupby(["workload", "framework"], dropna=False))
    colours = plt.get_cmap("tab20" if len(groups) > 10 else "tab10")
    markers = {"pytorch": "o", "keras": "s", "tensorflow": "s"}
    fig, ax = plt.subplots(figsize=(9.0, 6.0))
    lo = min(cfg["measured"].min(), cfg["lowo"].min()) * 0.7
    hi = max(cfg["measured"].max(), cfg["lowo"].max()) * 1.4
    errors = np.abs(np.log(cfg["lowo"] / cfg["measured"]))
    band = float(np.quantile(errors, 0.9)) if len(errors) else 0.0
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * np.exp(-band), line * np.exp(band), color="0.88",
                    label=f"90% of held-out errors (within x{np.exp(band):.2f})")
    ax.plot(line, line, "k--", lw=1, label="predicted = measured")
    for i, ((workload, framework), g) in enumerate(groups):
        ax.errorbar(g["measured"], g["lowo"],
                    xerr=[g["measured"] - g["low"], g["high"] - g["measured"]],
                    fmt=markers.get(str(framework), "^"), color=colours(i % colours.N),
                    label=f"{workload} ({framework}, {len(g)} configs)", alpha=0.85,
                    capsize=2, markersize=6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    for axis in (ax.xaxis, ax.yaxis):  # 0.02, 0.05, 0.1, ...: no overlapping 10^x labels
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured seconds per step (median; bars: min-max of repeats)", fontsize=11)
    ax.set_ylabel("predicted seconds per step\n(its workload family held out of the fit)",
                  fontsize=11)
    ax.set_title("MODAK performance model: held-out predictions", fontsize=12)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
