"""Fitting, saving and loading the performance model: log(seconds per step) from features.

Fitted with pandas and scikit-learn on the results store (plus the dataset MODAK ships).
The inputs are :mod:`.features` (what the workload and the target *are*, never their
names).  The default estimator is the seed paper's linear statistical model: a ridge
regression on the features and their pairwise interactions.  Non-linear estimators are
fitted too and replace it only when they predict clearly better on held-out workload
families (:mod:`.evaluate`); the ``-split`` ones learn a cell's stock level and each
configuration's ratio to it as two models (``Split``).

A fitted model is a versioned artefact (joblib + a JSON model card, :class:`.card.ModelCard`).
A model saved by another MODAK, another feature version or other library versions is
refitted on load (:func:`load`), never used to mis-predict and never an error that stops
a plan.
"""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .. import __version__
from ..errors import ModakError
from ..paths import data_file
from . import features as F
from .card import Comparison, ModelCard

RANGE_MARGIN = 0.5     # log space (x1.65): how far beyond the measured efficiencies a prediction
#                        may go
PREFER_MARGIN = 0.10   # another estimator must beat the linear model's held-out MAPE by 10%
# a cell: one workload on one target as its probe describes it (the same CPU on another
# machine, measured otherwise, is another target), in as many training ranks
TARGET_KEYS = ["fingerprint", "workload", "framework", "microarchitecture", "cores", "batch_size",
               "image_size", *F.TARGET_FIGURES, "ranks"]
CONFIG_KEYS = F.CONFIG_KEYS
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


def training_frame(df):
    """The rows the model learns from: successful runs with a fingerprint and the target's
    measured figures; ``y`` = log(seconds per step), less its round's drift
    (:func:`round_shift`); the estimators learn ``y`` minus the row's ``features.baseline``."""
    import numpy as np

    df = df.copy()
    for col in F.TARGET_FIGURES + F.WORKLOAD_FIGURES:
        if col not in df:
            df[col] = np.nan
    df["ranks"] = rank_counts(df)
    if "status" in df:  # failed runs stay in the store (never chosen again), not in the fit
        df = df[df["status"].fillna("ok") != "failed"].copy()
        # nor do trials stopped while compiling (results.still_compiling): they measured no
        # step time, only how long a compilation ran at least (workload_table's ``compiling``)
        df = df[~untimed_caps(df)].copy()
    bad = ~(df["s_per_step"].astype(float) > 0)
    if bad.any():
        raise ModelError(f"{int(bad.sum())} measurements have no positive s_per_step")
    df["y"] = np.log(df["s_per_step"].astype(float)) - round_shift(df)
    return df


def untimed_caps(df):
    """Per row of a store frame, whether it is a trial its time cap stopped before it
    measured a step time (status ``capped``: ``results.still_compiling``'s)."""
    import pandas as pd

    if "status" not in df:
        return pd.Series(False, index=df.index)
    timed = pd.to_numeric(df.get("s_per_step", pd.Series(None, index=df.index, dtype=float)),
                          errors="coerce") > 0
    return (df["status"].fillna("ok") == "capped") & ~timed


STOCK = F.STOCK


def stock_mask(df):
    """Framework defaults (eager, all cores, glibc malloc, fp32, oneDNN on, NCHW), per row."""
    import pandas as pd

    def col(name, default):
        return (df[name] if name in df else pd.Series(default, index=df.index)).fillna(default)

    def num(name, default):
        return pd.to_numeric(col(name, default), errors="coerce")

    mask = num("threads", -1) == num("cores", -2)
    for name, value in STOCK.items():
        mask &= (num(name, value) if isinstance(value, int) else col(name, value)) == value
    return mask


ROUND_GAP_S = 300  # runs of one cell further apart than this are in different rounds
ROUND_MIN_RUNS = 2  # a round of fewer runs tells nothing about the machine's speed then


def round_labels(df):
    """Per row, its round: a number shared by the runs of one interleaved round, -1 for a row
    with no time (or no positive time per step).

    A round is a run of a cell's measurements (workload, batch, target and the target's
    figures: ``TARGET_KEYS``) with no gap longer than ROUND_GAP_S between them; a search's
    trials (``source`` autotune) carry their round's number (``repeat``), and a new number
    starts a new round: the search's rounds run seconds apart, and it compared its trials
    round by round."""
    import numpy as np
    import pandas as pd

    labels = np.full(len(df), -1)
    if "recorded_at" not in df or not len(df):
        return labels
    secs = (recorded_times(df) - pd.Timestamp(0, tz="UTC")).dt.total_seconds() \
        .to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(df["s_per_step"].astype(float).to_numpy())
    cells = row_labels(df, [k for k in TARGET_KEYS if k in df])
    searched = search_rounds(df)
    first = 0
    for idx in cells.groupby(cells).indices.values():
        idx = idx[~np.isnan(secs[idx]) & np.isfinite(y[idx])]
        if not len(idx):
            continue
        idx = idx[np.argsort(secs[idx], kind="stable")]
        labels[idx] = first + np.concatenate([[0], np.cumsum(
            (np.diff(secs[idx]) > ROUND_GAP_S) | (np.diff(searched[idx]) != 0))])
        first = labels[idx].max() + 1
    return labels


def round_shift(df):
    """Per row, how much slower (log) the machine ran in the row's round than usual.

    This shared machine's speed drifts by tens of percent between minutes (other tenants),
    but the runs of one interleaved round (:func:`round_labels`: a campaign's cell, a
    search's round of trials) share it.  Each
    measurement is modelled, in log time, as its configuration's level plus its round's
    effect, and both are estimated by medians, alternately (Tukey's median polish): a
    round's effect is the median over **all** its runs of how far each is from its
    configuration's level, so one disturbed run (a 10x spike of the stock run beside the
    others, seen here) neither moves its round nor the round's other configurations.  The
    effects are centred on the cell's median round.  Zero where a cell has one round, a
    round fewer than ROUND_MIN_RUNS runs, or a row no time: then there is nothing to
    correct with."""
    import numpy as np

    shift = np.zeros(len(df))
    labels = round_labels(df)
    if not len(df) or (labels < 0).all():
        return shift
    y = np.log(df["s_per_step"].astype(float).to_numpy())
    cells = row_labels(df, [k for k in TARGET_KEYS if k in df])
    configs = row_labels(df, [k for k in CONFIG_KEYS if k in df]).to_numpy()
    for idx in cells.groupby(cells).indices.values():
        idx = idx[labels[idx] >= 0]
        if len(idx) < 2 * ROUND_MIN_RUNS:
            continue
        rounds = np.unique(labels[idx], return_inverse=True)[1]
        shift[idx] = _polish(y[idx], configs[idx], rounds)
    return shift


def search_rounds(df):
    """Per row, the search round a trial ran in (``repeat`` of a row whose ``source`` is
    autotune), else -1 (a campaign's or a job's run: its round is told by time alone)."""
    import numpy as np
    import pandas as pd

    if "source" not in df or "repeat" not in df:
        return np.full(len(df), -1.0)
    n = pd.to_numeric(df["repeat"], errors="coerce").to_numpy(dtype=float)
    return np.where((df["source"].astype(str) == "autotune").to_numpy() & ~np.isnan(n), n, -1.0)


def _polish(y, configs, rounds, sweeps: int = 20):
    """The round effects of a two-way (configuration + round) layout, by median polish."""
    import numpy as np

    n = int(rounds.max()) + 1
    members = [np.flatnonzero(rounds == r) for r in range(n)]
    counted = [r for r in range(n) if len(members[r]) >= ROUND_MIN_RUNS]
    effect = np.zeros(n)
    if len(counted) < 2:
        return effect[rounds]
    by_config = {c: np.flatnonzero(configs == c) for c in set(configs)}
    level = np.zeros(len(y))
    for _ in range(sweeps):
        for rows in by_config.values():
            level[rows] = np.median(y[rows] - effect[rounds[rows]])
        for r in counted:
            effect[r] = np.median(y[members[r]] - level[members[r]])
        effect[counted] -= np.median(effect[counted])
    return effect[rounds]


