"""The planner's predictor: a fitted model answered fast, with the standard library only.

``modak plan`` must stay fast, and loading scikit-learn and pandas costs over a second.
A fitted linear model (one-hot + scaling [+ pairwise interactions] + ridge) is exported into
the model card (its JSON sidecar) with the measured medians, and evaluated here on the
same features (:mod:`.features`).  ``tests/test_model.py`` checks it agrees with
scikit-learn.

The model speaks for any workload whose fingerprint is known (it ran once, or a trial
measured it) on any target whose figures are known (``modak probe``, or the infrastructure
file's ``peak_gflops``/``peak_gflops_bf16``/``memory_bandwidth_gbs``); a configuration
measured on the same target is answered by its measured median.  Otherwise it says what is
missing, and the planner's prior and the budgeted trials settle the choice.
"""
from __future__ import annotations

import json
import math
import statistics
import struct
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import ModakError
from ..models import Configuration, JobRequest, Prediction, Runtime, StepLosses
from ..workload import key as workload_key, label as workload_label
from . import features as F
from .probe import target_figures

Z90 = 1.645            # two-sided 90% interval in log space
# the model decides for a workload or target it never measured only when its error on
# held-out workload families is below this (log space: within about x1.6 either way)
MAX_UNSEEN_SIGMA = 0.5
CONFIG_KEYS = F.CONFIG_KEYS
MATCH_KEYS = CONFIG_KEYS + ["framework", "batch_size"]


class PredictError(Exception):
    pass


class StaleModel(PredictError):
    """A saved model from another MODAK (its features or libraries differ): refit it."""


def candidate_rows(request: JobRequest, configs: Sequence[Configuration],
                   catalogue=None, workload: Optional[dict[str, Any]] = None
                   ) -> list[dict[str, Any]]:
    """Store-shaped rows describing each candidate configuration of ``request``; the
    workload's columns come from its measured fingerprint (``workload``), when known, the
    target's from its figures, the image the one the run would be recorded in (the host's,
    when the target runs no container), its ranks those the job starts (:func:`ranks`)."""
    from ..catalogue import load_catalogue
    from ..planner import choose_runtime

    cat = catalogue or load_catalogue()
    on_host = choose_runtime(request) == Runtime.none
    app, target = request.application, request.target
    w = workload or {}
    job_ranks = ranks(request, w)
    acc = target.accelerators
    figures = target_figures(target)
    rows = []
    for c in configs:
        variant = cat.variant(c.image)
        framework = "keras" if variant.framework in ("keras", "tensorflow") else variant.framework
        rows.append({
            "workload": w.get("workload", "unknown"), "fingerprint": w.get("fingerprint"),
            "image": F.HOST_IMAGE if on_host else c.image,
            "framework": framework,
            "trainable_parameters": w.get("trainable_parameters", float("nan")),
            # the fingerprint's figures, as the workload table has them (F.WORKLOAD_FIGURES)
            **{k: w.get(k) for k in F.WORKLOAD_FIGURES},
            "flops_per_step": w.get("flops_per_step", float("nan")),
            "batch_size": w.get("batch_size") or app.batch_size or 32,
            "image_size": w.get("image_size"),
            "compiler": c.compiler or "off",
            "threads": c.threads, "allocator": c.allocator.value, "precision": c.precision.value,
            "channels_last": 0, "onednn": 1, "ranks": job_ranks,
            "microarchitecture": target.microarchitecture,
            "cores": target.cores_per_node,
            "accelerator": (acc.model or acc.vendor) if acc else None,
            **figures,
        })
    return rows


def ranks(request: JobRequest, workload: Optional[dict[str, Any]] = None) -> int:
    """How many training ranks the request's job runs: those its launcher starts (its nodes
    times its tasks on each), else those its script starts itself, as its runs measured them
    (``spawned_ranks`` of the workload table: ``mp.spawn``); 1 for a single process."""
    from ..planner import rank_layout

    nodes, tasks = rank_layout(request)
    return nodes * tasks if nodes * tasks > 1 else int((workload or {}).get("spawned_ranks")
                                                       or 1)


def compiling_bound(workload: dict[str, Any], row: dict[str, Any]
                    ) -> Optional[dict[str, Any]]:
    """How long a compilation of ``workload`` under ``row``'s compiler ran at least at
    ``row``'s place (the workload table's ``compiling``: its longest trial there stopped
    while compiling, since the last run there that measured that compiler's warm-up), or
    None."""
    compiler = str(row.get("compiler") or "off")
    if compiler == "off":
        return None
    here = F.place(row)
    hits = [b for b in workload.get("compiling") or ()
            if b.get("compiler") == compiler and F.same_place(b, here, host_for_all=False)]
    return max(hits, key=lambda b: b["ran_s"]) if hits else None


