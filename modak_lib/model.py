"""The performance model: seconds per training step from measured runs.

Fitted with pandas and scikit-learn on the results store (plus the dataset MODAK ships).
The default estimator is the seed paper's linear statistical model: a linear regression of
log(seconds per step) on the features and their pairwise interactions (ridge-regularised,
since the interactions outnumber the measurements).  Other estimators are fitted too and
replace it only when they predict clearly better on held-out configurations.

A fitted model is a versioned artefact (joblib + JSON): the feature list, a fingerprint
of the training data, the library versions, the held-out error.  Loading it with other
library versions is an error, never a silent mis-prediction.

The planner gets a :class:`ModelPredictor`.  For a configuration that was measured on
the same target, it answers with the measured median (measurements beat models); for a
workload/target with too few measured configurations (a cold start) it answers nothing,
and the planner falls back to its documented prior.
"""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .paths import data_file
from .errors import ModakError
from .predict import BF16_FLAGS, CATEGORICAL, CONFIG_KEYS, NUMERIC, FastPredictor

PREFER_MARGIN = 0.10   # another estimator must beat the linear model's held-out MAPE by 10%
TARGET_KEYS = ["fingerprint", "workload", "framework", "microarchitecture", "cores", "batch_size",
               "image_size"]
INT_KEYS = ("threads", "channels_last", "onednn", "batch_size", "cores")


class ModelError(ModakError):
    pass


def default_path() -> Path:
    return data_file("MODAK_MODEL", "model.joblib")


def library_versions() -> dict[str, str]:
    import numpy
    import pandas
    import sklearn
    return {"scikit-learn": sklearn.__version__, "pandas": pandas.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()[:4].rstrip("."),
            "modak": __version__}


# ---------------------------------------------------------------------------
# features
def feature_frame(df):
    """Model inputs from store-shaped rows (one row per measurement or candidate)."""
    import numpy as np
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    fp = df["fingerprint"] if "fingerprint" in df else pd.Series(None, index=df.index)
    out["fingerprint"] = fp.astype(object).where(fp.notna(), df["workload"]).astype(str)
    out["framework"] = df["framework"].astype(str)
    out["compiler"] = df["compiler"].fillna("off").astype(str)
    out["allocator"] = df["allocator"].fillna("glibc").astype(str)
    out["precision"] = df["precision"].fillna("fp32").astype(str)
    out["channels_last"] = df["channels_last"].fillna(0).astype(int).astype(str)
    out["onednn"] = df["onednn"].fillna(1).astype(int).astype(str)
    out["microarchitecture"] = df["microarchitecture"].fillna("unknown").astype(str)
    out["accelerator"] = df["accelerator"].astype(object).fillna("none").astype(str)
    bf16 = df["bf16_native"] if "bf16_native" in df else pd.Series(False, index=df.index)
    out["bf16_native"] = bf16.fillna(False).astype(bool).astype(str)
    out["log_params"] = np.log(pd.to_numeric(df["trainable_parameters"]).astype(float))
    flops = pd.to_numeric(df.get("flops_per_step", pd.Series(np.nan, index=df.index)))
    out["log_flops"] = np.log(flops.astype(float) / df["batch_size"].astype(float))
    out["log_batch"] = np.log(df["batch_size"].astype(float))
    out["log_threads"] = np.log(df["threads"].astype(float))
    out["log_cores"] = np.log(df["cores"].astype(float))
    return out


def _bf16_from_raw(raw: Any) -> bool:
    """Whether a stored run's host had native bf16 (from its figure-of-merit record)."""
    try:
        host = json.loads(raw).get("host", {})
    except (TypeError, ValueError):
        return False
    return bool(BF16_FLAGS & set(host.get("cpu_features", []) or [])) or \
        host.get("microarchitecture") in {"zen4", "zen5", "sapphirerapids", "cooperlake"}