# what one workload run is, across machines: the same script, batch and configuration
RUN_KEYS = ["workload", "framework", "batch_size", "image_size", *CONFIG_KEYS]


def machine_labels(df):
    """Per row, its machine (``features.machine``: the figures its target's probe measured)."""
    import pandas as pd

    cols = [k for k in F.TARGET_FIGURES if k in df]
    return pd.Series([F.machine(r) for r in df[cols].to_dict("records")], index=df.index,
                     dtype=object)


def machine_effects(df, machines=None) -> dict[str, float]:
    """How much slower (log) each machine ran than its nominal target's median machine, for
    the machines of a nominal target (``target_id``: the same CPU, cores and GPU) that share
    measured runs (:data:`RUN_KEYS`) with another machine of it; by median polish of the
    shared runs' medians (``y``) as run + machine, so that one workload that ran unusually
    on one machine does not move its effect.

    The probe describes a machine by its arithmetic rate and bandwidth, and that does not
    carry all of its speed: two hosts of this project's kind, the same CPU probed within 2%
    of each other, ran the same scripts 1.3-2.3x apart.  The model learns from the runs with
    their machine's effect taken out and predicts a run on a known machine with it put back;
    a machine it has no shared runs of (a new one) is taken at its nominal target's median
    (no effect).  ``machines``: :func:`machine_labels` of ``df``, when already made."""
    import numpy as np

    if not len(df):
        return {}
    d = df.assign(_machine=machine_labels(df) if machines is None else machines,
                  _target=target_id(df), _run=row_labels(df, [k for k in RUN_KEYS if k in df]))
    med = d.groupby(["_target", "_machine", "_run"])["y"].median().reset_index()
    out: dict[str, float] = {}
    for _, g in med.groupby("_target"):
        g = g[g.groupby("_run")["_machine"].transform("nunique").to_numpy() > 1]
        names = sorted(set(g["_machine"]))
        if len(names) < 2:
            continue
        index = {m: i for i, m in enumerate(names)}
        rounds = g["_machine"].map(index).to_numpy(dtype=int)
        effect = _polish(g["y"].to_numpy(dtype=float), g["_run"].to_numpy(), rounds)
        out.update({m: float(effect[rounds == i][0]) for m, i in index.items()})
    return out


def machine_offsets(machines, effects: dict[str, float]):
    """Per row (its :func:`machine_labels`), its machine's effect (0 for one not in
    ``effects``), as a numpy array."""
    import numpy as np

    return np.array([effects.get(m, 0.0) for m in machines], dtype=float)


def recorded_times(df):
    """When each row was measured (UTC; NaT where it does not say)."""
    import pandas as pd
    return pd.to_datetime(df["recorded_at"], utc=True, errors="coerce", format="ISO8601")


def row_labels(df, keys: list[str]):
    """One text label per row from the values of ``keys`` (missing ones as "-")."""
    # (pandas 3 keeps missing values missing through astype(str)); column by column: a
    # row-wise join is most of a quick fit's time
    import pandas as pd

    if not keys:
        return pd.Series("", index=df.index, dtype=object)
    cols = [df[k].astype(object).where(df[k].notna(), "-").astype(str) for k in keys]
    out = cols[0]
    for col in cols[1:]:
        out = out + "|" + col
    return out


def usable(df):
    """The rows the estimators learn from: single processes that :mod:`.features` can
    describe completely.  A run of several training ranks (a data-parallel job's, whose
    ``ranks`` the runtime recorded) is left to the measured medians (:func:`measured_groups`,
    by its ranks): each of its ranks shares the node with the others and waits for their
    gradients each step, which no feature describes."""
    if not len(df):
        return df
    X = F.frame(df)
    return df[(~X[F.NUMERIC].isna().any(axis=1)).to_numpy() & (rank_counts(df) == 1).to_numpy()]


def rank_counts(df):
    """Per row of a store frame, how many training ranks its run was one of (1: a single
    process, as every run recorded before the store kept ``ranks``)."""
    import pandas as pd

    if "ranks" not in df:
        return pd.Series(1, index=df.index)
    return pd.to_numeric(df["ranks"], errors="coerce").fillna(1).round().clip(lower=1) \
        .astype(int)


def named(values):
    """Which of ``values`` (a column of text) name something: not missing, not empty, not a
    written-out missing value (``none``, ``None``, ``nan``: how a CSV round trip or an old
    record spells one)."""
    return values.notna() & ~values.astype(str).isin(["", "none", "None", "nan"])


def target_id(df):
    """A target as the model's data name it: microarchitecture / cores, and its GPU where
    the job trained on one (``zen4/16 cores + H100``); ``unknown`` where the runtime named
    no microarchitecture (it had no archspec), as the features name it."""
    micro = df["microarchitecture"].astype(object).where(df["microarchitecture"].notna(),
                                                         "unknown")
    tid = micro.astype(str) + "/" + df["cores"].astype(float).astype(int) \
        .astype(str) + " cores"
    if "accelerator" not in df:
        return tid
    acc = df["accelerator"].astype(object)
    return tid.where(~named(acc), tid + " + " + acc.astype(str))


def held_out_groups(df, by: str = "workload") -> str:
    """What a comparison holds out of ``df``: ``by`` (workload families by default, the
    hardest test), or configurations where the data has a single family."""
    return by if df["workload"].nunique() >= 2 else "configuration"