def encode(spec: dict[str, Any], cats: list[str], nums: list[float]) -> list[float]:
    """A pipeline's inputs as ``fit`` exported them: the categories one-hot, the numbers
    less their mean over their scale."""
    x: list[float] = []
    for value, known in zip(cats, spec["categories"]):
        x.extend(1.0 if value == k else 0.0 for k in known)
    x.extend((v - m) / sc if sc else 0.0 for v, m, sc in zip(nums, spec["mean"], spec["scale"]))
    return x


class LinearFormula:
    """log s/step = baseline + clip(intercept + coef . terms(onehot(cats) ++ (nums - mean) /
    scale), range) (``features.baseline``: the step's arithmetic at the target's measured
    rates; ``range``: the efficiencies measured, widened)."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.terms = spec.get("terms")  # interaction terms: lists of base indices
        self.coef, self.intercept = spec["coef"], spec["intercept"]
        self.low, self.high = spec.get("range", [-1e9, 1e9])

    def __call__(self, row: dict[str, Any]) -> float:
        x = encode(self.spec, *F.features(row))
        if self.terms is not None:
            x = [math.prod(x[i] for i in term) for term in self.terms]
        learned = self.intercept + sum(c * v for c, v in zip(self.coef, x))
        return F.baseline(row) + min(self.high, max(self.low, learned))


def _float32(v: float) -> float:
    """``v`` as the float32 scikit-learn's trees compare."""
    return struct.unpack("f", struct.pack("f", v))[0]


class TreeFormula:
    """log s/step = baseline + clip(sum over the parts of init + rate x the sum of its
    trees' leaves, range): gradient boosting, or extra trees (init 0, rate 1/trees: their
    mean), as ``fit.export_trees`` exported them.  A
    ``Split`` model has two parts: the configuration's ratio to its cell's stock, on the
    row's features, and the stock level, on the same row's features under the stock
    configuration (``features.as_stock``).  A number the row lacks (NaN) is taken at its
    training mean."""

    def __init__(self, spec: dict[str, Any]):
        self.parts = spec["parts"]
        self.low, self.high = spec.get("range", [-1e9, 1e9])

    @staticmethod
    def _part(part: dict[str, Any], cats: list[str], nums: list[float]) -> float:
        x = [_float32(v) for v in encode(part, cats, [
            m if v != v else v for v, m in zip(nums, part["mean"])])]
        total = 0.0
        for left, right, feature, threshold, value in part["trees"]:
            node = 0
            while left[node] != -1:
                node = left[node] if x[feature[node]] <= threshold[node] else right[node]
            total += value[node]
        return part["init"] + part["rate"] * total

    def __call__(self, row: dict[str, Any]) -> float:
        cats, nums = F.features(row)
        learned = sum(self._part(p, *(F.as_stock(cats, nums) if p["stock"] else (cats, nums)))
                      for p in self.parts)
        return F.baseline(row) + min(self.high, max(self.low, learned))


def formula_of(spec: dict[str, Any]):
    """The exported formula's evaluator."""
    return TreeFormula(spec) if spec.get("kind") == "trees" else LinearFormula(spec)