def training_frame(df):
    import numpy as np

    df = df.copy()
    if "status" in df:  # failed runs stay in the store (never chosen again), not in the fit
        df = df[df["status"].fillna("ok") != "failed"].copy()
    bad = ~(df["s_per_step"].astype(float) > 0)
    if bad.any():
        raise ModelError(f"{int(bad.sum())} measurements have no positive s_per_step")
    if "bf16_native" not in df:
        flag = [_bf16_from_raw(r) for r in df.get("raw", [None] * len(df))]
        df["bf16_native"] = flag
        # a host either has the instructions or not: one record that says so is enough
        host = df["cpu_model"].astype(str) + "|" + df["microarchitecture"].astype(str)
        df["bf16_native"] = host.map(df.groupby(host)["bf16_native"].max())
    df["y"] = np.log(df["s_per_step"].astype(float))
    return df


def fingerprint(df) -> str:
    cols = [c for c in ["workload", "framework", "s_per_step", "recorded_at", "run_id", "repeat"]
            if c in df]
    text = df[cols].astype(object).where(df[cols].notna(), "-").astype(str) \
        .sort_values(cols).to_csv(index=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------
# estimators
MIN_SCALE = 0.25  # log units: a feature that barely varies is not scaled up into a lever


_FLOOR_SCALER = None


def _floor_scaler():
    """The scaler class, made on first use (planning imports no scikit-learn) and kept, so
    that a saved model unpickles it as ``modak_lib.model.FloorScaler``."""
    global _FLOOR_SCALER
    if _FLOOR_SCALER is None:
        from sklearn.preprocessing import StandardScaler

        class FloorScaler(StandardScaler):
            """StandardScaler whose scale is at least MIN_SCALE: two workloads whose FLOPs
            differ by 0.5% must not make FLOPs a lever that extrapolates 100x to a third."""

            def fit(self, X, y=None, sample_weight=None):
                super().fit(X, y, sample_weight)
                import numpy as np
                self.scale_ = np.maximum(self.scale_, MIN_SCALE)
                return self

        FloorScaler.__module__ = __name__
        FloorScaler.__qualname__ = "FloorScaler"
        _FLOOR_SCALER = FloorScaler
    return _FLOOR_SCALER


def __getattr__(name: str):  # pickle looks the class up by name
    if name == "FloorScaler":
        return _floor_scaler()
    raise AttributeError(name)


def make_estimator(name: str):
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, PolynomialFeatures
    import numpy as np

    pre = ColumnTransformer([
        ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), CATEGORICAL),
        ("num", _floor_scaler()(), NUMERIC)])
    if name == "linear":  # the seed paper's linear model, with pairwise interactions
        return Pipeline([("pre", pre),
                         ("inter", PolynomialFeatures(2, interaction_only=True,
                                                      include_bias=False)),
                         ("reg", RidgeCV(alphas=np.logspace(-3, 2, 11)))])
    if name == "linear-main":  # main effects only (a baseline)
        return Pipeline([("pre", pre), ("reg", RidgeCV(alphas=np.logspace(-3, 2, 11)))])
    if name == "gbr":
        return Pipeline([("pre", pre), ("reg", GradientBoostingRegressor(random_state=0))])
    if name == "forest":
        return Pipeline([("pre", pre), ("reg", RandomForestRegressor(200, random_state=0))])
    raise ModelError(f"unknown estimator {name!r}")


ESTIMATORS = ("linear", "linear-main", "gbr", "forest")
QUICK_ESTIMATORS = ("linear", "linear-main")  # refits on the way (seconds, not minutes)


def config_groups(df):
    """One label per measured configuration (all repeats of it share the label)."""
    keys = TARGET_KEYS + CONFIG_KEYS
    # (pandas 3 keeps missing values missing through astype(str))
    return df[keys].astype(object).where(df[keys].notna(), "-").astype(str).agg("|".join, axis=1)