def fingerprint(df) -> str:
    cols = [c for c in ["workload", "framework", "s_per_step", "recorded_at", "run_id", "repeat"]
            if c in df]
    text = df[cols].astype(object).where(df[cols].notna(), "-").astype(str) \
        .sort_values(cols).to_csv(index=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------
# estimators
MIN_SCALE = 0.25  # log units: a feature that barely varies is not scaled up into a lever


_CLASSES: dict[str, type] = {}


def _made(name: str, make: Callable[[], type]) -> type:
    """The class ``make`` defines, made on first use (planning imports no scikit-learn) and
    kept under this module's name, so that a saved model unpickles it as
    ``modak_lib.perf.fit.<name>`` (see ``__getattr__``)."""
    if name not in _CLASSES:
        cls = make()
        cls.__module__, cls.__qualname__ = __name__, name
        _CLASSES[name] = cls
    return _CLASSES[name]


def _floor_scaler():
    """The scaler class."""
    def make():
        from sklearn.preprocessing import StandardScaler

        class FloorScaler(StandardScaler):
            """StandardScaler whose scale is at least MIN_SCALE: two workloads whose FLOPs
            differ by 0.5% must not make FLOPs a lever that extrapolates 100x to a third."""

            def fit(self, X, y=None, sample_weight=None):
                super().fit(X, y, sample_weight)
                import numpy as np
                self.scale_ = np.maximum(self.scale_, MIN_SCALE)
                return self

        return FloorScaler
    return _made("FloorScaler", make)


def _crossed():
    """The transformer of the linear model's terms."""
    def make():
        from sklearn.base import BaseEstimator, TransformerMixin

        class Crossed(TransformerMixin, BaseEstimator):
            """Every input, and each category column times each of the ``crossed``
            numeric columns.

            The inputs are [one-hot categories ..., ``n_numeric`` scaled numbers]: a knob's
            effect may depend on what the workload and the target are (bf16 speeds up a
            convolution-heavy step, not a recurrent one), so it is crossed with the numbers
            that are bounded (FLOP shares, the thread share, the bf16/fp32 ratio).  Sizes
            are not crossed and two numbers are never multiplied: such products extrapolate
            wildly to a workload unlike the others.  ``terms_`` lists the indices multiplied
            in each output column, as ``predictor.LinearFormula`` evaluates them."""

            def __init__(self, n_numeric: int = 0, crossed: tuple = ()):
                self.n_numeric = n_numeric
                self.crossed = crossed

            def fit(self, X, y=None):
                width = X.shape[1]
                first_num = width - self.n_numeric
                self.terms_ = [[i] for i in range(width)] + [
                    [c, first_num + n] for c in range(first_num) for n in self.crossed]
                return self

            def transform(self, X):
                import numpy as np
                X = np.asarray(X, dtype=float)
                return np.column_stack([X[:, t].prod(axis=1) for t in self.terms_])

        return Crossed
    return _made("Crossed", make)


# STOCK as ``features.frame`` writes it (categories as text); every other column of the
# frame but THREAD_COLUMNS describes the cell (the workload, its batch, the target)
STOCK_CATEGORIES = {name: str(value) for name, value in STOCK.items()}
THREAD_COLUMNS = ("log_threads", "thread_share")


def stock_version(X):
    """The rows of a feature frame as their cell's stock configuration would run
    (``features.as_stock``: framework defaults, every core)."""
    import pandas as pd

    n, rows = len(F.CATEGORICAL), []
    for r in X[F.CATEGORICAL + F.NUMERIC].itertuples(index=False, name=None):
        cats, nums = F.as_stock(list(r[:n]), [float(v) for v in r[n:]])
        rows.append(cats + nums)
    return pd.DataFrame(rows, index=X.index, columns=F.CATEGORICAL + F.NUMERIC)


def stock_rows(X):
    """Per row of a feature frame, whether it is its cell's stock configuration."""
    import numpy as np

    mask = np.abs(X["thread_share"].astype(float).to_numpy() - 1.0) < 1e-9
    for col, value in STOCK_CATEGORIES.items():
        mask &= (X[col].astype(str) == value).to_numpy()
    return mask


def _split():
    """The two-part estimator."""
    def make():
        from sklearn.base import BaseEstimator, RegressorMixin

        class Split(RegressorMixin, BaseEstimator):
            """A step's residual as two parts: the **level** of its cell (the stock
            configuration of that workload, batch and target, learned from the cells'
            stock rows) and the configuration's **ratio** to it (learned from every row
            of a cell whose stock row is among the training rows, as its residual less
            that stock row's).  A new workload's knob effects are then learned from how
            knobs changed other workloads' times, not mixed with how fast other workloads
            ran at all; and once the stock run of a new workload is measured, the planner's
            ratios to it are the ratio part alone.  With fewer than two stock rows it is
            the ``ratio`` estimator on everything."""

            def __init__(self, level: str = "gbr", ratio: str = "gbr"):
                self.level = level
                self.ratio = ratio

            def fit(self, X, y):
                import numpy as np
                import pandas as pd

                y = np.asarray(y, dtype=float)
                stock = stock_rows(X)
                if stock.sum() < 2:
                    self.level_ = None
                    self.ratio_ = make_estimator(self.ratio).fit(X, y)
                    return self
                cells = row_labels(X, [c for c in X.columns if c not in STOCK_CATEGORIES
                                       and c not in THREAD_COLUMNS])
                level = pd.Series(y[stock], index=cells[stock].to_numpy()).groupby(level=0) \
                    .median()
                anchor = cells.map(level).to_numpy(dtype=float)
                known = ~np.isnan(anchor)
                self.level_ = make_estimator(self.level).fit(X[stock], y[stock])
                self.ratio_ = make_estimator(self.ratio).fit(X[known], (y - anchor)[known])
                return self

            def predict(self, X):
                if self.level_ is None:
                    return self.ratio_.predict(X)
                return self.level_.predict(stock_version(X)) + self.ratio_.predict(X)

        return Split
    return _made("Split", make)


def __getattr__(name: str):  # pickle looks the classes up by name
    make = {"FloorScaler": _floor_scaler, "Crossed": _crossed, "Split": _split}.get(name)
    if make is None:
        raise AttributeError(name)
    return make()


def _ridge():
    from sklearn.linear_model import RidgeCV
    import numpy as np
    return RidgeCV(alphas=np.logspace(-3, 3, 13))


EXTRA_TREES = 100  # trees of the extra-trees estimator (exported for the planner: a few MB)
EXTRA_TREES_FEATURES = 0.5  # the share of the features each of its splits is drawn from
# a tree ensemble of more nodes than this is left to scikit-learn, not exported
EXPORT_MAX_NODES = 150_000
# the leaves an extra tree may grow (best first): its 100 trees stay within the export's
# nodes however many configurations the store measures (a tree of n leaves has 2n - 1
# nodes); fully grown on the 1793 configurations of 3820 measurements they had 156,000
# nodes in all, and the planner lost its exported formula
EXTRA_TREES_LEAVES = (EXPORT_MAX_NODES // EXTRA_TREES + 1) // 2


def make_estimator(name: str):
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import (ExtraTreesRegressor, GradientBoostingRegressor,
                                  RandomForestRegressor)
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, PolynomialFeatures

    pre = ColumnTransformer([
        ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), F.CATEGORICAL),
        ("num", _floor_scaler()(), F.NUMERIC)])
    if name == "linear":  # the seed paper's linear model; knob effects per workload/target
        crossed = tuple(F.NUMERIC.index(k) for k in F.CROSSED)
        return Pipeline([("pre", pre), ("inter", _crossed()(len(F.NUMERIC), crossed)),
                         ("reg", _ridge())])
    if name == "linear-pairs":  # every pairwise product (numbers times numbers too)
        return Pipeline([("pre", pre),
                         ("inter", PolynomialFeatures(2, interaction_only=True,
                                                      include_bias=False)),
                         ("reg", _ridge())])
    if name == "linear-main":  # main effects only (a baseline)
        return Pipeline([("pre", pre), ("reg", _ridge())])
    if name == "gbr":
        return Pipeline([("pre", pre), ("reg", GradientBoostingRegressor(random_state=0))])
    if name == "forest":
        return Pipeline([("pre", pre), ("reg", RandomForestRegressor(200, random_state=0))])
    if name == "extra-trees":  # random split points: smoother across workloads than a forest's
        # (each split drawn from half the features: a new workload's time is then told by
        # several of its figures, not by the one that best split the families measured;
        # held out, no error worse than with all the features and most better, on three
        # seeds: README, *Half the features a split*)
        return Pipeline([("pre", pre), ("reg", ExtraTreesRegressor(
            EXTRA_TREES, min_samples_leaf=2, max_features=EXTRA_TREES_FEATURES,
            max_leaf_nodes=EXTRA_TREES_LEAVES, random_state=0))])
    if name in ("gbr-split", "forest-split"):  # level and ratio apart
        kind = name.removesuffix("-split")
        return _split()(kind, kind)
    raise ModelError(f"unknown estimator {name!r}")


ESTIMATORS = ("linear", "linear-main", "linear-pairs", "gbr", "forest", "extra-trees",
              "gbr-split", "forest-split")
# fitted on the way (a first plan, the refit after a run, a model of an older MODAK): all in
# about 15 s on the shipped datasets, the trees exported for the planner like the linear
# formulas
QUICK_ESTIMATORS = ("linear", "linear-main", "gbr-split", "extra-trees")
LOCO_FOLDS = 10  # a fit's held-out-configuration error: configurations dealt into 10 folds
# a refit after a run compares the estimators on held-out data again once the measurements
# grew by this share since they were compared; before that it fits the kept one alone
REFRESH_SHARE = 0.05