class FastPredictor:
    """The planner's predictor from a model's JSON sidecar: no numpy, pandas or sklearn."""

    def __init__(self, meta: dict[str, Any], formula=None,
                 measured: Optional[list[dict[str, Any]]] = None,
                 workloads: Optional[list[dict[str, Any]]] = None):
        """``formula`` (row -> log s/step), ``measured`` (medians per configuration) and
        ``workloads`` (what runs measured of each workload) default to the exported ones."""
        light = meta.get("light") or {}
        if formula is None:
            if "formula" not in light:
                raise PredictError("the model has no exported formula")
            formula = formula_of(light["formula"])
            effects = meta.get("machine_effects") or {}
            if effects:  # (a known machine's own speed, beyond what its probe says)
                plain = formula

                def formula(row: dict[str, Any]) -> float:
                    return plain(row) + effects.get(F.machine(row), 0.0)
        self.meta = meta
        self.formula = formula
        self.measured = measured if measured is not None else light.get("measured", [])
        self.workloads: list[dict[str, Any]] = (workloads if workloads is not None
                                                else light.get("workloads", []))
        self.sigma = meta.get("sigma_log", 0.5)
        self.notes: list[str] = []

    @classmethod
    def load(cls, path: Path) -> "FastPredictor":
        side = path.with_suffix(".json")
        try:
            meta = json.loads(side.read_text())
        except (OSError, ValueError) as exc:
            raise PredictError(f"{side}: cannot read the model description ({exc})") from None
        from .fit import stale  # (no scikit-learn: stale reads the card)
        why = stale(meta)
        if why is not None:
            raise StaleModel(f"{side}: {why}: refit with `modak model fit`")
        return cls(meta)

    def with_runs(self, frame, since: Optional[str] = None) -> "FastPredictor":
        """This predictor with the measured medians and workloads of ``frame`` (the store and
        the shipped datasets, as ``results.load_frame`` reads them) in place of the card's
        for every group and workload the frame holds: the card's are those of its fit, which
        may hold more (a campaign's ``--data``) and lacks the runs recorded since.  With
        ``since`` (the card's ``fitted_at``), only for those that runs recorded since bear on
        (``fit.since_rows``): the rest are the card's as they stand, not read again (the
        whole frame's took 3.5 s here, before each trial of a search)."""
        from .fit import (MEASURED_KEYS, measured_groups, since_rows, training_frame,
                          workload_table)

        def ident(w: dict[str, Any]) -> tuple:
            return (w.get("workload_key"),) if w.get("workload_key") else (
                w.get("workload"), w.get("framework"), w.get("batch_size"))

        def group(m: dict[str, Any]) -> tuple:
            # (a card's groups of before the ranks were kept are of single processes)
            return tuple(str(int(m.get(k) or 1) if k == "ranks" else m.get(k))
                         for k in MEASURED_KEYS)

        mine, theirs = since_rows(frame, since) if since else (frame, frame)
        workloads = workload_table(mine) if len(mine) else []
        measured = measured_groups(training_frame(theirs)) if len(theirs) else []
        have = {ident(w) for w in workloads}
        seen = {group(m) for m in measured}
        return FastPredictor(
            self.meta, formula=self.formula,
            measured=[m for m in self.measured if group(m) not in seen] + measured,
            workloads=[w for w in self.workloads if ident(w) not in have] + workloads)

    def workload(self, request: JobRequest) -> Optional[dict[str, Any]]:
        """What earlier runs measured of this request's workload: by its key, else by its
        label (same framework and batch); None when it never ran."""
        app = request.application
        key, name = workload_key(app), workload_label(app)
        hit = [w for w in self.workloads if w.get("workload_key") == key]
        if not hit and app.model:
            frameworks = {"keras": ("keras", "tensorflow"), "tensorflow": ("keras", "tensorflow")}
            allowed = frameworks.get(app.framework.value, (app.framework.value,))
            hit = [w for w in self.workloads if w.get("workload") == name
                   and w.get("framework") in allowed
                   and (not app.batch_size or w.get("batch_size") == app.batch_size)]
        return hit[-1] if hit else None

    def job_steps(self, request: JobRequest) -> Optional[tuple[int, Optional[str]]]:
        """The optimizer steps this request's job made when it last ran in full (a deploy,
        not a trial) under the same framework, script and arguments (its key), with that
        run's id; None when it never did."""
        key = workload_key(request.application)
        hit = [w for w in self.workloads
               if w.get("workload_key") == key and w.get("job_steps")]
        return (int(hit[-1]["job_steps"]), hit[-1].get("job_run")) if hit else None

    def steps_per_epoch(self, request: JobRequest) -> Optional[int]:
        """The optimizer steps an epoch of this request's workload makes, as its latest run
        that measured them did (a trial's too; by its key, else its label as
        :meth:`workload` finds it); None when none did."""
        w = self.workload(request)
        return int(w["steps_per_epoch"]) if w and w.get("steps_per_epoch") else None

    def exclusions(self, request: JobRequest, configs: Sequence[Configuration]
                   ) -> list[Optional[str]]:
        """Why a configuration must not be offered for this workload here (None: it may):
        a knob at the value the runtime refused to apply, or a configuration the workload
        failed under, at this place (``features.same_place``: this target, this image; one
        on the host says nothing of an image, which may well have the library the host
        lacked: a wrong exclusion hides a configuration for good, a wrong offer costs one
        run)."""
        w = self.workload(request)
        if not w:
            return [None] * len(configs)
        refused = w.get("not_applied") or []
        if isinstance(refused, dict):  # (a table of an older MODAK: knob -> reason)
            refused = [{"knob": k, "reason": v} for k, v in refused.items()]
        out: list[Optional[str]] = []
        for row in candidate_rows(request, configs, workload=w):
            here, why = F.place(row), None
            for r in refused:
                value = F.knob_value(row, r["knob"]) if r["knob"] in F.KNOBS else None
                if value is not None and r.get("value", value) == value \
                        and F.same_place(r, here, host_for_all=False):
                    why = f"{r['knob']}={value} was not applied to this script here: " \
                          f"{r['reason']}"
                    break
            cfg = tuple(str(row[k]) for k in CONFIG_KEYS)
            for fail in w.get("failed") or []:
                if why is None and tuple(str(fail[k]) for k in CONFIG_KEYS) == cfg \
                        and F.same_place(fail, here, host_for_all=False):
                    why = (f"failed when run here ({fail.get('run_id') or 'a run'}"
                           + (f", under the knob {fail['knob']}" if fail.get("knob") else "")
                           + f"): {fail.get('error') or 'no reason recorded'}")
            out.append(why)
        return out

    def predict(self, request: JobRequest, configs: Sequence[Configuration]
                ) -> list[Optional[Prediction]]:
        self.notes = []
        if not configs:
            return []
        w = self.workload(request)
        name = workload_label(request.application)
        if w is None:
            self.notes.append(f"no measurement of workload {name!r} yet (key "
                              f"{workload_key(request.application)}): the model needs its "
                              "fingerprint; the prior decides, and its first run (or a "
                              "trial) measures it")
            return [None] * len(configs)
        fp = w.get("fingerprint") or w.get("workload")
        target = request.target
        rows = candidate_rows(request, configs, workload=w)
        device = rows[0].get("accelerator") if rows else None
        # measured here: the same CPU, cores and accelerator (none on both sides for a CPU),
        # as many training ranks
        n_ranks = rows[0]["ranks"] if rows else 1
        same = [m for m in self.measured if (m.get("fingerprint") or m.get("workload")) == fp
                and m["microarchitecture"] == target.microarchitecture
                and float(m["cores"]) == float(target.cores_per_node)
                and (m.get("accelerator") or None) == (device or None)
                and int(m.get("ranks") or 1) == n_ranks]
        lacking = F.missing(rows[0]) if rows else []
        if not lacking and n_ranks > 1:
            # (fitted on single processes: fit.usable)
            lacking = [f"a model of {n_ranks} training ranks: it learns from single "
                       "processes, and a rank shares its node and waits for the others' "
                       "gradients"]
        known = (self.meta.get("light") or {}).get("accelerators")
        if not lacking and known is not None and device and device not in known:
            lacking = [f"a measurement on a {device} (its data are of "
                       + (", ".join(known) if known else "CPUs only") + ")"]
        # a workload not measured on this target: its error as measured on held-out workload
        # families, else on held-out configurations
        seen = bool(same)
        framework = str(rows[0]["framework"]) if rows else None
        # (a new workload: the held-out families' error, of its own framework where the card
        # measured that apart)
        per_framework = (self.meta.get("sigma_log_unseen_by_framework") or {}).get(framework)
        sigma = self.sigma if seen else per_framework if per_framework is not None else \
            self.meta.get("sigma_log_unseen", self.sigma)
        families = f"held-out {framework} workload families" if per_framework is not None \
            else "held-out workload families"
        if lacking:
            self.notes.append(f"the model cannot speak for {name} here: it lacks "
                              + "; ".join(lacking)
                              + (" (measured configurations are answered by their "
                                 "measurements)" if same else ""))
        if not seen and not lacking and sigma > MAX_UNSEEN_SIGMA:
            lacking = [f"a model that transfers: its error on {families} is "
                       f"x{math.exp(sigma):.2f} (sigma {sigma:.2f} in log space, more than "
                       f"{MAX_UNSEEN_SIGMA}), too wide to decide here; trials settle it"]
            self.notes.append(f"the model cannot speak for {name} here: it lacks "
                              + lacking[0])
        elif not seen and not lacking:
            self.notes.append(f"{name} (fingerprint {fp}) was not measured on "
                              f"{target.microarchitecture} with {target.cores_per_node} "
                              "cores: predicted from what it and the target are (its "
                              f"interval is the {families}' error, "
                              f"x{math.exp(Z90 * sigma):.2f})")
        out: list[Optional[Prediction]] = []
        correct = self._knob_effects(rows[0], same, target.cores_per_node) \
            if rows and not lacking else None
        for cfg, row in zip(configs, rows):
            key = tuple(str(row[k]) for k in MATCH_KEYS)
            # a run in another image is not this image's measurement; a run outside any
            # image (the shipped campaigns ran on the host) stands for each, after a run
            # in this very image
            hit = sorted((m for m in same if tuple(str(m[k]) for k in MATCH_KEYS) == key
                          and F.same_image(m.get("image"), row["image"])),
                         key=lambda m: m.get("image") != row["image"])
            if hit:
                m = hit[0]
                seconds, how = m["median"], f"measured median of {m['n']} run(s)"
                stock = self._stock_beside(m, same, target.cores_per_node)
                if stock is not None:
                    seconds = stock["median"] * math.exp(m["vs_stock"])
                    how += (f", taken as {math.exp(m['vs_stock']):.3f}x stock's measured median "
                            f"({stock['n']} run(s)): its median ratio in the {m['rounds']} "
                            "round(s) they ran side by side")
                out.append(Prediction(seconds=seconds, low=min(m["min"], seconds),
                                      high=max(m["max"], seconds), source=how,
                                      measured=True, warmup_s=m.get("warmup_s"),
                                      loss=m.get("loss"), end_loss=m.get("end_loss"),
                                      start_loss=m.get("start_loss"),
                                      steps=m.get("steps"),
                                      losses=[StepLosses(**x) for x in m.get("losses") or ()],
                                      rounds=m["rounds"] if stock is not None else None))
            elif lacking:
                out.append(None)
            else:
                log_mid, how = self.formula(row), f"model {self.meta['model_id']}"
                if correct is not None:
                    shift, used = correct(row)
                    if used:
                        log_mid += shift
                        how += f", corrected by this workload's measured {', '.join(used)}"
                mid = math.exp(log_mid)
                warm, whose = self._warmup(row, same)
                if warm:
                    how += f"; warm-up {warm:.3g} s, as measured {whose}"
                bound = compiling_bound(w, row)
                if bound and bound["ran_s"] > (warm or 0.0):
                    warm = bound["ran_s"]
                    how += (f"; warm-up at least {warm:.3g} s: a trial here "
                            f"({bound.get('run_id') or 'an earlier run'}) was still compiling "
                            "after that")
                out.append(Prediction(seconds=mid, low=mid * math.exp(-Z90 * sigma),
                                      high=mid * math.exp(Z90 * sigma), source=how,
                                      warmup_s=warm,
                                      compiling_s=bound["ran_s"] if bound else None))
        return out

    @staticmethod
    def _stock_beside(m: dict[str, Any], same: list[dict[str, Any]], cores: int
                      ) -> Optional[dict[str, Any]]:
        """Stock's measured group that ``m`` ran beside in some rounds (``vs_stock``), in the
        same image, framework and batch: ``m``'s time is then stock's times their ratio in
        those rounds, as the search compared them (``fit.measured_groups``)."""
        if m.get("vs_stock") is None:
            return None
        stock = {**F.STOCK, "threads": cores}
        return next((s for s in same if all(str(s[k]) == str(stock[k]) for k in CONFIG_KEYS)
                     and all(s.get(k) == m.get(k) for k in ("image", "framework", "batch_size"))),
                    None)

    def _warmup(self, row: dict[str, Any], same: list[dict[str, Any]]
                ) -> tuple[Optional[float], str]:
        """The warm-up a candidate not measured yet pays once (its compilation): the median
        of this workload's measured warm-ups here under the same compiler setting; for a
        compiler this workload never ran with here, the median of that compiler's measured
        warm-ups over every workload (ResNet-50 compiled in 53 s here, MNIST-CNN in 20 s).
        The planner adds it to the job's time, so an unmeasured compiler is not free to a
        short job.  (None, "") when nothing was measured."""
        compiler = str(row.get("compiler"))

        def median(groups: list[dict[str, Any]]) -> Optional[float]:
            v = [float(m["warmup_s"]) for m in groups
                 if m.get("warmup_s") is not None and str(m.get("compiler")) == compiler]
            return statistics.median(v) if v else None

        mine = median(same)
        if mine is not None:
            return mine, "of this workload here"
        if compiler == "off":
            return None, ""
        every = median(self.measured)
        return (every, f"of {compiler} over every workload") if every is not None else (None, "")

    def _knob_effects(self, template: dict[str, Any], same: list[dict[str, Any]], cores: int):
        """A correction of the model by this workload's own measurements on this target.

        The model's knob effects are learned across workloads (bf16 helps a CNN here and
        slows a small transformer down).  Where this workload was measured at stock and with
        a knob alone, the knob's measured effect replaces the model's: in log space,
        correction(c) = r(stock) + sum over c's knobs of (r(stock + knob) - r(stock)),
        r = log(measured) - model, over the knobs measured alone (others keep the model's).
        Without a stock measurement: the mean residual (the level only)."""
        def row_of(m: dict[str, Any]) -> dict[str, Any]:
            return {**template, **{k: m[k] for k in CONFIG_KEYS}}

        def key(r: dict[str, Any]) -> tuple:
            return tuple(str(r[k]) for k in CONFIG_KEYS)

        residual = {}
        for m in same:
            if str(m["framework"]) == str(template["framework"]) and \
                    str(m["batch_size"]) == str(template["batch_size"]):
                residual[key(m)] = math.log(m["median"]) - self.formula(row_of(m))
        if not residual:
            return None
        stock = {**F.STOCK, "threads": cores}
        base = residual.get(key(stock))

        def correct(row: dict[str, Any]) -> tuple[float, list[str]]:
            if base is None:
                return sum(residual.values()) / len(residual), ["level"]
            shift, used = base, ["stock"]
            for k in CONFIG_KEYS:
                if str(row[k]) != str(stock[k]):
                    alone = residual.get(key({**stock, k: row[k]}))
                    if alone is not None:
                        shift += alone - base
                        used.append(f"{k}={row[k]}")
            return shift, used
        return correct


