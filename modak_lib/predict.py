"""Fast predictions for the planner: a fitted linear model as plain arithmetic.

``modak plan`` must stay fast, and loading scikit-learn and pandas costs over a second.
A fitted linear model (one-hot + scaling [+ pairwise interactions] + ridge) is exported into
the model's JSON sidecar together with the measured medians, and evaluated here with the
standard library only.  ``tests/test_model.py`` checks it agrees with scikit-learn.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from . import __version__
from .models import Configuration, JobRequest, Prediction

MIN_CONFIGS = 3        # measured configurations of a workload on a target before the model speaks
Z90 = 1.645            # two-sided 90% interval in log space
CATEGORICAL = ["workload", "framework", "compiler", "allocator", "precision", "channels_last",
               "onednn", "microarchitecture", "accelerator", "bf16_native"]
NUMERIC = ["log_params", "log_macs", "log_batch", "log_threads", "log_cores"]
CONFIG_KEYS = ["compiler", "threads", "allocator", "precision", "channels_last", "onednn"]
MATCH_KEYS = CONFIG_KEYS + ["framework", "batch_size"]

# multiply-accumulates per sample (forward) at the reference input size, and that size
WORKLOADS = {
    "mnist-cnn": {"params": 1_199_882, "macs": 11_992_448, "size": 28, "batch": 128},
    "resnet18": {"params": 11_689_512, "macs": 1_819_000_000, "size": 224, "batch": 32},
    "resnet50": {"params": 25_557_032, "macs": 4_110_000_000, "size": 224, "batch": 32},
}
BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


class PredictError(Exception):
    pass


def macs(workload: str, image_size: Optional[float]) -> float:
    w = WORKLOADS.get(workload)
    if w is None:
        return float("nan")
    size = image_size if image_size and image_size == image_size else w["size"]
    return w["macs"] * (float(size) / w["size"]) ** 2


def candidate_rows(request: JobRequest, configs: Sequence[Configuration],
                   catalogue=None) -> list[dict[str, Any]]:
    """Store-shaped rows describing each candidate configuration of ``request``."""
    from .catalogue import load_catalogue

    cat = catalogue or load_catalogue()
    app, target = request.application, request.target
    workload = app.model or "unknown"
    w = WORKLOADS.get(workload, {})
    acc = target.accelerators
    rows = []
    for c in configs:
        variant = cat.variant(c.image)
        framework = "keras" if variant.framework in ("keras", "tensorflow") else variant.framework
        rows.append({
            "workload": workload, "framework": framework,
            "trainable_parameters": w.get("params", float("nan")),
            "batch_size": app.batch_size or w.get("batch", 32),
            "image_size": w.get("size", 224),
            "compiler": c.compiler or "off",
            "threads": c.threads, "allocator": c.allocator.value, "precision": c.precision.value,
            "channels_last": 0, "onednn": 1, "microarchitecture": target.microarchitecture,
            "cores": target.cores_per_node,
            "accelerator": (acc.model or acc.vendor) if acc else None,
            "bf16_native": bool(BF16_FLAGS & set(target.cpu_features)),
        })
    return rows


def features(row: dict[str, Any]) -> tuple[list[str], list[float]]:
    """The model's categorical and numeric inputs of one row (as ``model.feature_frame``)."""
    def s(v: Any, default: str) -> str:
        return default if v is None or v != v else str(v)
    cats = [s(row["workload"], "nan"), s(row["framework"], "nan"), s(row["compiler"], "off"),
            s(row["allocator"], "glibc"), s(row["precision"], "fp32"),
            str(int(row.get("channels_last") or 0)), str(int(1 if row.get("onednn") is None
                                                              else row["onednn"])),
            s(row["microarchitecture"], "unknown"), s(row.get("accelerator"), "none"),
            str(bool(row.get("bf16_native")))]
    params = row.get("trainable_parameters")
    if not params or params != params or params <= 0:
        params = WORKLOADS.get(row["workload"], {}).get("params", float("nan"))
    nums = [_log(params), _log(macs(row["workload"], row.get("image_size"))),
            _log(row["batch_size"]), _log(row["threads"]), _log(row["cores"])]
    return cats, nums