def held_out_predictions(df, name: str, by: str = "configuration"):
    """Leave-one-configuration-out (or -workload-out) predictions of log s/step."""
    import numpy as np

    X, y = feature_frame(df), df["y"].to_numpy()
    groups = config_groups(df) if by == "configuration" else df["workload"].astype(str)
    pred = np.full(len(df), np.nan)
    for g in groups.unique():
        test = (groups == g).to_numpy()
        if test.all():
            continue
        est = make_estimator(name).fit(X[~test], y[~test])
        pred[test] = est.predict(X[test])
    return pred


def mape(measured, predicted) -> float:
    import numpy as np
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    ok = ~np.isnan(p)
    return float(np.mean(np.abs(p[ok] - m[ok]) / m[ok])) if ok.any() else float("nan")


# ---------------------------------------------------------------------------
@dataclass
class FittedModel:
    estimator: Any
    name: str
    meta: dict[str, Any]
    data: Any = field(repr=False, default=None)  # the training frame (for measured lookups)

    def save(self, path: Path) -> None:
        import joblib
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        joblib.dump({"estimator": self.estimator, "name": self.name, "meta": self.meta,
                     "data": self.data}, tmp)
        tmp.replace(path)  # atomic: a killed fit leaves the previous model
        path.with_suffix(".json").write_text(json.dumps(self.meta, indent=2) + "\n")

    def predict_log(self, frame):
        return self.estimator.predict(feature_frame(frame))