def load_predictor(choice: str = "auto", say: Optional[Callable[[str], None]] = None,
                   notice: Optional[Callable[[str], None]] = None):
    """The performance model the planner asks, or None for the prior.

    A model with an exported formula (linear, boosted or extra trees) is evaluated from its
    card (fast: no scikit-learn or pandas); where the store holds runs recorded since its
    fit (a model the refit after a run kept), pandas reads their medians and workloads
    (``FastPredictor.with_runs``). Other estimators load scikit-learn. ``auto`` fits a
    model on first use.  ``say``: progress; ``notice``: what a person waits for (a fit on
    first use, a refit), ``say`` where not given.
    """
    say = say or (lambda text: None)
    notice = notice or say
    if choice == "none":
        say("no model: the rule-based prior decides")
        return None
    from .fit import default_path
    path = default_path() if choice == "auto" else Path(choice)
    if not path.exists():
        if choice != "auto":
            raise ModakError(f"{path}: no fitted model (run `modak model fit`)")
        try:
            import sklearn  # noqa: F401
        except ImportError:
            say("no model and no scikit-learn to fit one: the prior decides")
            return None
        from .fit import fit_if_possible
        notice(f"no model at {path} yet: fitting one on the measured datasets (once; "
               "seconds)")
        if not fit_if_possible(path):
            say("nothing to fit on: the prior decides")
            return None
    from ..results import ResultsStore, StoreError, load_frame
    try:
        say(f"model {path}")
        fast = FastPredictor.load(path)
    except StaleModel as exc:
        if choice != "auto":
            raise ModakError(str(exc)) from None
        # the saved model is from another MODAK (features may differ): refit it once
        from .fit import fit_if_possible
        notice(f"{exc}: refitting it now")
        if not fit_if_possible(path):
            return None
        try:
            return FastPredictor.load(path)
        except PredictError:
            pass  # refitted, without an exported formula: the full model below predicts
    except PredictError:
        pass  # no exported formula: the full model below predicts
    else:
        # the card's measured medians and workloads are those of its fit: runs recorded
        # since (a model that a run's refit kept, `modak model fit --data`) are read from
        # the store beside them; the card's formula still predicts
        store = ResultsStore()
        try:
            latest = store.latest()
        except StoreError:
            latest = None
        # (a card's groups without their losses by steps are an earlier MODAK's: read
        # afresh, a checked precision would read as unchecked)
        current = all("losses" in m for m in fast.measured)
        if current and (not latest or latest < str(fast.meta.get("fitted_at") or "")):
            return fast
        say("the store has runs newer than the model: reading them" if current else
            "the model's measured groups are an earlier MODAK's: reading the runs")
        # (only what the runs recorded since bear on, where the card's groups are current)
        return fast.with_runs(load_frame(store),
                              since=str(fast.meta.get("fitted_at") or "") if current else None)
    from .fit import load, model_predictor  # a non-linear estimator
    return model_predictor(load(path, say=say), load_frame(ResultsStore()))