def config_groups(df):
    """One label per measured configuration (all repeats of it share the label)."""
    return row_labels(df, TARGET_KEYS + CONFIG_KEYS)


def groups_of(df, by: str):
    """Held-out groups: ``configuration``, ``workload`` (its family: every batch size and
    configuration of it), ``target`` or ``host`` (:func:`host_labels`)."""
    if by == "configuration":
        return config_groups(df)
    if by == "workload":
        return df["workload"].astype(str)
    if by == "target":
        return target_id(df)
    if by == "host":
        return host_labels(df)
    raise ValueError(by)


NO_HOST = "no boot id"


def host_labels(df):
    """Per row, the host it ran on: its ``boot_id`` (one boot of one machine: every target
    the campaign made of it, its cores, its capped ISA, its GPU), or :data:`NO_HOST` for a
    row recorded before the runtime kept it.  Held out, a host is a machine the model has
    never measured, of a kind (its targets) it may have measured on other hosts."""
    import pandas as pd

    if "boot_id" not in df:
        return pd.Series(NO_HOST, index=df.index, dtype=object)
    boot = df["boot_id"].astype(object)
    return boot.astype(str).where(named(boot), NO_HOST)


def held_out_predictions(df, name: str, by: str = "configuration",
                         folds: Optional[int] = None, shared: Optional[dict] = None):
    """Predictions of log s/step, each with its group (``groups_of``) left out of the fit;
    with ``folds``, the groups are dealt into that many folds (a fixed shuffle) and each
    fold is left out in turn: an estimate of the error on held-out configurations in a few
    seconds, not one fit per configuration.  ``shared``: a dict kept across calls on the
    same ``df`` (several estimators compared): what does not depend on the estimator (the
    features, the baselines, each fold's machine effects) is computed once into it."""
    import numpy as np

    shared = _shared(df, {} if shared is None else shared)
    X, base, machines, configs = (shared[k] for k in ("X", "base", "machines", "configs"))
    y = df["y"].to_numpy() - base
    groups = groups_of(df, by)
    names = groups.unique()
    if folds and len(names) > folds:
        order = np.random.default_rng(0).permutation(len(names))
        groups = groups.map(dict(zip(names[order], np.arange(len(names)) % folds)))
    pred = np.full(len(df), np.nan)
    for g in groups.unique():
        test = (groups == g).to_numpy()
        if test.all():
            continue
        # the machines' effects as the training groups show them
        key = ("offsets", by, folds, g)
        if key not in shared:
            shared[key] = machine_offsets(machines, machine_effects(df[~test], machines[~test]))
        off = shared[key]
        Xt, yt = per_configuration(X[~test], (y - off)[~test], configs[~test])
        est = make_estimator(name).fit(Xt, yt)
        pred[test] = np.clip(est.predict(X[test]), *residual_range(yt)) + base[test] + off[test]
    return pred


def _shared(df, shared: dict) -> dict:
    """What a fit on ``df`` needs whatever its estimator, computed once into ``shared``:
    the features, the baselines, the machines and the configuration labels."""
    if "X" not in shared:
        shared.update(X=F.frame(df), base=F.baselines(df), machines=machine_labels(df),
                      configs=config_groups(df))
    return shared


def per_configuration(X, y, configs):
    """One training row per measured configuration, its target the median of its repeats:
    a configuration measured five times weighs as much as one measured once, and one slow
    repeat does not pull the fit."""
    import pandas as pd

    configs = pd.Series(list(configs), index=X.index)
    first = ~configs.duplicated().to_numpy()
    med = pd.Series(y, index=X.index).groupby(configs).median()
    return X[first], med.loc[configs[first]].to_numpy()


def residual_range(y) -> list[float]:
    """The range the learned part may predict in: the measured one, widened by RANGE_MARGIN.
    A linear model extrapolates a family unlike the others (ten times the parameters) into
    efficiencies no step ever had; the baseline carries what is physical, the clip holds
    the rest to what was seen."""
    import numpy as np
    y = np.asarray(y, float)
    y = y[~np.isnan(y)]
    return [float(y.min()) - RANGE_MARGIN, float(y.max()) + RANGE_MARGIN] if len(y) else \
        [-1e9, 1e9]


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
    card: ModelCard
    data: Any = field(repr=False, default=None)  # the training frame (for measured lookups)

    @property
    def meta(self) -> dict[str, Any]:
        return self.card.model_dump(mode="json")

    def save(self, path: Path) -> None:
        try:
            self._save(path)
        except OSError as exc:  # (a directory that cannot be made, no permission, full disk)
            raise ModelError(f"{path}: cannot write the model there ({exc.strerror})") from None

    def _save(self, path: Path) -> None:
        import joblib
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        joblib.dump({"estimator": self.estimator, "name": self.name, "meta": self.meta,
                     "data": self.data}, tmp)
        side = path.with_suffix(".json.tmp")
        # a key a line, each value compact: an exported forest is some 10^5 numbers
        side.write_text("{\n" + ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
            for k, v in self.meta.items()) + "\n}\n")
        tmp.replace(path)  # atomic: a killed fit leaves the previous model
        side.replace(path.with_suffix(".json"))

    def predict_log(self, frame):
        import numpy as np
        return (np.clip(self.estimator.predict(F.frame(frame)), *self.card.residual_range)
                + F.baselines(frame)
                + machine_offsets(machine_labels(frame), self.card.machine_effects))


def fit(df, estimators: Sequence[str] = None, by: str = "workload",
        carry: Optional[ModelCard | Comparison] = None, every=None) -> FittedModel:
    """Fit every estimator, compare them on held-out groups (``by``: workload families by
    default, the hardest test: a workload never seen), keep the best.

    ``carry``: the card of a model whose comparison still stands for ``df`` (a refit after a
    run, a few rows added since: ``refit_after_run``): its estimator alone is fitted, and
    its held-out figures are carried over; ``held_out_rows`` says on how many measurements
    they were measured.  ``every``: ``training_frame(df)``, where the caller has it already
    (a second of the refit after each trial of a search).  Without ``carry``, the
    comparison shipped with the datasets where it is of ``df`` (``shipped_comparison``),
    else computed (``compare``)."""
    estimators = tuple(estimators or ESTIMATORS)
    workloads = workload_table(df)
    if every is None:
        every = training_frame(df)  # (measured medians need no features)
    df = usable(every)
    n_cfg = config_groups(df).nunique() if len(df) else 0
    if len(df) < 8 or n_cfg < 3:
        raise ModelError(f"too little data to fit: {len(df)} measurements with fingerprints "
                         f"and target figures, of {n_cfg} configurations (need 8 and 3)")
    by = held_out_groups(df, by)
    data_fp = fingerprint(df)  # (once a fit: the shipped comparison, compare and the card)
    shared: dict = {}
    if carry is None:
        carry = shipped_comparison(df, estimators, by, data_fp)
    if carry is None:
        carry = compare(df, estimators, by, shared, data_fp)
    best, by, scores = carry.estimator, carry.held_out_by, dict(carry.held_out_mape)
    sigma, sigma_loco = carry.sigma_log_unseen, carry.sigma_log
    held_rows = carry.held_out_rows or carry.rows
    _shared(df, shared)
    # (the features, baselines, machines and configurations the held-out fits computed)
    machines = shared["machines"]
    effects = machine_effects(df, machines)
    Xt, learned = per_configuration(
        shared["X"], df["y"].to_numpy() - shared["base"] - machine_offsets(machines, effects),
        shared["configs"])
    est = make_estimator(best).fit(Xt, learned)
    bounds = residual_range(learned)
    acc = df["accelerator"] if "accelerator" in df else None
    light: dict[str, Any] = {"workloads": workloads, "accelerators": sorted(
        {str(a) for a in acc if isinstance(a, str) and a} if acc is not None else set())}
    formula = export_linear(est) if best.startswith("linear") else export_trees(est)
    if formula is not None:  # the planner evaluates it without scikit-learn
        light.update(formula={**formula, "range": bounds}, measured=measured_groups(every))
    card = ModelCard(
        model_id=f"{best}-{data_fp}", estimator=best,
        feature_version=F.FEATURE_VERSION, features=F.CATEGORICAL + F.NUMERIC,
        rows=int(len(df)), configurations=int(n_cfg),
        families=sorted(df["workload"].astype(str).unique()),
        targets=sorted(target_id(df).unique()), data_fingerprint=data_fp,
        held_out_by=by, held_out_mape={k: None if v is None else round(v, 4)
                                       for k, v in scores.items()},
        held_out_rows=held_rows, sigma_log=round(sigma_loco, 4),
        sigma_log_unseen=round(sigma, 4),
        sigma_log_unseen_by_framework=dict(carry.sigma_log_unseen_by_framework),
        versions=library_versions(), residual_range=bounds,
        machine_effects={m: round(e, 4) for m, e in effects.items()},
        fitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), light=light)
    keep = every[TARGET_KEYS + CONFIG_KEYS + ["s_per_step", "accelerator", "source"]].copy()
    return FittedModel(est, best, card, keep)