def fit(df, estimators: Sequence[str] = ESTIMATORS) -> FittedModel:
    """Fit every estimator, compare them on held-out configurations, keep the best."""
    import numpy as np

    workloads = workload_table(df)
    df = training_frame(df)
    n_cfg = config_groups(df).nunique()
    if len(df) < 8 or n_cfg < 3:
        raise ModelError(f"too little data to fit: {len(df)} measurements of {n_cfg} "
                         "configurations (need 8 and 3)")
    scores = {}
    residual = {}
    for name in estimators:
        pred = held_out_predictions(df, name)
        scores[name] = mape(np.exp(df["y"]), np.exp(pred))
        residual[name] = df["y"].to_numpy() - pred
    best = "linear" if "linear" in scores else estimators[0]
    challenger = min(scores, key=scores.get)
    if scores[challenger] < scores[best] * (1 - PREFER_MARGIN):
        best = challenger
    res = residual[best][~np.isnan(residual[best])]
    sigma = float(np.sqrt(np.mean(res ** 2))) if len(res) else 0.5
    est = make_estimator(best).fit(feature_frame(df), df["y"].to_numpy())
    meta = {
        "model_id": f"{best}-{fingerprint(df)}",
        "estimator": best, "features": CATEGORICAL + NUMERIC,
        "target": "log(seconds per step)", "rows": int(len(df)),
        "configurations": int(n_cfg), "data_fingerprint": fingerprint(df),
        "held_out_mape": {k: round(v, 4) for k, v in scores.items()},
        "sigma_log": round(sigma, 4), "versions": library_versions(),
        "fitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if best in ("linear", "linear-main"):
        meta["light"] = {"formula": export_linear(est), "measured": measured_groups(df),
                         "workloads": workloads}
    keep = df[TARGET_KEYS + CONFIG_KEYS + ["s_per_step", "accelerator", "source"]].copy()
    meta.setdefault("light", {})["workloads"] = workloads
    return FittedModel(est, best, meta, keep)


def export_linear(est) -> dict[str, Any]:
    """A fitted linear pipeline as numbers that ``predict.LinearFormula`` evaluates."""
    pre, reg = est.named_steps["pre"], est.named_steps["reg"]
    cat, num = pre.named_transformers_["cat"], pre.named_transformers_["num"]
    terms = None
    if "inter" in est.named_steps:
        terms = [[i for i, p in enumerate(row) if p] for row in est.named_steps["inter"].powers_]
    return {"categories": [[str(c) for c in cats] for cats in cat.categories_],
            "mean": num.mean_.tolist(), "scale": num.scale_.tolist(), "terms": terms,
            "coef": reg.coef_.tolist(), "intercept": float(reg.intercept_)}


def measured_groups(df) -> list[dict[str, Any]]:
    """Median, min, max and count of s/step per measured configuration and target."""
    keys = ["fingerprint", "workload", "microarchitecture", "cores", "framework",
            "batch_size"] + CONFIG_KEYS
    d = df.copy()
    if "fingerprint" not in d:
        d["fingerprint"] = None
    for k in INT_KEYS:
        d[k] = d[k].astype(float).round().astype(int)
    out = []
    for key, g in d.groupby(keys, dropna=False):
        rec = {k: _plain(v) for k, v in zip(keys, key)}
        s = g["s_per_step"].astype(float)
        rec.update(median=float(s.median()), min=float(s.min()), max=float(s.max()), n=len(s))
        out.append(rec)
    return out


def _plain(v: Any) -> Any:
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and v != v else v


def workload_table(df) -> list[dict[str, Any]]:
    """Per workload (its key, else its label and framework): the latest fingerprint, the
    knobs the runtime could not apply to it, and the configurations it failed under."""
    import pandas as pd

    d = df.copy()
    for col in ("workload_key", "fingerprint", "status", "not_applied", "failed_knob", "error",
                "flops_per_step", "run_id"):
        if col not in d:
            d[col] = None
    d["status"] = d["status"].fillna("ok")
    ident = d["workload_key"].astype(object).where(
        d["workload_key"].notna(), "label:" + d["workload"].astype(str) + "/"
        + d["framework"].astype(str) + "/" + d["batch_size"].astype(str))
    out = []
    for _, g in d.groupby(ident, sort=True):
        ok = g[g["status"] != "failed"]
        last = (ok if len(ok) else g).iloc[-1]
        entry = {k: _plain(last[k]) for k in ("workload_key", "workload", "fingerprint",
                                              "framework", "trainable_parameters",
                                              "flops_per_step", "batch_size", "image_size")}
        not_applied: dict[str, str] = {}
        for raw, names in zip(g.get("raw", pd.Series(None, index=g.index)), g["not_applied"]):
            if isinstance(names, str) and names:
                reasons = {}
                try:
                    reasons = json.loads(raw).get("not_applied", {})
                except (TypeError, ValueError, AttributeError):
                    pass
                for n in names.split(","):
                    not_applied[n] = str(reasons.get(n, "not applied"))[:200]
        entry["not_applied"] = not_applied
        entry["failed"] = [{**{k: _plain(r[k]) for k in CONFIG_KEYS},
                            "knob": _plain(r["failed_knob"]), "run_id": _plain(r["run_id"]),
                            "error": str(_plain(r["error"]) or "")[:200]}
                           for _, r in g[g["status"] == "failed"].iterrows()]
        out.append(entry)
    return out


def load(path: Path | None = None) -> FittedModel:
    import joblib

    path = path or default_path()
    if not path.exists():
        raise ModelError(f"{path}: no fitted model (run `modak model fit`)")
    try:
        blob = joblib.load(path)
        meta = blob["meta"]
    except Exception as exc:  # a corrupt or foreign file
        raise ModelError(f"{path}: not a MODAK model ({type(exc).__name__}: {exc})") from None
    now = library_versions()
    for lib in ("scikit-learn", "numpy", "modak"):
        if meta.get("versions", {}).get(lib) != now[lib]:
            raise ModelError(f"{path}: fitted with {lib} {meta.get('versions', {}).get(lib)}, "
                             f"this is {now[lib]}: refit with `modak model fit`")
    return FittedModel(blob["estimator"], blob["name"], meta, blob.get("data"))


def fit_from_store(store_path=None, out: Path | None = None) -> FittedModel:
    from .results import ResultsStore, load_frame
    df = load_frame(ResultsStore(store_path))
    model = fit(df)
    model.save(out or default_path())
    return model


# ---------------------------------------------------------------------------
class ModelPredictor(FastPredictor):
    """The planner's predictor over a fitted scikit-learn model (any estimator) and the
    measurements given (by default those it was fitted on)."""

    def __init__(self, model: FittedModel, measurements=None):
        import pandas as pd

        data = measurements if measurements is not None else model.data
        super().__init__(model.meta,
                         formula=lambda row: float(model.predict_log(pd.DataFrame([row]))[0]),
                         measured=measured_groups(training_frame(data) if measurements
                                                  is not None else data),
                         workloads=(workload_table(measurements) if measurements is not None
                                    else None))
        self.model = model


def fit_if_possible(path: Path | None = None) -> bool:
    """Fit the linear model from the shipped dataset and the store, if there is data."""
    from .results import ResultsStore, StoreError, load_frame

    try:
        fit(load_frame(ResultsStore()), estimators=QUICK_ESTIMATORS).save(path or default_path())
    except (StoreError, ModelError):
        return False
    return True


# ---------------------------------------------------------------------------
# evaluation
def is_stock(row) -> bool:
    """Framework defaults: eager, all cores, glibc malloc, fp32, oneDNN on, NCHW."""
    return (row["compiler"] == "off" and row["allocator"] == "glibc"
            and row["precision"] == "fp32" and int(row["channels_last"]) == 0
            and int(row["onednn"]) == 1 and float(row["threads"]) == float(row["cores"]))


def evaluate(df, estimator: str = "linear") -> dict[str, Any]:
    """Held-out errors and decision quality, on per-configuration medians."""
    import numpy as np

    df = training_frame(df)
    df["pred_loco"] = np.exp(held_out_predictions(df, estimator, "configuration"))
    df["pred_lowo"] = np.exp(held_out_predictions(df, estimator, "workload"))
    keys = TARGET_KEYS + CONFIG_KEYS
    cfg = (df.groupby(keys, dropna=False)
             .agg(measured=("s_per_step", "median"), low=("s_per_step", "min"),
                  high=("s_per_step", "max"), n=("s_per_step", "size"),
                  loco=("pred_loco", "median"), lowo=("pred_lowo", "median"))
             .reset_index())
    per_workload = []
    for w, g in cfg.groupby("workload"):
        per_workload.append({"workload": w, "configurations": len(g),
                             "mape_loco": mape(g["measured"], g["loco"]),
                             "mape_lowo": mape(g["measured"], g["lowo"])})
    decisions = []
    for key, g in cfg.groupby(["workload", "framework", "microarchitecture", "cores",
                               "batch_size", "image_size"], dropna=False):
        if len(g) < 2:
            continue
        chosen = g.loc[g["loco"].idxmin()]
        best = g.loc[g["measured"].idxmin()]
        stock = g[g.apply(is_stock, axis=1)]
        decisions.append({
            "workload": key[0], "framework": key[1], "target": f"{key[2]}/{key[3]} cores",
            "chosen": _label(chosen), "best": _label(best),
            "regret": float(chosen["measured"] / best["measured"] - 1),
            "speedup_vs_stock": (float(stock["measured"].iloc[0] / chosen["measured"])
                                 if len(stock) else float("nan")),
        })
    compare = {name: mape(np.exp(df["y"]), np.exp(held_out_predictions(df, name)))
               for name in ESTIMATORS}
    return {"per_workload": per_workload, "decisions": decisions, "configurations": cfg,
            "estimators": compare}


def _label(row) -> str:
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
    lo = min(cfg["measured"].min(), cfg["loco"].min()) * 0.7
    hi = max(cfg["measured"].max(), cfg["loco"].max()) * 1.4
    errors = np.abs(np.log(cfg["loco"] / cfg["measured"]))
    band = float(np.quantile(errors, 0.9)) if len(errors) else 0.0
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * np.exp(-band), line * np.exp(band), color="0.88",
                    label=f"90% of held-out errors (within x{np.exp(band):.2f})")
    ax.plot(line, line, "k--", lw=1, label="predicted = measured")
    for i, ((workload, framework), g) in enumerate(groups):
        ax.errorbar(g["measured"], g["loco"],
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
    ax.set_ylabel("predicted seconds per step\n(its configuration held out of the fit)",
                  fontsize=11)
    ax.set_title("MODAK performance model: held-out predictions", fontsize=12)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