def _log(v: Any) -> float:
    try:
        return math.log(float(v))
    except (TypeError, ValueError):
        return float("nan")


class LinearFormula:
    """y = intercept + coef . terms(onehot(cats) ++ (nums - mean) / scale)."""

    def __init__(self, spec: dict[str, Any]):
        self.categories = spec["categories"]
        self.mean, self.scale = spec["mean"], spec["scale"]
        self.terms = spec.get("terms")  # interaction terms: lists of base indices
        self.coef, self.intercept = spec["coef"], spec["intercept"]

    def __call__(self, row: dict[str, Any]) -> float:
        cats, nums = features(row)
        x: list[float] = []
        for value, known in zip(cats, self.categories):
            x.extend(1.0 if value == k else 0.0 for k in known)
        x.extend((v - m) / sc if sc else 0.0 for v, m, sc in zip(nums, self.mean, self.scale))
        if self.terms is not None:
            x = [math.prod(x[i] for i in term) for term in self.terms]
        return self.intercept + sum(c * v for c, v in zip(self.coef, x))


class FastPredictor:
    """The planner's predictor from a model's JSON sidecar: no numpy, pandas or sklearn."""

    def __init__(self, meta: dict[str, Any], formula=None,
                 measured: Optional[list[dict[str, Any]]] = None):
        """``formula`` (row -> log s/step) and ``measured`` default to the exported ones."""
        light = meta.get("light") or {}
        if formula is None:
            if not light:
                raise PredictError("the model has no exported linear formula")
            formula = LinearFormula(light["formula"])
        self.meta = meta
        self.formula = formula
        self.measured = measured if measured is not None else light.get("measured", [])
        self.sigma = meta.get("sigma_log", 0.5)
        self.notes: list[str] = []

    @classmethod
    def load(cls, path: Path) -> "FastPredictor":
        side = path.with_suffix(".json")
        try:
            meta = json.loads(side.read_text())
        except (OSError, ValueError) as exc:
            raise PredictError(f"{side}: cannot read the model description ({exc})") from None
        if meta.get("versions", {}).get("modak") != __version__:
            raise PredictError(f"{side}: fitted with modak {meta.get('versions', {}).get('modak')},"
                               f" this is {__version__}: refit with `modak model fit`")
        return cls(meta)

    def predict(self, request: JobRequest, configs: Sequence[Configuration]
                ) -> list[Optional[Prediction]]:
        self.notes = []
        workload = request.application.model
        if not configs:
            return []
        if workload not in WORKLOADS:
            self.notes.append(f"no performance data for workload {workload!r}: prior used "
                              f"(known: {', '.join(WORKLOADS)})")
            return [None] * len(configs)
        target = request.target
        same = [m for m in self.measured if m["workload"] == workload
                and m["microarchitecture"] == target.microarchitecture
                and float(m["cores"]) == float(target.cores_per_node)]
        distinct = {tuple(str(m[k]) for k in MATCH_KEYS) for m in same}
        if len(distinct) < MIN_CONFIGS:
            self.notes.append(
                f"cold start: {len(distinct)} measured configuration(s) of {workload} on "
                f"{target.microarchitecture} with {target.cores_per_node} cores "
                f"(the model needs {MIN_CONFIGS}); prior used")
            return [None] * len(configs)
        out: list[Optional[Prediction]] = []
        for row in candidate_rows(request, configs):
            key = tuple(str(row[k]) for k in MATCH_KEYS)
            hit = [m for m in same if tuple(str(m[k]) for k in MATCH_KEYS) == key]
            if hit:
                m = hit[0]
                out.append(Prediction(seconds=m["median"], low=m["min"], high=m["max"],
                                      source=f"measured median of {m['n']} run(s)"))
            else:
                mid = math.exp(self.formula(row))
                out.append(Prediction(seconds=mid, low=mid * math.exp(-Z90 * self.sigma),
                                      high=mid * math.exp(Z90 * self.sigma),
                                      source=f"model {self.meta['model_id']}"))
        return out