def compare(df, estimators: Sequence[str], by: str, shared: Optional[dict] = None,
            data_fp: Optional[str] = None) -> Comparison:
    """Each estimator's predictions with its ``by`` group held out (``df``: the usable
    frame), and the one kept: linear unless another's MAPE is ``PREFER_MARGIN`` lower (the
    lowest); with its RMS log errors, a group held out and a configuration held out (its
    configurations dealt into ``LOCO_FOLDS`` folds): the uncertainties a plan states.
    ``data_fp``: ``fingerprint(df)`` where the caller has it."""
    import numpy as np

    shared = {} if shared is None else shared
    scores, residual = {}, {}
    for name in estimators:
        pred = held_out_predictions(df, name, by, shared=shared)
        scores[name] = mape(np.exp(df["y"]), np.exp(pred))
        residual[name] = df["y"].to_numpy() - pred
    best = "linear" if "linear" in scores else estimators[0]
    challenger = min(scores, key=lambda k: scores[k] if scores[k] == scores[k] else 1e9)
    if scores[challenger] < scores[best] * (1 - PREFER_MARGIN):
        best = challenger
    res = residual[best][~np.isnan(residual[best])]
    sigma = float(np.sqrt(np.mean(res ** 2))) if len(res) else 0.5
    per_framework = framework_sigmas(df, residual[best]) if by == "workload" else {}
    loco = residual[best] if by == "configuration" else (
        df["y"].to_numpy() - held_out_predictions(df, best, "configuration", LOCO_FOLDS,
                                                  shared))
    loco = loco[~np.isnan(loco)]
    sigma_loco = float(np.sqrt(np.mean(loco ** 2))) if len(loco) else sigma
    return Comparison(
        estimators=list(estimators), data_fingerprint=data_fp or fingerprint(df),
        feature_version=F.FEATURE_VERSION, estimator=best, held_out_by=by,
        held_out_mape={k: None if v != v else round(float(v), 4) for k, v in scores.items()},
        rows=int(len(df)), held_out_rows=int(len(df)), sigma_log=round(sigma_loco, 4),
        sigma_log_unseen=round(sigma, 4), sigma_log_unseen_by_framework=per_framework,
        versions=library_versions())


def framework_sigmas(df, residual) -> dict[str, float]:
    """The RMS of ``residual`` (log space, each row's with its family held out) over each
    framework's rows, for the frameworks with two or more families: how far a new
    workload's prediction is off in its own framework."""
    import numpy as np

    if "framework" not in df:
        return {}
    frameworks = df["framework"].astype(str).to_numpy()
    out = {}
    for name in sorted(set(frameworks)):
        mine = (frameworks == name) & ~np.isnan(residual)
        if df.loc[mine, "workload"].nunique() >= 2:
            out[name] = round(float(np.sqrt(np.mean(residual[mine] ** 2))), 4)
    return out


# the quick estimators' comparison on the shipped datasets alone: what a first plan (and
# the tests' first fit) would otherwise compute, 15 s to a minute; `scripts/ship-comparison`
# writes it, and a test checks it against the comparison computed afresh
SHIPPED_COMPARISON = Path(__file__).resolve().parent.parent / "data" / "quick-comparison.json"


def shipped_comparison(df, estimators: Sequence[str], by: str,
                       data_fp: Optional[str] = None) -> Optional[Comparison]:
    """The shipped comparison where it is of this fit: the same estimators on the same
    measurements (``df``, the usable frame: its fingerprint, ``data_fp`` where the caller
    has it) and features (their version), holding out the same groups; None otherwise (a
    store with runs of its own, an older file)."""
    try:
        shipped = Comparison.model_validate_json(SHIPPED_COMPARISON.read_text())
    except (OSError, ValueError):
        return None
    if (shipped.estimators == list(estimators) and shipped.held_out_by == by
            and shipped.feature_version == F.FEATURE_VERSION
            and shipped.data_fingerprint == (data_fp or fingerprint(df))):
        return shipped
    return None


def write_shipped_comparison(path: Optional[Path] = None) -> Comparison:
    """Compute the quick estimators' comparison on the shipped datasets alone and write it
    (``SHIPPED_COMPARISON``): after the shipped data, the features or the estimators
    change."""
    from ..results import load_frame

    df = usable(training_frame(load_frame(None, include_shipped=True)))
    result = compare(df, QUICK_ESTIMATORS, held_out_groups(df))
    (path or SHIPPED_COMPARISON).write_text(result.model_dump_json(indent=1) + "\n")
    return result


def _export_encoding(est) -> dict[str, Any]:
    """A fitted pipeline's inputs (one-hot categories, scaled numbers) as numbers that
    ``predictor.encode`` applies."""
    pre = est.named_steps["pre"]
    cat, num = pre.named_transformers_["cat"], pre.named_transformers_["num"]
    return {"categories": [[str(c) for c in cats] for cats in cat.categories_],
            "mean": num.mean_.tolist(), "scale": num.scale_.tolist()}


def export_linear(est) -> dict[str, Any]:
    """A fitted linear pipeline as numbers that ``predictor.LinearFormula`` evaluates."""
    reg = est.named_steps["reg"]
    terms = None
    inter = est.named_steps.get("inter")
    if inter is not None:
        terms = (inter.terms_ if hasattr(inter, "terms_") else
                 [[i for i, p in enumerate(row) if p] for row in inter.powers_])
    return {**_export_encoding(est), "terms": terms,
            "coef": reg.coef_.tolist(), "intercept": float(reg.intercept_)}


def export_trees(est) -> Optional[dict[str, Any]]:
    """A fitted tree-ensemble pipeline (gradient boosting: init + rate x the sum of its
    trees; extra trees or a forest: the mean of its trees, init 0 and rate 1/n), or a
    ``Split`` of two, as numbers that ``predictor.TreeFormula`` evaluates; None for an
    estimator it cannot export, or one of over ``EXPORT_MAX_NODES`` nodes (a forest of
    hundreds of deep trees, left to scikit-learn)."""
    from sklearn.ensemble import (ExtraTreesRegressor, GradientBoostingRegressor,
                                  RandomForestRegressor)

    parts = [(False, est)]
    if type(est).__name__ == "Split":
        parts = [(False, est.ratio_)] + ([(True, est.level_)] if est.level_ is not None
                                          else [])
    out, nodes = [], 0
    for stock, pipe in parts:
        reg = pipe.named_steps["reg"]
        if isinstance(reg, GradientBoostingRegressor):
            members = list(reg.estimators_[:, 0])
            init, rate = float(reg.init_.constant_[0][0]), float(reg.learning_rate)
        elif isinstance(reg, (ExtraTreesRegressor, RandomForestRegressor)):
            members = list(reg.estimators_)
            init, rate = 0.0, 1.0 / len(members)
        else:
            return None
        nodes += sum(tree.tree_.node_count for tree in members)
        if nodes > EXPORT_MAX_NODES:
            return None
        trees = []
        for tree in members:
            t = tree.tree_
            trees.append([t.children_left.tolist(), t.children_right.tolist(),
                          t.feature.tolist(), t.threshold.tolist(), t.value[:, 0, 0].tolist()])
        out.append({**_export_encoding(pipe), "stock": stock, "init": init, "rate": rate,
                    "trees": trees})
    return {"kind": "trees", "parts": out}


def ratios_to_stock(y, rounds, places, stock):
    """Per run, its log time ``y`` less the median of the stock runs of its place (``places``:
    a label per run) in its round (``rounds``: :func:`round_labels`), as the search compares
    a candidate with stock; NaN for a stock run, a run of no round (-1) or of a round
    without stock."""
    import numpy as np
    import pandas as pd

    d = pd.DataFrame({"y": np.asarray(y, float), "round": np.asarray(rounds),
                      "place": np.asarray(places), "stock": np.asarray(stock, bool)})
    beside = d[d["stock"] & (d["round"] >= 0)].groupby(["place", "round"])["y"].median()
    at = pd.MultiIndex.from_arrays([d["place"], d["round"]])
    ratio = d["y"].to_numpy() - beside.reindex(at).to_numpy()
    ratio[d["stock"].to_numpy() | (d["round"].to_numpy() < 0)] = np.nan
    return ratio


# a run's loss columns and the names a measured group gives their medians
LOSS_NAMES = (("final_loss", "loss"), ("end_loss", "end_loss"), ("start_loss", "start_loss"))

MEASURED_KEYS = ["fingerprint", "workload", "microarchitecture", "cores", "accelerator",
                 "framework", "image", "batch_size", "ranks"] + CONFIG_KEYS


def measured_groups(df) -> list[dict[str, Any]]:
    """Median, min, max and count of s/step per measured configuration, image and target
    (its CPU, cores and accelerator: a run on the CPU is not a GPU node's measurement).

    Of a training frame (:func:`training_frame`), the times are its runs' corrected by their
    rounds (``y``).  And a configuration that ran beside stock in the same rounds
    (:func:`round_labels`: a search's, a campaign's) has ``vs_stock``: the median over those
    rounds of its log time less stock's, and ``rounds``, their count.  That is how the search
    compared them: pooled, stock's runs of every round and of the job against a candidate's
    own, a candidate that lost to stock in two of three rounds was measured 5% faster."""
    import numpy as np

    keys = MEASURED_KEYS
    d = df.copy()
    for k in ("fingerprint", "accelerator", "image"):
        if k not in d:
            d[k] = None
        d[k] = d[k].astype(object).where(d[k].notna(), None)
    # (a run that did not say one of them, as a plain TensorFlow loop's batch size where the
    # runtime saw no model, is no plan's measurement: a plan looks its batch size up)
    d = d[d[list(INT_KEYS)].notna().all(axis=1)]
    for k in INT_KEYS:
        d[k] = d[k].astype(float).round().astype(int)
    d["ranks"] = rank_counts(d)  # (a run of several ranks answers a plan of as many)
    d["_y"] = d["y"].astype(float) if "y" in d else np.log(d["s_per_step"].astype(float))
    d["_round"] = round_labels(d)
    d["_place"] = row_labels(d, keys[:-len(CONFIG_KEYS)])
    d["_stock"] = stock_mask(d)
    d["_ratio"] = ratios_to_stock(d["_y"], d["_round"], d["_place"], d["_stock"])
    grouped = d.groupby(keys, dropna=False)
    # (ngroup numbers the groups in the order the loop below sees them)
    losses = losses_by_steps(d, grouped.ngroup())
    out = []
    for number, (key, g) in enumerate(grouped):
        rec = {k: _plain(v) for k, v in zip(keys, key)}
        s = np.exp(g["_y"])
        rec.update(median=float(s.median()), min=float(s.min()), max=float(s.max()), n=len(s))
        if not g["_stock"].iloc[0]:
            diffs = g.dropna(subset="_ratio").groupby("_round")["_ratio"].median()
            if len(diffs):
                rec.update(vs_stock=float(np.median(diffs)), rounds=len(diffs))
        for col, name in (("compile_s", "warmup_s"), *LOSS_NAMES, ("steps", "steps")):
            v = g[col].astype(float).median() if col in g else float("nan")
            rec[name] = None if v != v else (int(v) if name == "steps" else float(v))
        rec["losses"] = losses.get(number, [])
        out.append(rec)
    return out


def losses_by_steps(d, group) -> dict[int, list[dict[str, Any]]]:
    """Per group (``group``: a number per row), per number of steps its runs made (a job's,
    each round of a search's trials), the medians of their losses (None where none of them
    had one), fewest steps first: a run compares with stock's after as many steps
    (``planner._loss_pairs``), never with a longer one.  A search's trials and the job it
    chose, pooled, had a median loss and number of steps no stock run had, and the bf16 the
    search had checked beside stock in two rounds read as unchecked in the next plan."""
    import numpy as np
    import pandas as pd

    if "steps" not in d:
        return {}
    steps = pd.to_numeric(d["steps"], errors="coerce")
    ran = (steps > 0).to_numpy()
    frame = pd.DataFrame({"_group": np.asarray(group)[ran],
                          "_steps": steps[ran].round().astype(int).to_numpy()})
    for col, name in LOSS_NAMES:
        frame[name] = (pd.to_numeric(d[col], errors="coerce").to_numpy()[ran] if col in d
                       else np.nan)
    shorter = trial_losses_at_shorter_steps(d[ran], frame["_group"].to_numpy(),
                                            frame["_steps"].to_numpy(),
                                            frame["start_loss"].to_numpy())
    if shorter:
        frame = pd.concat([frame, pd.DataFrame(shorter, columns=frame.columns)],
                          ignore_index=True)
    out: dict[int, list[dict[str, Any]]] = {}
    for row in frame.groupby(["_group", "_steps"]).median().itertuples():
        (g, n), values = row[0], row[1:]
        out.setdefault(int(g), []).append({"steps": int(n), **{
            name: None if v != v else float(v) for (_, name), v in zip(LOSS_NAMES, values)}})
    return out


def trial_losses_at_shorter_steps(d, groups, steps, starts) -> list[tuple]:
    """A search's trials (``source`` autotune: seeded alike, so their losses compare step
    for step) as they stood after each fewer number of steps another trial of the same
    workload ran: ``(group, steps, loss, end_loss, start_loss)`` rows for
    :func:`losses_by_steps`, read from the losses each sampled (its record's
    ``metrics.losses``, as :func:`.search.losses_after` reads them); ``starts``, each row's
    ``start_loss`` as stored (where its run started: the same after any steps).  A candidate whose
    time cap stopped it after 6 steps, beside stock's trial of 10, is then compared with
    stock's after 6, as the search compared them; without them the next plan found no run
    of stock's of 6 steps and read the candidate as unchecked.  A job (not seeded) answers
    only for its own steps."""
    import numpy as np
    from modak_runtime.record import losses_after

    if "source" not in d or "raw" not in d:
        return []
    trial = (d["source"].astype(str) == "autotune").to_numpy()
    if trial.sum() < 2:
        return []
    work = (d["workload_key"] if "workload_key" in d else d["workload"]).astype(str).to_numpy()
    counts: dict[str, set[int]] = {}
    for w, n in zip(work[trial], steps[trial]):
        counts.setdefault(w, set()).add(int(n))
    out = []
    for i in np.flatnonzero(trial):
        fewer = sorted(k for k in counts[work[i]] if k < steps[i])
        if not fewer:
            continue
        try:
            sampled = (json.loads(d["raw"].iloc[i]).get("metrics") or {}).get("losses")
        except (TypeError, ValueError, AttributeError):
            continue
        for k in fewer:
            then = losses_after(sampled, k)
            if then is not None:
                out.append((groups[i], k, *then, starts[i]))
    return out


def _plain(v: Any) -> Any:
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and v != v else v


def workload_idents(df):
    """Per row, the workload :func:`workload_table` files it under: its key, else its label,
    framework and batch size."""
    label = ("label:" + df["workload"].astype(str) + "/" + df["framework"].astype(str) + "/"
             + df["batch_size"].astype(str))
    return df["workload_key"].astype(object).where(df["workload_key"].notna(), label)


def since_rows(df, since: str):
    """The rows of a store frame that what was recorded at or after ``since`` (ISO 8601)
    bears on: those of the workloads (:func:`workload_idents`) and of the scripts measured
    (fingerprint, workload and framework: every cell, round and measured group of
    :func:`measured_groups` lies within one) of the rows recorded then or later.  Two
    frames, for :func:`workload_table` and for :func:`measured_groups`: what either gives
    for a workload or group of a new row is what it gives on the whole frame."""
    import pandas as pd

    d = df.copy()
    for col in ("workload_key", "workload", "framework", "batch_size", "fingerprint",
                "recorded_at"):
        if col not in d:
            d[col] = None
    start = pd.Timestamp(since)
    if start.tzinfo is None:  # (a card's time is UTC)
        start = start.tz_localize("UTC")
    new = (recorded_times(d) >= start).to_numpy()
    idents = workload_idents(d)
    scripts = row_labels(d, ["fingerprint", "workload", "framework"])
    return (df[idents.isin(set(idents[new])).to_numpy()],
            df[scripts.isin(set(scripts[new])).to_numpy()])


def workload_table(df) -> list[dict[str, Any]]:
    """Per workload (its key, else its label and framework): the latest fingerprint (with
    its FLOP shares), the knobs the runtime refused to apply to it and the configurations
    it failed under; and the job's length: the optimizer steps its latest full job made
    (``job_steps``, ``job_run``: a deploy's run, not a trial, which its caps stop early), and
    the steps an epoch of it makes as its latest run that measured them did (a trial's too:
    ``steps_per_epoch``, for a job stated in epochs).

    A refusal or a failure is recorded with its place (``features.place``: the image and
    the target) and answers for that place only (``features.same_place``): torch.compile
    failing under one CPU's instruction set, or tcmalloc missing from one image, says
    nothing of another.  And only while it is the latest word there: a later run at the
    same place that applied the knob, or ran the configuration, lifts it.

    A failure the script is to blame for withholds nothing: one under no knob (stock's
    knobs: the script's own failure, and stock must stay on offer for the run after the
    fix), and one the runtime blamed on no knob that came while the place's latest run
    under no knob had failed as well (a search's round runs stock first: a missing file or
    a wrong argument fails every trial of the round, and must not withhold the candidates
    once it is put right)."""
    import pandas as pd

    d = df.copy()
    for col in ("workload_key", "fingerprint", "status", "not_applied", "failed_knob", "error",
                "run_id", "recorded_at", "raw", "source", "steps", "steps_per_epoch",
                "ranks", "launcher", *F.PLACE_KEYS,
                *F.WORKLOAD_FIGURES):
        if col not in d:
            d[col] = None
    d["status"] = d["status"].fillna("ok")
    # the latest word last (rows without a time, the oldest stores', first)
    d = d.iloc[d["recorded_at"].astype(str).where(d["recorded_at"].notna(), "")
               .argsort(kind="stable")]
    ident = workload_idents(d)
    d["_untimed"] = untimed_caps(d)
    out = []
    for _, g in d.groupby(ident, sort=True):
        ran = g[g["status"] != "failed"]
        ok = ran[~ran["_untimed"]]  # (a trial capped while compiling may have no fingerprint)
        last = (ok if len(ok) else g).iloc[-1]
        entry = {k: _plain(last[k]) for k in ("workload_key", "workload", "fingerprint",
                                              "framework", "trainable_parameters",
                                              "batch_size", "image_size",
                                              *F.WORKLOAD_FIGURES)}
        for k in ("batch_size", "image_size"):  # (as measured_groups has them)
            entry[k] = F.whole(entry[k])
        jobs = ok[(ok["source"] == "deploy") & (pd.to_numeric(ok["steps"], errors="coerce") > 0)]
        entry["job_steps"] = int(jobs["steps"].iloc[-1]) if len(jobs) else None
        entry["job_run"] = _plain(jobs["run_id"].iloc[-1]) if len(jobs) else None
        # the ranks its script starts itself (mp.spawn) where the job starts one process: as
        # its latest run that no launcher started had them (None: it trains in one process)
        alone = ok[~named(ok["launcher"])]
        spawned = int(rank_counts(alone).iloc[-1]) if len(alone) else 1
        entry["spawned_ranks"] = spawned if spawned > 1 else None
        epochs = pd.to_numeric(ran["steps_per_epoch"], errors="coerce").dropna()
        epochs = epochs[epochs > 0]
        entry["steps_per_epoch"] = int(epochs.iloc[-1]) if len(epochs) else None
        refused: dict[tuple, Optional[dict[str, Any]]] = {}
        failed: dict[tuple, Optional[dict[str, Any]]] = {}
        plain_failed: dict[tuple, bool] = {}  # per place: its latest run under no knob failed
        compiling: dict[tuple, Optional[dict[str, Any]]] = {}
        for r in g.to_dict("records"):
            where = F.place(r)
            spot = tuple(where.values())
            if _compiling(r, where, spot, compiling):
                continue  # (it neither applied a knob nor ran the configuration through)
            switched = {k: v for k in F.KNOBS if (v := F.knob_value(r, k)) is not None}
            plain = not switched
            if plain:
                plain_failed[spot] = r["status"] == "failed"
            own = r["status"] == "failed" and not plain and (
                bool(_plain(r["failed_knob"])) or not plain_failed.get(spot, False))
            names = r["not_applied"] if isinstance(r["not_applied"], str) else ""
            names = {n for n in names.split(",") if n}
            reasons = {}
            if names:
                try:
                    reasons = json.loads(r["raw"]).get("not_applied", {})
                except (TypeError, ValueError, AttributeError):
                    pass
            if r["status"] != "failed":  # (the latest run that ran says it, wherever it ran)
                refused[("compiler", "*", "every place")] = _script_compiles(r)
            for knob, value in switched.items():
                if knob in names:
                    refused[(knob, value, spot)] = {
                        "knob": knob, "value": value, **where, "run_id": _plain(r["run_id"]),
                        "reason": str(reasons.get(knob, "not applied"))[:200]}
                elif r["status"] != "failed":  # applied there
                    refused[(knob, value, spot)] = None
            # (2.0 in a frame with a gap: 2)
            config = {k: F.whole(_plain(r[k])) for k in CONFIG_KEYS}
            failed[(tuple(config.values()), spot)] = ({**config, **where,
                                    "knob": _plain(r["failed_knob"]),
                                    "run_id": _plain(r["run_id"]),
                                    "error": str(_plain(r["error"]) or "")[:200]}
                                   if own else None)
        entry["not_applied"] = [v for v in refused.values() if v]
        entry["failed"] = [v for v in failed.values() if v]
        entry["compiling"] = [v for v in compiling.values() if v]
        out.append(entry)
    return out


def _script_compiles(r: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Where the run ``r`` recorded that the script compiles its trained model itself
    (the runtime's ``effect.script_compile``, in a stock run too): a refusal of MODAK's
    compiler, whatever its mode (no ``value``), at every place (no place keys: the script
    compiles itself wherever it runs); else None.  A compiled candidate's trial would only
    report the knob not applied."""
    from modak_runtime.record import stored_value
    how = stored_value(r.get("raw"), "effect.script_compile")
    if not how:
        return None
    return {"knob": "compiler", "run_id": _plain(r["run_id"]),
            "reason": f"the script compiles its model itself ({how}), which stands: MODAK's "
                      "compiler is not put over it"}


def _compiling(r: dict[str, Any], where: dict[str, Any], spot: tuple,
               bounds: dict[tuple, Optional[dict[str, Any]]]) -> bool:
    """Keep in ``bounds`` (per compiler and place) how long a compilation of the workload
    ran at least there: the longest that its trials stopped while compiling ran
    (``results.still_compiling``), till a later run there under the same compiler measured
    a step time (its warm-up is then measured).  Whether ``r`` is such a trial."""
    from ..results import still_compiling

    compiler = str(_plain(r.get("compiler")) or "off")
    key = (compiler, spot)
    if not r["_untimed"]:
        if compiler != "off" and r["status"] != "failed":
            bounds[key] = None
        return False
    try:
        ran = still_compiling(json.loads(r["raw"]))
    except (TypeError, ValueError, AttributeError):
        ran = None
    now = bounds.get(key)
    if ran and (now is None or ran > now["ran_s"]):
        bounds[key] = {"compiler": compiler, **where, "ran_s": round(ran, 1),
                       "run_id": _plain(r["run_id"])}
    return True


def stale(meta: dict[str, Any]) -> Optional[str]:
    """Why a saved model cannot be used by this MODAK (None: it can)."""
    if meta.get("feature_version") != F.FEATURE_VERSION:
        return (f"its features are of version {meta.get('feature_version', 1)}, this MODAK's "
                f"are {F.FEATURE_VERSION}")
    have = meta.get("versions", {}).get("modak")
    if have != __version__:
        return f"fitted with modak {have}, this is {__version__}"
    return None


def load(path: Optional[Path] = None, refit: bool = True,
         say: Optional[Callable[[str], None]] = None, store_path=None) -> FittedModel:
    """The saved model; one saved by another MODAK or other library versions is refitted
    (the quick estimators, on the shipped dataset and the store at ``store_path``) and saved
    in its place (``refit``), else an error."""
    import joblib

    path = path or default_path()
    if not path.exists():
        raise ModelError(f"{path}: no fitted model (run `modak model fit`)")
    blob = None
    try:
        blob = joblib.load(path)
        meta = blob["meta"]
        why = stale(meta)
        if why is None:
            now = library_versions()
            for lib in ("scikit-learn", "numpy"):
                if meta.get("versions", {}).get(lib) != now[lib]:
                    why = (f"fitted with {lib} {meta.get('versions', {}).get(lib)}, "
                           f"this is {now[lib]}")
    except (ImportError, AttributeError) as exc:  # its classes lived elsewhere then
        why = f"saved by another MODAK ({type(exc).__name__}: {exc})"
    except Exception as exc:  # a corrupt or foreign file
        raise ModelError(f"{path}: not a MODAK model ({type(exc).__name__}: {exc})") from None
    if why is None:
        return FittedModel(blob["estimator"], blob["name"], ModelCard(**meta), blob.get("data"))
    if not refit:
        raise ModelError(f"{path}: {why}: refit with `modak model fit`")
    (say or (lambda text: None))(f"{path}: {why}: refitting it")
    return fit_from_store(store_path, out=path, estimators=QUICK_ESTIMATORS)


def fit_from_store(store_path=None, out: Optional[Path] = None,
                   estimators: Optional[Sequence[str]] = None) -> FittedModel:
    from ..results import ResultsStore, load_frame
    model = fit(load_frame(ResultsStore(store_path)), estimators=estimators)
    model.save(out or default_path())
    return model


# ---------------------------------------------------------------------------
def model_predictor(model: FittedModel, measurements=None):
    """The planner's predictor over a fitted scikit-learn model (any estimator) and the
    measurements given (by default those it was fitted on)."""
    import pandas as pd

    from .predictor import FastPredictor

    data = measurements if measurements is not None else model.data
    predictor = FastPredictor(
        model.meta, formula=lambda row: float(model.predict_log(pd.DataFrame([row]))[0]),
        measured=measured_groups(training_frame(data) if measurements is not None else data),
        workloads=workload_table(measurements) if measurements is not None else None)
    predictor.model = model
    return predictor


def fit_if_possible(path: Optional[Path] = None) -> bool:
    """Fit the linear model from the shipped dataset and the store, if there is data."""
    from ..results import ResultsStore, StoreError, load_frame

    try:
        fit(load_frame(ResultsStore()), estimators=QUICK_ESTIMATORS).save(
            path or default_path())
    except (StoreError, ModelError):
        return False
    return True


@dataclass(frozen=True)
class Refit:
    """What :func:`refit_after_run` did: the saved model's id, whether it is a new fit, and
    in words why not (``note``: empty for a new fit)."""
    model_id: str
    refitted: bool
    note: str = ""


def refit_after_run(store, path: Optional[Path] = None) -> Refit:
    """The closed loop's refit once a run is recorded in ``store``: the quick estimators on
    the shipped datasets and the store, saved at ``path``.

    A saved model that this MODAK can use is kept when the refit would lose what it was
    fitted on: one of an estimator the quick refit does not consider (``modak model fit``
    chose it), or one fitted on more measurements than the shipped datasets and the store
    hold (a campaign's ``--data`` the store lacks).  Its predictor reads the new run from
    the store when it plans (the measured medians, the workload's stock-anchored level);
    ``modak model fit`` refits it.

    The quick model's estimators are compared on held-out data again only once the
    measurements grew by ``REFRESH_SHARE`` since they were: before that the kept estimator
    is refitted alone on all of them (a few seconds, not half a minute after each trial of
    a search), its held-out figures carried over (the card's ``held_out_rows``)."""
    from ..results import load_frame

    path = path or default_path()
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        meta = None
    data = load_frame(store)
    carry, every = None, None
    if isinstance(meta, dict) and path.exists() and stale(meta) is None:
        every = training_frame(data)
        frame = usable(every)
        why = None
        if meta.get("estimator") not in QUICK_ESTIMATORS:
            why = "a full fit"
        elif int(meta.get("rows") or 0) > len(frame):
            why = f"fitted on {meta.get('rows')} measurements, more than the store's and the " \
                  "shipped ones"
        if why:
            return Refit(str(meta.get("model_id")), False,
                         f"kept {meta.get('model_id')}: {why} (`modak model fit` refits it); "
                         "it reads this run from the store")
        carry = _still_compared(meta, frame)
    model = fit(data, estimators=QUICK_ESTIMATORS, carry=carry, every=every)
    model.save(path)
    return Refit(model.meta["model_id"], True)


def _still_compared(meta: dict[str, Any], frame) -> Optional[ModelCard]:
    """The saved quick model's card when its held-out comparison stands for ``frame``: the
    data only grew since (every family and target it had is still there), by less than
    ``REFRESH_SHARE``."""
    try:
        card = ModelCard(**meta)
    except ValueError:
        return None
    compared = card.held_out_rows or card.rows
    grown = set(card.families) <= set(frame["workload"].astype(str)) \
        and set(card.targets) <= set(target_id(frame))
    if grown and card.held_out_by == held_out_groups(frame) and \
            compared <= len(frame) <= compared * (1 + REFRESH_SHARE):
        return card
    return None
