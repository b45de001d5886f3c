"""The performance model: recovers a known truth, errors clearly, learns from every run."""
import json
import math
import multiprocessing
import sqlite3
import time

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, request

from modak_lib.perf import evaluate as ev, features as F, fit as m
from modak_lib.errors import InputError
from modak_lib.models import Allocator, Configuration, Precision
from modak_lib.perf.search import scatter_gain
from modak_lib.pipeline import make_plan
from modak_lib.results import COLUMNS, ResultsStore, StoreError, load_frame, open_csv

pytest.importorskip("sklearn")

COMPILER = {"off": 0.0, "torch.compile:default": 0.15}
ALLOC = {"glibc": 0.0, "tcmalloc": -0.25, "jemalloc": 0.3}
PREC = {"fp32": 0.0, "bf16": -0.4}
# fingerprints as the runtime measures them (the shipped dataset's values)
WORKLOADS = {
    "mnist-cnn": {"params": 1_199_882, "flops": 9_160_359_936.0, "batch": 128, "size": 28,
                  "fingerprint": "fp-18239cf90f51", "conv": 0.9, "linear": 0.1},
    "resnet18": {"params": 11_689_512, "flops": 13_966_245_968.0, "batch": 16, "size": 64,
                 "fingerprint": "fp-b0d4670b42d0", "conv": 0.99, "linear": 0.01},
}
# a target as its probe describes it; its bandwidth makes these workloads' traffic negligible
# (at most 0.4% of a step), so that the truths below, in time, are linear in the knobs
FIGURES = {"gflops_fp32": 100.0, "gflops_bf16": 400.0, "bandwidth_gbs": 300.0}
TARGET_FIGURES = {"peak_gflops": 100.0, "peak_gflops_bf16": 400.0,
                  "memory_bandwidth_gbs": 300.0}


def truth(workload, compiler, threads, allocator, precision):
    base = {"mnist-cnn": math.log(0.08), "resnet18": math.log(0.4)}[workload]
    return base + COMPILER[compiler] - 0.5 * math.log(threads) + ALLOC[allocator] + PREC[precision]


def synthetic(noise=0.0, seed=0, workloads=("mnist-cnn", "resnet18"), skip=()):
    rng = np.random.default_rng(seed)
    rows = []
    for w in workloads:
        for comp in COMPILER:
            for threads in (1, 2):
                for alloc in ALLOC:
                    for prec in PREC:
                        if (w, comp, threads, alloc, prec) in skip:
                            continue
                        for rep in range(2):
                            y = truth(w, comp, threads, alloc, prec) + rng.normal(0, noise)
                            rows.append(row(w, comp, threads, alloc, prec, math.exp(y), rep))
    return pd.DataFrame(rows)


def row(w, comp, threads, alloc, prec, s, rep=0, micro="zen4", cores=2):
    return {c: None for c in COLUMNS} | {
        "recorded_at": "2026-11-22T00:00:00+00:00", "source": "campaign", "run_id": "synthetic",
        "repeat": rep, "workload": w, "framework": "pytorch",
        "trainable_parameters": WORKLOADS[w]["params"], "status": "ok",
        "fingerprint": WORKLOADS[w]["fingerprint"], "flops_per_step": WORKLOADS[w]["flops"],
        "batch_size": WORKLOADS[w]["batch"], "image_size": WORKLOADS[w]["size"],
        "compiler": comp, "threads": threads, "allocator": alloc, "precision": prec,
        "channels_last": 0, "onednn": 1, "image": "host", "microarchitecture": micro,
        "cores": cores, "cpu_model": "test cpu", "s_per_step": s, "steps_per_s": 1 / s,
        "flops_conv": WORKLOADS[w].get("conv", 0.0), "flops_linear": WORKLOADS[w].get("linear", 0.0),
        "flops_attention": 0.0, "flops_recurrent": 0.0, "flops_norm": 0.0, **FIGURES,
        "raw": json.dumps({"host": {"cpu_features": ["avx512_bf16"]}})}


def test_a_run_that_failed_before_its_fingerprint_leaves_the_batch_size_whole():
    """A store where a run failed before its first step (no batch size: the column turns to
    floats) keeps the workload's batch size a whole number, as its measured groups have it:
    a plan matches a configuration's runs by their text, and "20000.0" missed "20000" (a
    user's graph network was predicted at 0.086 s a step, its four runs 0.34-0.36 s)."""
    ok = {**row("mnist-cnn", "off", 2, "glibc", "fp32", 0.5), "workload_key": "wk-user"}
    failed = {**ok, "status": "failed", "batch_size": None, "image_size": None,
              "fingerprint": None, "s_per_step": None, "steps_per_s": None,
              "recorded_at": "2026-11-21T00:00:00+00:00"}
    df = pd.DataFrame([failed, ok])
    assert df["batch_size"].dtype == float
    (w,) = m.workload_table(df)
    (g,) = m.measured_groups(m.training_frame(df))
    assert w["batch_size"] == WORKLOADS["mnist-cnn"]["batch"]
    assert str(w["batch_size"]) == str(g["batch_size"])
    assert str(w["image_size"]) == str(WORKLOADS["mnist-cnn"]["size"])


def test_recovers_a_known_linear_truth_on_held_out_configurations():
    df = m.training_frame(synthetic())
    pred = m.held_out_predictions(df, "linear-main")
    err = m.mape(np.exp(df["y"]), np.exp(pred))
    assert err < 0.02, err
    fitted = m.fit(synthetic(), estimators=("linear", "linear-main"))
    # an unseen point: its prediction is the truth
    frame = pd.DataFrame([row("mnist-cnn", "torch.compile:default", 2, "tcmalloc", "bf16", 1.0)])
    got = math.exp(fitted.predict_log(m.training_frame(frame))[0])
    want = math.exp(truth("mnist-cnn", "torch.compile:default", 2, "tcmalloc", "bf16"))
    assert abs(got / want - 1) < 0.05


def test_a_round_that_ran_slow_for_everyone_is_corrected_by_its_runs():
    """The machine slows down for a whole round (other tenants): every run of it, stock
    included, is 1.5x slower.  Corrected by the round's runs, both rounds give each
    configuration the same time; a run with no other run near it in time is left as is."""
    df = synthetic(workloads=("mnist-cnn",))
    late = df["repeat"] == 1
    df.loc[late, "recorded_at"] = "2026-11-22T01:00:00+00:00"
    df.loc[late, "s_per_step"] *= 1.5
    lone = df.iloc[[0]].assign(recorded_at="2026-11-23T00:00:00+00:00", compiler="x",
                               s_per_step=0.3)
    y = m.training_frame(pd.concat([df, lone], ignore_index=True))["y"]
    key = ["compiler", "threads", "allocator", "precision"]
    spread = y[:len(df)].groupby([df[k] for k in key]).agg(lambda v: v.max() - v.min())
    assert spread.max() < 1e-9 and len(spread) == len(df) // 2
    assert y.iloc[-1] == pytest.approx(math.log(0.3))
    # the level is the rounds' median: halfway (in log) between the two
    first = df[m.stock_mask(df) & ~late].index[0]
    assert y[first] == pytest.approx(math.log(df.loc[first, "s_per_step"]) + math.log(1.5) / 2)
    # one round only, or no times: nothing to correct with
    assert np.allclose(m.training_frame(df[~late])["y"], np.log(df[~late]["s_per_step"]))
    assert np.allclose(m.training_frame(df.drop(columns="recorded_at"))["y"],
                       np.log(df["s_per_step"]))


def test_one_disturbed_run_moves_neither_its_round_nor_the_other_configurations():
    """A spike: one stock run of the second round ran 10x slower (seen here on ResNet-50),
    the round's other runs did not.  The round is not corrected by that one run: every
    other configuration keeps its measured time in both rounds; a round that did run slow
    for all but the spiked run is still found by the others."""
    df = synthetic(workloads=("mnist-cnn",))
    late = df["repeat"] == 1
    df.loc[late, "recorded_at"] = "2026-11-22T01:00:00+00:00"
    spike = df[m.stock_mask(df) & late].index
    assert len(spike) == 1
    df.loc[spike, "s_per_step"] *= 10
    y = m.training_frame(df)["y"]
    rest = df.index.difference(spike)
    assert np.allclose(y[rest], np.log(df.loc[rest, "s_per_step"]))
    slow = df.copy()
    slow.loc[late & ~slow.index.isin(spike), "s_per_step"] *= 1.5
    y = m.training_frame(slow)["y"]
    key = ["compiler", "threads", "allocator", "precision"]
    others = slow.drop(index=spike)
    spread = y[others.index].groupby([others[k] for k in key]).agg(lambda v: v.max() - v.min())
    assert spread.max() < 1e-9


def test_a_machine_slower_than_its_probe_says_is_learned_from_its_other_workloads():
    """Two machines of one nominal target (the same CPU and cores), their probes 0.5%
    apart, one running every script 1.5x slower (two hosts of this project's kind ran the
    same scripts 1.3-2.3x apart): each machine's effect is half of that either side of their
    median (log).  ResNet-18, measured on the fast machine only, is predicted on the slow
    one at 1.5x its time there, by the model and by the planner's exported formula alike;
    a machine never measured is taken at the median machine.  One machine of a target, or
    two that share no run, have no effect."""
    from modak_lib.perf.predictor import FastPredictor
    fast = synthetic()
    slow = synthetic(workloads=("mnist-cnn",)).assign(gflops_fp32=100.5)
    slow["s_per_step"] *= 1.5
    df = pd.concat([fast, slow], ignore_index=True)
    effects = m.machine_effects(m.training_frame(df))
    assert effects == pytest.approx({F.machine(fast.iloc[0]): -math.log(1.5) / 2,
                                     F.machine(slow.iloc[0]): math.log(1.5) / 2})
    fitted = m.fit(df, estimators=("linear-main",))
    assert fitted.card.machine_effects == pytest.approx(effects, abs=1e-4)
    args = ("resnet18", "off", 2, "glibc", "fp32")
    on = {"fast": row(*args, 1.0), "slow": {**row(*args, 1.0), "gflops_fp32": 100.5},
          "new": {**row(*args, 1.0), "gflops_fp32": 100.2}}
    got = {k: math.exp(fitted.predict_log(m.training_frame(pd.DataFrame([r])))[0])
           for k, r in on.items()}
    want = math.exp(truth(*args))
    assert got["fast"] == pytest.approx(want, rel=0.05)
    assert got["slow"] == pytest.approx(1.5 * want, rel=0.05)
    assert got["new"] == pytest.approx(math.sqrt(1.5) * want, rel=0.05)
    planner = FastPredictor(fitted.meta)
    assert [math.exp(planner.formula(r)) for r in on.values()] == pytest.approx(
        list(got.values()), rel=1e-9)
    assert m.machine_effects(m.training_frame(fast)) == {}
    apart = slow.assign(workload="other", fingerprint="fp-other")
    assert m.machine_effects(m.training_frame(pd.concat([fast, apart]))) == {}


def test_a_host_held_out_is_predicted_as_a_new_machine_of_its_target():
    """Held out by host (its boot id: every target the campaign made of one machine), a
    host's runs are predicted by a fit on the other hosts' runs alone: of two hosts of one
    target, one running every script 1.5x slower, each is predicted at the other's times
    (a machine never measured is taken at its target's median machine), which
    ``benchmarks/held_out_host.py`` reports per host and framework.  Rows recorded without a
    boot id are one host."""
    from benchmarks.held_out_host import held_out_by_host, table
    fast = synthetic().assign(boot_id="boot-fast")
    slow = synthetic().assign(boot_id="boot-slow", gflops_fp32=100.5)
    slow["s_per_step"] *= 1.5
    df = pd.concat([fast, slow], ignore_index=True)
    frame = m.training_frame(df)
    assert sorted(m.groups_of(frame, "host").unique()) == ["boot-fast", "boot-slow"]
    cfg = held_out_by_host(df, "linear-main")
    ratio = (cfg["predicted"] / cfg["measured"]).groupby(cfg["host"]).median()
    assert ratio["boot-slow"] == pytest.approx(1 / 1.5, rel=0.05)
    assert ratio["boot-fast"] == pytest.approx(1.5, rel=0.05)
    rows = {r["host"]: r for r in table(cfg)}
    assert set(rows) == {"boot-fas", "boot-slo"}  # (the first 8 characters)
    assert rows["boot-slo"]["ratio"] == pytest.approx(1 / 1.5, rel=0.05)
    assert rows["boot-slo"]["mape"] == pytest.approx(1 - 1 / 1.5, abs=0.03)
    assert rows["boot-slo"]["configurations"] == cfg["configuration"].nunique() / 2
    older = df.assign(boot_id=[None] * len(fast) + ["boot-slow"] * len(slow))
    assert set(m.host_labels(older)) == {m.NO_HOST, "boot-slow"}
    assert set(m.host_labels(df.drop(columns="boot_id"))) == {m.NO_HOST}


def test_each_configuration_is_fitted_once_at_the_median_of_its_repeats():
    X = pd.DataFrame({"a": [1.0, 1.0, 1.0, 2.0]}, index=[10, 11, 12, 13])
    Xt, yt = m.per_configuration(X, np.array([1.0, 2.0, 100.0, 5.0]), ["p", "p", "p", "q"])
    assert Xt["a"].tolist() == [1.0, 2.0] and yt.tolist() == [2.0, 5.0]


def families(n=5, seed=1):
    """n workload families whose stock speed nothing in their features explains (a random
    efficiency each) while every knob changes each family's time beyond its baseline (the
    physics the model is told: arithmetic, traffic) by the same factor."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        level = rng.uniform(-1.0, 1.0)
        params, flops = 10 ** rng.uniform(5, 8), 10 ** rng.uniform(9, 11)
        for comp in COMPILER:
            for threads in (1, 2):
                for alloc in ALLOC:
                    for prec in PREC:
                        r = row("mnist-cnn", comp, threads, alloc, prec, 1.0) | {
                            "workload": f"family-{i}", "fingerprint": f"fp-{i}",
                            "trainable_parameters": params, "flops_per_step": flops}
                        y = (F.baseline(r) + level + COMPILER[comp] - 0.5 * math.log(threads)
                             + ALLOC[alloc] + PREC[prec])
                        rows.append(r | {"s_per_step": math.exp(y), "steps_per_s": math.exp(-y)})
    return pd.DataFrame(rows)


def test_a_family_held_out_gets_the_knob_ratios_the_other_families_measured():
    """The split estimator learns the stock level of a cell and each configuration's ratio
    to it apart: for a family held out of the fit, its level is a guess, but its ratios to
    stock are the ones every other family measured."""
    df = m.training_frame(families())
    stock = m.stock_mask(df).to_numpy()
    for name in ("gbr-split", "forest-split"):
        pred = m.held_out_predictions(df, name, "workload")
        for w in df["workload"].unique():
            own = (df["workload"] == w).to_numpy()
            got = pred[own] - pred[own & stock][0]
            want = df["y"].to_numpy()[own] - df["y"].to_numpy()[own & stock][0]
            assert np.abs(got - want).max() < 0.1, (name, w)
    # the stock version of a one-thread bf16 row is its cell's stock row
    X = F.frame(df)
    assert m.stock_rows(X).tolist() == stock.tolist()
    back = m.stock_version(X[~stock])
    assert m.stock_rows(back).all()
    assert np.allclose(back["log_threads"], math.log(2))
    # without two stock rows to learn levels from, it is the plain estimator
    plain = m.make_estimator("gbr-split").fit(X[~stock], df["y"][~stock])
    assert plain.level_ is None
    assert np.allclose(plain.predict(X), m.make_estimator("gbr").fit(
        X[~stock], df["y"][~stock]).predict(X))


def test_model_artefact_is_versioned(tmp_path):
    fitted = m.fit(synthetic(noise=0.01), estimators=("linear",))
    path = tmp_path / "model.joblib"
    fitted.save(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["features"] == F.CATEGORICAL + F.NUMERIC
    assert meta["feature_version"] == F.FEATURE_VERSION
    assert meta["versions"]["scikit-learn"] and len(meta["data_fingerprint"]) == 16
    assert "linear" in meta["held_out_mape"] and meta["families"] == ["mnist-cnn", "resnet18"]
    assert m.load(path).meta == meta
    import joblib
    blob = joblib.load(path)
    blob["meta"]["versions"]["scikit-learn"] = "0.1"
    joblib.dump(blob, path)
    with pytest.raises(m.ModelError, match="fitted with scikit-learn 0.1, this is"):
        m.load(path, refit=False)
    path.write_text("not a model")
    with pytest.raises(m.ModelError, match="not a MODAK model"):
        m.load(path)
    split = m.fit(families(n=3), estimators=("gbr-split",))  # saved and loaded alike
    split.save(path)
    frame = m.training_frame(families(n=1, seed=7))
    assert np.allclose(m.load(path).predict_log(frame), split.predict_log(frame))


def test_a_run_refits_a_quick_model_and_keeps_a_full_fit(tmp_path, monkeypatch):
    """After a recorded run the quick model is refitted on the shipped datasets and the
    store, but a model `modak model fit` chose of another estimator, or one fitted on more
    measurements (a campaign's data the store lacks), is kept: a deploy must not replace it
    by a model of less data."""
    # the first dataset only is shipped here: each comparison of the estimators on the
    # campaign's four thousand measurements would take a minute, and what is tested is
    # which model the refit keeps (a first fit on all of them: the test
    # test_a_first_fit_takes_the_shipped_comparison_which_is_the_one_it_would_compute)
    from modak_lib import results
    monkeypatch.setattr(results, "SHIPPED_DATASETS", (results.SHIPPED,))
    store = ResultsStore(tmp_path / "store.sqlite")
    store.append(synthetic(noise=0.01).to_dict("records"))
    path = tmp_path / "model.joblib"
    first = m.refit_after_run(store, path).model_id  # no model yet: fitted
    assert m.load(path).card.model_id == first
    assert m.load(path).card.estimator in m.QUICK_ESTIMATORS
    compared = m.load(path).card
    rows = compared.rows
    assert rows > len(m.usable(m.training_frame(load_frame(store, include_shipped=False))))
    store.append([row("mnist-cnn", "off", 2, "glibc", "fp32", 0.09, rep=5)])
    second = m.refit_after_run(store, path).model_id  # a quick model: refitted on the new run too
    assert second != first and m.load(path).card.model_id == second
    assert m.load(path).card.rows == rows + 1
    # one run more is not worth comparing the estimators again: the kept one is refitted
    # alone, its held-out figures carried over and said to be of the rows they were
    card = m.load(path).card
    assert card.held_out_rows == rows and card.estimator == compared.estimator
    assert (card.held_out_mape, card.sigma_log, card.sigma_log_unseen,
            card.sigma_log_unseen_by_framework) == (
        compared.held_out_mape, compared.sigma_log, compared.sigma_log_unseen,
        compared.sigma_log_unseen_by_framework)
    store.append([row("mnist-cnn", "off", 1, "glibc", "fp32", 0.2, rep=10 + i)
                  for i in range(int(rows * m.REFRESH_SHARE) + 1)])
    third = m.refit_after_run(store, path).model_id  # grown by more than REFRESH_SHARE: compared again
    card = m.load(path).card
    assert card.model_id == third and card.held_out_rows == card.rows > rows + 1
    full = m.fit(families(n=3), estimators=("forest-split",))
    full.save(path)
    said = m.refit_after_run(store, path)
    assert not said.refitted and said.model_id == full.card.model_id
    assert said.note.startswith(f"kept {full.card.model_id}: a full fit")
    assert m.load(path).card.model_id == full.card.model_id
    more = m.fit(pd.concat([load_frame(store), families(n=3)], ignore_index=True),
                 estimators=("linear",))  # a quick estimator, on more than the store has
    more.save(path)
    said = m.refit_after_run(store, path)
    assert not said.refitted and said.note.startswith(f"kept {more.card.model_id}: fitted on {card.rows + len(families(n=3))}")
    meta = json.loads(path.with_suffix(".json").read_text())  # unless this MODAK cannot use it
    meta["feature_version"] = -1
    path.with_suffix(".json").write_text(json.dumps(meta))
    assert m.refit_after_run(store, path) == m.Refit(third, True)


def test_a_kept_model_plans_with_the_runs_recorded_since_its_fit(tmp_path, monkeypatch):
    """A model the refit after a run keeps (a full fit, one of a campaign's data) is not
    refitted on the run: the planner reads the runs recorded since its fit from the store,
    a new workload's fingerprint and the knob the runtime refused to apply to it among them,
    and keeps what the card knows of the data the store lacks; with nothing newer it plans
    from the card alone."""
    from datetime import datetime, timezone

    from modak_lib.perf.predictor import load_predictor
    monkeypatch.setenv("MODAK_RESULTS", str(tmp_path / "store.sqlite"))
    path = tmp_path / "model.joblib"
    data = families(n=3)  # (a campaign's: neither the store nor the shipped datasets have it)
    m.fit(data, estimators=("extra-trees",)).save(path)
    said = []
    fast = load_predictor(str(path), say=said.append)
    assert not any("newer" in line for line in said)
    assert "user-x" not in {w["workload"] for w in fast.workloads}
    new = row("resnet18", "torch.compile:default", 2, "glibc", "fp32", 0.5) | {
        "workload": "user-x", "workload_key": "wk-user-x", "fingerprint": "fp-user-x",
        "source": "deploy", "run_id": "r-user", "not_applied": "compiler",
        "raw": json.dumps({"not_applied": {"compiler": "Dynamo cannot trace it"}}),
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    ResultsStore().append([new])
    said = []
    read = load_predictor(str(path), say=said.append)
    assert "the store has runs newer than the model: reading them" in said
    assert read.meta["model_id"] == fast.meta["model_id"]  # the same model, not refitted
    (entry,) = [w for w in read.workloads if w["workload"] == "user-x"]
    assert entry["fingerprint"] == "fp-user-x"
    assert [(r["knob"], r["reason"]) for r in entry["not_applied"]] == [
        ("compiler", "Dynamo cannot trace it")]
    assert [g["median"] for g in read.measured if g["workload"] == "user-x"] == [0.5]
    # what the card knows of the campaign's data stays: its workloads and their medians
    campaign = set(data["workload"])
    assert campaign <= {w["workload"] for w in read.workloads}
    assert [g for g in fast.measured if g["workload"] in campaign] == \
        [g for g in read.measured if g["workload"] in campaign]
    # the same formula answers
    probe = {**new, "workload": "mnist-cnn"}
    assert read.formula(probe) == fast.formula(probe)
    time.sleep(1.1)  # (times are to the second: one of the run's is read as newer)
    m.fit(data, estimators=("extra-trees",)).save(path)  # fitted after the run
    said = []
    load_predictor(str(path), say=said.append)
    assert not any("newer" in line for line in said)
    # a card of an earlier MODAK, its measured groups without their losses by steps: the
    # runs are read afresh (else a precision checked beside stock read as unchecked)
    side = path.with_suffix(".json")
    meta = json.loads(side.read_text())
    for g in meta["light"]["measured"]:
        del g["losses"]
    side.write_text(json.dumps(meta))
    said = []
    earlier = load_predictor(str(path), say=said.append)
    assert any("an earlier MODAK's: reading the runs" in line for line in said), said
    assert [g["losses"] for g in earlier.measured if g["workload"] == "user-x"] == [[]]


def test_the_runs_recorded_since_a_fit_are_read_with_what_they_bear_on_alone():
    """Reading the runs recorded since a model's fit (before each trial of a search: the
    whole frame took 3.5 s here) reads only the workloads and scripts they bear on: for
    those it gives what reading every run gives (a new candidate's ratio to an older stock
    run of its round, a workload's older refusal); every other group and workload is the
    card's as it stands."""
    from modak_lib.perf.predictor import FastPredictor

    def user(comp, alloc, s, at, rep, **more):
        return row("resnet18", comp, 2, alloc, "fp32", s, rep=rep) | {
            "workload": "user-y", "workload_key": "wk-user-y", "fingerprint": "fp-user-y",
            "source": "autotune", "recorded_at": at} | more

    before, after = "2026-11-22T10:00:00+00:00", "2026-11-22T10:00:05+00:00"
    refused = user("torch.compile:default", "glibc", 0.3, "2026-11-22T09:59:58+00:00", 1,
                   not_applied="compiler", raw=json.dumps(
                       {"not_applied": {"compiler": "Dynamo cannot trace it"}}))
    frame = pd.concat([families(n=3), pd.DataFrame([
        refused,
        user("off", "glibc", 0.40, "2026-11-22T09:59:59+00:00", 1),  # stock, before the fit
        user("off", "tcmalloc", 0.36, after, 1),  # its round's candidate, after it
        user("off", "glibc", 0.42, after, 2)])], ignore_index=True)
    card = FastPredictor({"fitted_at": before, "light": {"formula": {"kind": "linear",
                                                                     "terms": []}}},
                         formula=lambda r: 0.0,
                         measured=[{"workload": "card-only", "median": 9.0}],
                         workloads=[{"workload": "card-only", "workload_key": "wk-card"}])
    whole, since = card.with_runs(frame), card.with_runs(frame, since=before)

    def of(p, name):
        return (sorted((json.dumps(g, sort_keys=True) for g in p.measured
                        if g["workload"] == name)),
                [w for w in p.workloads if w["workload"] == name])

    assert of(since, "user-y") == of(whole, "user-y") and of(since, "user-y")[0]
    (mine,) = of(since, "user-y")[1]
    assert [r["knob"] for r in mine["not_applied"]] == ["compiler"]  # recorded before the fit
    (tc,) = [g for g in since.measured if g["workload"] == "user-y"
             and g["allocator"] == "tcmalloc"]
    assert tc["vs_stock"] == pytest.approx(math.log(0.36 / 0.40))  # beside the older stock
    # the runs that none recorded since bears on are the card's, not read again
    assert of(since, "card-only") == (['{"median": 9.0, "workload": "card-only"}'],
                                      [{"workload": "card-only", "workload_key": "wk-card"}])
    assert not any(g["workload"].startswith("family-") for g in since.measured)
    assert any(g["workload"].startswith("family-") for g in whole.measured)
    # nothing recorded since: nothing read
    quiet = card.with_runs(frame, since="2026-11-23T00:00:00+00:00")
    assert quiet.measured == card.measured and quiet.workloads == card.workloads
    # (a time without its zone is UTC, as a card's)
    assert of(card.with_runs(frame, since=before[:-6]), "user-y") == of(since, "user-y")


def test_too_little_data_is_an_error():
    with pytest.raises(m.ModelError, match="too little data"):
        m.fit(synthetic().head(4))


def test_corrupt_and_empty_stores(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a MODAK results store"):
        ResultsStore(bad).rows()
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE x (a)").connection.commit()
    with pytest.raises(StoreError, match="no 'measurements' table"):
        ResultsStore(other).count()
    with pytest.raises(StoreError, match="no results store here yet"):
        ResultsStore(tmp_path / "none.sqlite").rows()
    with pytest.raises(StoreError, match="store is empty and no dataset"):
        load_frame(ResultsStore(tmp_path / "none.sqlite"), include_shipped=False)
    with pytest.raises(StoreError, match="result field 'workload' is required"):
        ResultsStore(tmp_path / "new.sqlite").append([{"recorded_at": "x", "source": "x"}])


def _append_many(args):
    path, worker = args
    store = ResultsStore(path)
    for i in range(25):
        store.append([row("mnist-cnn", "off", 2, "glibc", "fp32", 0.1 + worker / 1000 + i / 1e6,
                          rep=i)])
    return 25


def test_concurrent_appends_lose_no_row(tmp_path):
    path = tmp_path / "store.sqlite"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert sum(pool.map(_append_many, [(path, w) for w in range(4)])) == 100
    rows = ResultsStore(path).rows()
    assert len(rows) == 100 and len({(r["s_per_step"]) for r in rows}) == 100


# ---------------------------------------------------------------------------
# the planner with the model
def predictor_for(df):
    fitted = m.fit(df, estimators=("linear",))
    return m.model_predictor(fitted, df)


def mnist_request(**target):
    return request(application={"model": "mnist-cnn", "batch_size": 128},
                   optimisation={"compilers": ["torch.compile"], "allow_reduced_precision": True},
                   target={"microarchitecture": "zen4", "cores_per_node": 2,
                           "cpu_features": ["avx512_bf16"], **TARGET_FIGURES, **target})


def test_never_chooses_a_configuration_measured_slower_than_stock():
    # measured: the compiler and jemalloc hurt, bf16 and tcmalloc help
    result = make_plan(mnist_request(), predictor=predictor_for(synthetic()), run_id="t")
    plan = result.plan
    assert plan.decided_by == "model"
    measured = synthetic().groupby(["compiler", "threads", "allocator", "precision"])[
        "s_per_step"].median()
    stock = measured[("off", 2, "glibc", "fp32")]
    c = plan.chosen
    chosen = measured[(c.compiler and "torch.compile:default" or "off", c.threads,
                       c.allocator.value, c.precision.value)]
    assert chosen <= stock
    assert c.compiler is None and c.allocator == Allocator.tcmalloc \
        and c.precision == Precision.bf16 and c.threads == 2
    assert plan.candidates[0].prediction.source.startswith("measured median")
    # the user asked for torch.compile, but it was measured slower: it lost, and says why
    compiled = [x for x in plan.candidates if x.configuration.compiler]
    assert compiled and all("predicted" in x.reason for x in compiled)


def test_a_workload_never_run_falls_back_to_the_prior():
    df = synthetic(workloads=("resnet18",))
    result = make_plan(mnist_request(), predictor=predictor_for(df), run_id="t")
    assert result.plan.decided_by == "prior"
    assert any(n.startswith("no measurement of workload 'mnist-cnn' yet")
               for n in result.plan.notes), result.plan.notes


def test_a_target_never_measured_is_predicted_from_its_figures(monkeypatch, tmp_path):
    """The model speaks for a known workload on a target it never measured, from the
    target's figures, with the wider interval of held-out families - unless that error is
    too wide to decide with; without figures it says what it lacks and the prior decides."""
    from modak_lib.perf import predictor as P
    # never probed either: not the session's probes, where a deploy test on a host of the
    # same microarchitecture and cores (a zen3 host) left its figures
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))
    predictor = predictor_for(synthetic(noise=0.02))
    unseen = predictor.meta["sigma_log_unseen"]  # (two families: one held out is far off)
    gated = make_plan(mnist_request(microarchitecture="skylake_avx512", cores_per_node=4),
                      predictor=predictor, run_id="t").plan
    assert unseen > P.MAX_UNSEEN_SIGMA and gated.decided_by == "prior"
    assert any("too wide to decide here; trials settle it" in n for n in gated.notes)
    monkeypatch.setattr(P, "MAX_UNSEEN_SIGMA", unseen + 1)  # a model that transfers
    other = make_plan(mnist_request(microarchitecture="skylake_avx512", cores_per_node=4),
                      predictor=predictor, run_id="t").plan
    assert other.decided_by == "model"
    assert any("was not measured on skylake_avx512 with 4 cores" in n for n in other.notes)
    assert all(c.prediction and not c.prediction.measured for c in other.candidates)
    here = make_plan(mnist_request(), predictor=predictor, run_id="t").plan
    assert here.candidates[0].prediction.measured
    # (the unseen target's interval is the held-out families' error, wider than LOCO's)
    card = predictor.meta
    p = other.candidates[0].prediction
    assert p.high / p.low == pytest.approx(math.exp(2 * 1.645 * card["sigma_log_unseen"]))
    blank = make_plan(mnist_request(microarchitecture="zen3", peak_gflops=None,
                                    peak_gflops_bf16=None, memory_bandwidth_gbs=None),
                      predictor=predictor, run_id="t").plan
    assert blank.decided_by == "prior"
    assert any("measured GFLOP/s and bandwidth (run `modak probe`)" in n for n in blank.notes)


def test_a_new_workloads_interval_is_its_own_frameworks_held_out_error(monkeypatch, tmp_path):
    """The card keeps the held-out families' error of each framework with two or more of
    them (``fit.framework_sigmas``); a workload never measured on the target gets its own
    framework's: a PyTorch script an interval of the PyTorch families' error, and where
    its framework's families were held out too far off (more than MAX_UNSEEN_SIGMA), no
    decision by the model: the trials settle it."""
    from modak_lib.perf import predictor as P
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))
    usable = m.usable(m.training_frame(synthetic(noise=0.02)))
    residual = usable["y"].to_numpy() - m.held_out_predictions(usable, "linear", "workload")
    rms = float(np.sqrt(np.mean(residual ** 2)))
    assert m.framework_sigmas(usable, residual) == {"pytorch": pytest.approx(rms, abs=1e-4)}
    usable.loc[usable["workload"] == "resnet18", "framework"] = "keras"
    assert m.framework_sigmas(usable, residual) == {}  # (one family each: nothing to tell)
    predictor = predictor_for(synthetic(noise=0.02))
    elsewhere = {"microarchitecture": "skylake_avx512", "cores_per_node": 4}
    narrow = 0.2
    predictor.meta["sigma_log_unseen_by_framework"] = {"pytorch": narrow, "keras": 0.9}
    assert predictor.meta["sigma_log_unseen"] > P.MAX_UNSEEN_SIGMA  # (the pooled error)
    plan = make_plan(mnist_request(**elsewhere), predictor=predictor, run_id="t").plan
    assert plan.decided_by == "model"
    assert any("held-out pytorch workload families' error" in n for n in plan.notes), plan.notes
    p = plan.candidates[0].prediction
    assert p.high / p.low == pytest.approx(math.exp(2 * 1.645 * narrow))
    predictor.meta["sigma_log_unseen_by_framework"] = {"pytorch": 0.9}
    gated = make_plan(mnist_request(**elsewhere), predictor=predictor, run_id="t").plan
    assert gated.decided_by == "prior"
    assert any("its error on held-out pytorch workload families is x2.46" in n
               for n in gated.notes), gated.notes
    # as shipped: both frameworks have two or more families, and a new PyTorch workload is
    # predicted within a narrower interval than a new Keras one (five families, fingerprinted
    # from their layers' shapes; held out 0.45 in log time, 0.85 before the elements and
    # the recurrent time steps were counted for Keras)
    shipped = json.loads((ROOT / "modak_lib/data/quick-comparison.json").read_text())
    by_framework = shipped["sigma_log_unseen_by_framework"]
    assert by_framework["keras"] > by_framework["pytorch"]
    assert by_framework["pytorch"] < P.MAX_UNSEEN_SIGMA


def test_unmeasured_configurations_get_model_predictions_with_intervals():
    skip = {("mnist-cnn", "off", 2, "tcmalloc", "bf16")}
    df = synthetic(noise=0.02, skip=skip)
    plan = make_plan(mnist_request(), predictor=predictor_for(df), run_id="t").plan
    cand = next(c for c in plan.candidates if c.configuration == Configuration(
        image="pytorch-2.13.0-cpu", compiler=None, threads=2, allocator="tcmalloc",
        precision="bf16"))
    p = cand.prediction
    assert p.source.startswith("model linear-")
    want = math.exp(truth("mnist-cnn", "off", 2, "tcmalloc", "bf16"))
    assert p.low < want < p.high and abs(p.seconds / want - 1) < 0.15


def test_closed_loop_a_run_moves_the_next_prediction(tmp_path):
    """Plan, run for real, record, refit, plan again: the prediction moves to the measurement."""
    import subprocess
    import sys

    from modak_lib.results import parse_fom_lines, row_from_fom
    # the truth of this machine is unknown to the synthetic data: bias it by 3x
    df = synthetic(noise=0.01)
    df["microarchitecture"] = "x86_64_v4"
    df["s_per_step"] *= 3
    store = ResultsStore(tmp_path / "store.sqlite")
    store.append(df.to_dict("records"))
    req = mnist_request(microarchitecture="x86_64_v4")
    first = make_plan(req, predictor=predictor_for(load_frame(store, include_shipped=False)),
                      run_id="a").plan
    cfg = first.chosen
    predicted = first.candidates[0].prediction.seconds
    env = {"MODAK_THREADS": str(cfg.threads), "MODAK_PRECISION": cfg.precision.value,
           "MODAK_WORKLOAD": "mnist-cnn", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "modak_runtime", "--",
                           str(ROOT / "workloads/train.py"), "--steps", "10"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    (rec,) = parse_fom_lines(proc.stdout)
    # the runtime measured the same workload the dataset knows (its fingerprint)
    assert rec["fingerprint"]["id"] == WORKLOADS["mnist-cnn"]["fingerprint"]
    rec["config"]["allocator"] = cfg.allocator.value  # the store keys the run by the plan
    measured_row = row_from_fom(rec, source="deploy", run_id="a", probe=FIGURES)
    measured_row["microarchitecture"], measured_row["cores"] = "x86_64_v4", 2
    measured_row["batch_size"] = 128
    for _ in range(3):
        store.append([measured_row])
    second = make_plan(req, predictor=predictor_for(load_frame(store, include_shipped=False)),
                       run_id="b").plan
    again = next(c for c in second.candidates if c.configuration == cfg).prediction.seconds
    measured = measured_row["s_per_step"]
    assert abs(again - measured) < abs(predicted - measured)


def test_the_exported_formula_agrees_with_scikit_learn(tmp_path):
    """The planner's fast path (no scikit-learn) predicts what the fitted pipeline does:
    the linear models' formulas, the gradient-boosted trees' (the split model's two
    parts, its stock level asked with the row under the stock configuration), and the
    extra trees' mean."""
    from modak_lib.perf.predictor import FastPredictor, formula_of
    for estimators in (("linear",), ("linear-main",), ("linear-pairs",), ("gbr",),
                       ("gbr-split",), ("extra-trees",)):
        fitted = m.fit(synthetic(noise=0.05, seed=3), estimators=estimators)
        assert fitted.name == estimators[0]
        spec = fitted.meta["light"]["formula"]
        assert len(spec.get("parts", [])) == {"gbr": 1, "gbr-split": 2,
                                              "extra-trees": 1}.get(fitted.name, 0)
        formula = formula_of(spec)
        frame = m.training_frame(synthetic(seed=4))
        # and a workload unlike any measured (1000x the parameters, 1/1000 the FLOPs): the
        # learned part is held to the measured efficiencies, on both paths alike
        far = frame.iloc[[0]].assign(trainable_parameters=1e9, flops_per_step=1e7)
        frame = pd.concat([frame, far], ignore_index=True)
        expected = fitted.predict_log(frame)
        got = [formula(r) for r in frame.to_dict("records")]
        assert np.allclose(got, expected, atol=1e-9)
        low, high = fitted.card.residual_range
        learned = got[-1] - F.baseline(frame.iloc[-1].to_dict())
        assert low - 1e-9 <= learned <= high + 1e-9 and high - low < 5
    path = tmp_path / "model.joblib"
    fitted.save(path)
    fast = FastPredictor.load(path)
    slow = m.model_predictor(fitted, synthetic(noise=0.05, seed=3))
    req = mnist_request()
    plan_fast = make_plan(req, predictor=fast, run_id="t").plan
    plan_slow = make_plan(req, predictor=slow, run_id="t").plan
    assert plan_fast.chosen == plan_slow.chosen
    for a, b in zip(plan_fast.candidates, plan_slow.candidates):
        assert a.configuration == b.configuration
        assert a.prediction.seconds == pytest.approx(b.prediction.seconds, rel=1e-9)


def _older_model(tmp_path, monkeypatch):
    """A model file saved by an older MODAK (other features), the default model of this
    test's environment (its store empty): its path and its card's."""
    path = tmp_path / "model.joblib"
    monkeypatch.setenv("MODAK_MODEL", str(path))
    monkeypatch.setenv("MODAK_RESULTS", str(tmp_path / "store.sqlite"))
    m.fit(synthetic(noise=0.01), estimators=("linear",)).save(path)
    side = path.with_suffix(".json")
    meta = json.loads(side.read_text())
    meta["versions"]["modak"] = "0.0.1"
    side.write_text(json.dumps(meta))
    return path, side


def test_a_model_saved_by_another_modak_is_refitted_when_auto(tmp_path, monkeypatch):
    from modak_lib import __version__
    from modak_lib.perf.predictor import load_predictor
    from modak_lib.errors import ModakError
    path, side = _older_model(tmp_path, monkeypatch)
    with pytest.raises(ModakError, match="refit"):  # a file named explicitly: say so
        load_predictor(str(path))
    said, noticed = [], []  # the default: refitted from the shipped dataset, and said
    predictor = load_predictor("auto", say=said.append, notice=noticed.append)
    assert predictor is not None and predictor.meta["versions"]["modak"] == __version__
    assert json.loads(side.read_text())["versions"]["modak"] == __version__
    assert len(noticed) == 1 and "refitting it now" in noticed[0] and noticed[0] not in said
    path.unlink()  # no model at all: fitted, and said so where a person waits for it
    noticed.clear()
    assert load_predictor("auto", say=said.append, notice=noticed.append) is not None
    assert noticed == [f"no model at {path} yet: fitting one on the measured datasets (once; "
                       "seconds)"]


def test_a_refitted_model_too_large_to_export_still_plans(tmp_path, monkeypatch):
    """A refit whose trees have more nodes than the planner's export takes
    (``fit.EXPORT_MAX_NODES``) leaves the card without a formula: the planner then predicts
    with the scikit-learn model, after a refit of an older model's file too (it raised the
    predictor's error there, and no plan could be made)."""
    from modak_lib.perf.predictor import load_predictor
    _path, side = _older_model(tmp_path, monkeypatch)
    monkeypatch.setattr(m, "EXPORT_MAX_NODES", 10)  # no tree ensemble exports
    predictor = load_predictor("auto")
    assert "formula" not in json.loads(side.read_text())["light"]
    plan = make_plan(mnist_request(), predictor=predictor, run_id="t").plan
    assert plan.decided_by == "model" and plan.candidates[0].prediction is not None


def test_the_kept_extra_trees_export_on_the_shipped_data():
    """Extra trees grow at most ``fit.EXTRA_TREES_LEAVES`` leaves a tree, so that the
    ensemble fits the planner's export whatever the data: fully grown on the shipped 3820
    measurements they had 155,924 nodes, over the 150,000 the export takes, and the planner
    lost its fast formula with every refit after a run."""
    from sklearn.ensemble import ExtraTreesRegressor
    df = m.usable(m.training_frame(load_frame()))
    X, y = F.frame(df), df["y"].to_numpy() - F.baselines(df)
    Xt, yt = m.per_configuration(X, y, m.config_groups(df))
    est = m.make_estimator("extra-trees").fit(Xt, yt)
    reg = est.named_steps["reg"]
    assert isinstance(reg, ExtraTreesRegressor) and len(Xt) > m.EXTRA_TREES_LEAVES
    nodes = sum(t.tree_.node_count for t in reg.estimators_)
    assert nodes <= m.EXPORT_MAX_NODES
    assert max(t.get_n_leaves() for t in reg.estimators_) == m.EXTRA_TREES_LEAVES
    assert m.export_trees(est) is not None


def test_a_workloads_own_measured_knob_effects_beat_the_models_general_ones():
    """bf16 helps the CNNs of the dataset; on a small transformer it was measured slower.
    The unmeasured bf16 + tcmalloc must be predicted from that workload's own effects
    (stock x bf16 ratio x tcmalloc ratio), so the plan keeps tcmalloc alone."""
    WORKLOADS["tiny"] = {"params": 107_547, "flops": 7.2e8, "batch": 16, "size": None,
                         "fingerprint": "fp-tiny", "linear": 0.7}
    try:
        df = synthetic(noise=0.01)
        df["microarchitecture"] = "zen4"
        tiny = [row("tiny", "off", 2, "glibc", "fp32", 0.020),
                row("tiny", "off", 2, "glibc", "bf16", 0.030),     # bf16 hurts here
                row("tiny", "off", 2, "tcmalloc", "fp32", 0.018)]
        df = pd.concat([df, pd.DataFrame(tiny)], ignore_index=True)
        req = mnist_request()
        req = req.model_copy(update={"application": req.application.model_copy(
            update={"model": "tiny", "batch_size": 16})})
        plan = make_plan(req, predictor=predictor_for(df), run_id="t").plan
    finally:
        del WORKLOADS["tiny"]
    assert plan.decided_by == "model"
    assert (plan.chosen.allocator, plan.chosen.precision, plan.chosen.compiler) == \
        (Allocator.tcmalloc, Precision.fp32, None)
    both = next(c.prediction for c in plan.candidates
                if c.configuration.allocator == Allocator.tcmalloc
                and c.configuration.precision == Precision.bf16
                and c.configuration.threads == 2 and c.configuration.compiler is None)
    # (the seed's model also has a bf16 x tcmalloc interaction, learned on the other workloads)
    assert both.seconds == pytest.approx(0.020 * (0.030 / 0.020) * (0.018 / 0.020), rel=0.05)
    assert both.seconds > 0.018
    assert "corrected by this workload's measured stock, allocator=tcmalloc, precision=bf16" \
        in both.source


def test_a_run_without_a_batch_size_or_fingerprint_does_not_break_the_fit():
    """A plain TensorFlow loop's run: timed, but with no model for the runtime to
    fingerprint, so no batch size either.  The measured medians leave it out (a plan looks
    its batch size up), the fit leaves it out (no features), and the refit goes on; before,
    its missing batch size raised from pandas and failed the record's refit."""
    base = synthetic(noise=0.01, workloads=("resnet18",))
    plain = {c: None for c in COLUMNS} | {
        "recorded_at": "2026-11-22T00:00:00+00:00", "source": "deploy", "run_id": "rplain",
        "workload": "train.py", "framework": "tensorflow", "status": "ok",
        "compiler": "off", "threads": 2, "allocator": "glibc", "precision": "fp32",
        "channels_last": 0, "onednn": 1, "image": "host", "microarchitecture": "zen4",
        "cores": 2, "s_per_step": 0.0007, "steps_per_s": 1 / 0.0007}
    df = pd.concat([base, pd.DataFrame([plain])], ignore_index=True)
    groups = m.measured_groups(m.training_frame(df))
    assert groups and not [g for g in groups if g["workload"] == "train.py"]
    assert all(isinstance(g["batch_size"], int) for g in groups)
    model = m.fit(df, estimators=("linear",))
    assert model.card.rows == len(base)


def test_a_later_plan_compares_the_searchs_trials_round_by_round_as_the_search_did():
    """Seen from an installed MODAK: the search ran stock and jemalloc side by side in three
    rounds seconds apart; jemalloc won the first and lost the next two, so the search kept
    stock, and the job ran stock.  Pooled, stock's runs (0.111, 0.125, 0.099 and the job's
    0.107: median 0.109) against jemalloc's (0.082, 0.149, 0.104: 0.104) made jemalloc 5%
    faster, and the next plan chose it.  Each run is taken in its search round, as the
    search took it: jemalloc is 5% slower (its median ratio to stock over the rounds)."""
    base = synthetic(noise=0.01, workloads=("resnet18",))
    runs = [(1, "glibc", 0.111), (1, "jemalloc", 0.082), (1, "tcmalloc", 0.130),
            (2, "glibc", 0.125), (2, "jemalloc", 0.149),
            (3, "glibc", 0.099), (3, "jemalloc", 0.104)]
    at = "2026-11-22T00:{:02d}:{:02d}+00:00"  # (10 s apart)
    trials = [row("mnist-cnn", "off", 2, alloc, "fp32", s, rep=n) | {
        "source": "autotune", "recorded_at": at.format(i // 6, 10 * i % 60)}
        for i, (n, alloc, s) in enumerate(runs)]
    job = row("mnist-cnn", "off", 2, "glibc", "fp32", 0.107) | {
        "source": "deploy", "repeat": None, "recorded_at": "2026-11-22T00:02:00+00:00"}
    df = pd.concat([base, pd.DataFrame(trials + [job])], ignore_index=True)
    # each search round is a round of its own, though all ran within a few minutes
    y = m.training_frame(df)["y"].to_numpy()[len(base):]
    measured = np.log([s for _, _, s in runs] + [0.107])
    assert not np.allclose(y[:7], measured[:7]) and y[7] == pytest.approx(measured[7])
    # and jemalloc beside stock: its median ratio over the three rounds, as the search saw it
    jem = next(g for g in m.measured_groups(m.training_frame(df))
               if g["workload"] == "mnist-cnn" and g["allocator"] == "jemalloc")
    assert jem["rounds"] == 3 and jem["vs_stock"] == pytest.approx(math.log(0.104 / 0.099))
    req = mnist_request()
    req = req.model_copy(update={"optimisation": req.optimisation.model_copy(
        update={"compilers": [], "allow_reduced_precision": False})})
    plan = make_plan(req, predictor=predictor_for(df), run_id="t").plan
    pred = {c.configuration.allocator: c.prediction for c in plan.candidates
            if c.configuration.threads == 2 and c.prediction and c.prediction.measured}
    assert pred[Allocator.jemalloc].seconds > pred[Allocator.glibc].seconds * 0.99, pred
    assert plan.chosen.allocator == Allocator.glibc and plan.chosen.threads == 2, \
        plan.chosen.label()
    # the same runs without their search rounds (a campaign's, minutes apart): one round,
    # nothing to correct with
    far = df.copy()
    late = far.index >= len(base)
    far.loc[late, "source"] = "campaign"
    assert np.allclose(m.training_frame(far)["y"].to_numpy()[late], measured)


def test_a_later_plan_asks_a_searchs_gain_to_clear_the_trials_scatter_as_the_search_did():
    """A search's one round: jemalloc 7% faster than stock, within what a round scatters by
    (search.scatter_gain(1) from search.TRIAL_SCATTER, about 9%), so the search kept
    stock; the next plan, reading the same trials, keeps stock too, and says why.  The same
    7% in three rounds is more than their scatter (scatter_gain(3), about 5%): the plan
    takes it."""
    assert scatter_gain(3) < 0.07 < scatter_gain(1)  # (what the case is built on)
    base = synthetic(noise=0.01, workloads=("resnet18",))
    at = "2026-11-22T00:{:02d}:{:02d}+00:00"  # (10 s apart)

    def plan_after(rounds):
        runs = [(n, alloc, s) for n in range(1, rounds + 1)
                for alloc, s in (("glibc", 0.100), ("jemalloc", 0.093))]
        runs.insert(2, (1, "tcmalloc", 0.130))  # (dropped after round 1)
        trials = [row("mnist-cnn", "off", 2, alloc, "fp32", s, rep=n) | {
            "source": "autotune", "recorded_at": at.format(i // 6, 10 * i % 60)}
            for i, (n, alloc, s) in enumerate(runs)]
        df = pd.concat([base, pd.DataFrame(trials)], ignore_index=True)
        req = mnist_request()
        req = req.model_copy(update={"optimisation": req.optimisation.model_copy(
            update={"compilers": [], "allow_reduced_precision": False})})
        return make_plan(req, predictor=predictor_for(df), run_id="t").plan

    one = plan_after(1)
    jem = next(c.prediction for c in one.candidates
               if c.configuration.allocator == Allocator.jemalloc
               and c.configuration.threads == 2)
    assert jem.measured and jem.rounds == 1 and jem.seconds < 0.095
    assert one.chosen.allocator == Allocator.glibc and one.chosen.threads == 2
    need = f"less than the {100 * scatter_gain(1):.3g}% a gain must clear over the 1 round(s)"
    assert any(need in n
               for n in one.notes), one.notes
    three = plan_after(3)
    assert three.chosen.allocator == Allocator.jemalloc, three.notes


def test_a_precision_the_search_checked_beside_stock_stays_checked_after_its_job():
    """Seen from an installed MODAK (a user's residual MLP): the search ran stock and bf16
    side by side after 10 steps, then after 20, their losses alike, and chose bf16; its
    job ran 4680 steps, stock's job before the search 936 (and a trial of 10 before it).  Pooled, stock's runs had a
    median of 15 steps and bf16's of 20, and the next plan read bf16 as unchecked ("no
    run of its bf16 beside stock's shows that it keeps the loss"), chose fp32 and asked
    for trials again.  Each run's losses compare with stock's after as many steps: bf16
    stays checked and is chosen; where its loss after 20 steps was twice stock's, it is
    not offered at all; and runs of it after as many steps as no run of stock's check
    nothing."""
    base = synthetic(noise=0.01, workloads=("resnet18",))
    at = "2026-11-22T00:{:02d}:{:02d}+00:00"  # (10 s apart)

    def plan_with(bf16_end_at_20=0.1654, drop=()):
        # (round, precision, steps, s/step, end loss); stock's first loss 0.667
        runs = [(1, "fp32", 10, 0.080, 0.1981), (1, "bf16", 10, 0.045, 0.1976),
                (2, "fp32", 20, 0.081, 0.1655), (2, "bf16", 20, 0.046, bf16_end_at_20)]
        rows = [row("mnist-cnn", "off", 2, "glibc", prec, s, rep=n) | {
            "source": "autotune", "recorded_at": at.format(0, 10 * i), "steps": steps,
            "end_loss": end, "final_loss": end, "start_loss": 0.667}
            for i, (n, prec, steps, s, end) in enumerate(runs) if (n, prec) not in drop]
        jobs = [row("mnist-cnn", "off", 2, "glibc", prec, s) | {
            "source": "deploy", "repeat": None, "recorded_at": when, "steps": steps,
            "end_loss": end, "final_loss": end, "start_loss": 0.42}
            for prec, s, steps, end, when in (
                ("fp32", 0.083, 936, 0.0052, "2026-11-21T23:50:00+00:00"),
                ("bf16", 0.049, 4680, 0.0016, "2026-11-22T00:10:00+00:00"))]
        # (the first deploy's search: stock's one trial, the job too short for more)
        first = row("mnist-cnn", "off", 2, "glibc", "fp32", 0.072, rep=1) | {
            "source": "autotune", "recorded_at": "2026-11-21T23:48:00+00:00", "steps": 10,
            "end_loss": 0.1985, "final_loss": 0.1985, "start_loss": 0.667}
        df = pd.concat([base, pd.DataFrame([first] + rows + jobs)], ignore_index=True)
        req = mnist_request()
        req = req.model_copy(update={"optimisation": req.optimisation.model_copy(
            update={"compilers": []})})
        return make_plan(req, predictor=predictor_for(df), run_id="t").plan

    def bf16(plan):
        return next(c for c in plan.candidates if c.configuration.threads == 2
                    and c.configuration.allocator == Allocator.glibc
                    and c.configuration.precision == Precision.bf16)

    plan = plan_with()
    assert plan.chosen == bf16(plan).configuration, plan.notes
    losses = {x.steps: x.end_loss for x in bf16(plan).prediction.losses}
    assert losses == {10: 0.1976, 20: 0.1654, 4680: 0.0016}
    # its loss after 20 steps twice stock's: it changes the result, whatever it did at 10
    plan = plan_with(bf16_end_at_20=0.331)
    assert plan.chosen.precision == Precision.fp32
    assert any(n.startswith("not offered:") and "prec=bf16" in n and "of 20 steps" in n
               and "changes the result" in n for n in plan.notes), plan.notes
    # bf16 after 20 steps and stock after 10: nothing compares
    plan = plan_with(drop={(1, "bf16"), (2, "fp32")})
    assert plan.chosen.precision == Precision.fp32, plan.chosen.label()
    assert "no run of its bf16 beside stock's" in bf16(plan).reason


def test_a_trial_its_cap_stopped_after_fewer_steps_stays_checked_in_the_next_plan():
    """The search compares a candidate its time cap stopped after 6 of its round's 10 steps
    with stock's losses after 6, read from those stock's trial sampled; the next plan finds
    that pair too (stock's trial after 6 of its steps, from its record's losses), so a
    bf16 the search checked and chose stays checked, where before no run of stock's had 6
    steps and bf16 read as unchecked.  One that trained worse after 6 steps is not offered;
    a job's run (not seeded) answers only for its own steps."""
    base = synthetic(noise=0.01, workloads=("resnet18",))
    sampled = [[n, 0.667 - 0.04 * n] for n in range(1, 11)]  # stock's trial, 10 steps

    def plan_with(bf16_shift=0.0, source="autotune"):
        def raw(losses):
            return json.dumps({"host": {"cpu_features": ["avx512_bf16"]},
                               "metrics": {"losses": losses}})
        stock = row("mnist-cnn", "off", 2, "glibc", "fp32", 0.080, rep=1) | {
            "source": source, "recorded_at": "2026-11-22T00:00:00+00:00", "steps": 10,
            "end_loss": 0.387, "final_loss": 0.267, "start_loss": 0.627,
            "raw": raw(sampled)}
        mine = [[n, v + bf16_shift] for n, v in sampled[:6]]
        bf16 = row("mnist-cnn", "off", 2, "glibc", "bf16", 0.045, rep=1) | {
            "source": "autotune", "recorded_at": "2026-11-22T00:00:10+00:00", "steps": 6,
            "end_loss": sum(v for n, v in mine if n > 3) / 3, "final_loss": mine[-1][1],
            "start_loss": mine[0][1], "raw": raw(mine)}
        df = pd.concat([base, pd.DataFrame([stock, bf16])], ignore_index=True)
        req = mnist_request()
        req = req.model_copy(update={"optimisation": req.optimisation.model_copy(
            update={"compilers": []})})
        return make_plan(req, predictor=predictor_for(df), run_id="t").plan

    plan = plan_with()
    assert plan.chosen.precision == Precision.bf16, (plan.chosen.label(), plan.notes)
    # worse than stock's after as many steps: not offered
    plan = plan_with(bf16_shift=0.2)
    assert plan.chosen.precision == Precision.fp32
    assert any(n.startswith("not offered:") and "prec=bf16" in n and "of 6 steps" in n
               and "changes the result" in n for n in plan.notes), plan.notes
    # stock's 10 steps a job's (not seeded alike): nothing compares after 6
    plan = plan_with(source="deploy")
    assert plan.chosen.precision == Precision.fp32


def compiled_only_elsewhere():
    """MNIST-CNN never compiled; ResNet-18 compiled: 2x faster per step after 60 s."""
    df = synthetic(noise=0.01, skip={("mnist-cnn", "torch.compile:default", t, a, p)
                                     for t in (1, 2) for a in ALLOC for p in PREC})
    compiled = df["compiler"] == "torch.compile:default"
    df.loc[compiled, "s_per_step"] *= 0.5 / math.exp(COMPILER["torch.compile:default"])
    df.loc[compiled, "compile_s"] = 60.0
    df.loc[~compiled, "compile_s"] = 0.5
    return df


def test_a_compiler_never_measured_for_the_workload_pays_its_measured_warm_up():
    """MNIST-CNN never ran compiled; ResNet-18 did: 2x faster per step, after 60 s of
    compilation.  The model predicts MNIST-CNN's compiled steps faster, and the planner
    charges them the compiler's measured warm-up once: a 200-step job stays eager, a
    million-step one compiles."""
    df = compiled_only_elsewhere()
    predictor = predictor_for(df)

    def plan(steps):
        req = mnist_request()
        req = req.model_copy(update={"application": req.application.model_copy(
            update={"steps": steps})})
        return make_plan(req, predictor=predictor, run_id="t").plan

    short, long = plan(200), plan(1_000_000)
    assert short.decided_by == "model" and short.chosen.compiler is None
    assert long.chosen.compiler == "torch.compile:default"
    cand = next(c for c in short.candidates
                if c.configuration.compiler and c.configuration.threads == 2
                and c.configuration.allocator == Allocator.glibc
                and c.configuration.precision == Precision.fp32)
    p = cand.prediction
    assert not p.measured and p.warmup_s == pytest.approx(60.0)
    # its reason compares the job's times, which the ranking did, not seconds per step
    job = p.seconds * 200 + 60.0
    assert cand.reason.startswith(f"predicted {p.seconds:.3g} s/step, the job {job:.3g} s "
                                  "with its warm-up 60 s > "), cand.reason
    assert "warm-up 60 s, as measured of torch.compile:default over every workload" in p.source
    stock = next(c.prediction for c in short.candidates
                 if not c.configuration.compiler and c.configuration.threads == 2
                 and c.configuration.allocator == Allocator.glibc
                 and c.configuration.precision == Precision.fp32)
    assert stock.measured and p.seconds < 0.7 * stock.seconds  # faster per step


def test_a_compilation_its_cap_stopped_is_remembered_as_at_least_that_long():
    """A search's trial was stopped at its time cap while torch.compile was still compiling
    MNIST-CNN, 300 s into its training (ResNet-18 compiled in 60 s).  The store keeps that
    trial, not as a measurement; the next plan charges the compiled candidates at least
    that warm-up here, says why, and hands the figure to the search: a job the 60 s would
    have paid for stays eager.  Only where it happened (not in another image), and only
    till a run there measures that compiler's warm-up."""
    df = compiled_only_elsewhere()
    req = mnist_request()

    def capped(**update):
        rec = {"status": "capped", "config": {"compiler": "torch.compile:default"},
               "error": {"type": "TimeCap", "knob": None, "message": "stopped at its time cap"},
               "metrics": {"steps": 1, "wall_s": 303.0, "startup_s": 3.0, "s_per_step": None}}
        return row("mnist-cnn", "torch.compile:default", 2, "glibc", "fp32", 1.0) | {
            "status": "capped", "s_per_step": None, "steps_per_s": None, "fingerprint": None,
            "source": "autotune", "run_id": "trial-1", "raw": json.dumps(rec),
            "recorded_at": "2026-11-23T00:00:00+00:00"} | update

    def plan(steps, *extra):
        data = pd.concat([df, pd.DataFrame(list(extra))], ignore_index=True) if extra else df
        r = req.model_copy(update={"application": req.application.model_copy(
            update={"steps": steps})})
        return make_plan(r, predictor=predictor_for(data), run_id="t").plan

    def compiled(p):
        return next(c.prediction for c in p.candidates
                    if c.configuration.compiler and c.configuration.threads == 2
                    and c.configuration.allocator == Allocator.glibc
                    and c.configuration.precision == Precision.fp32)

    def stock(p):
        return next(c.prediction for c in p.candidates if not c.configuration.compiler
                    and c.configuration.threads == 2
                    and c.configuration.allocator == Allocator.glibc
                    and c.configuration.precision == Precision.fp32)

    def best(p, on):
        return min(c.prediction.seconds for c in p.candidates if c.prediction
                   and bool(c.configuration.compiler) == on)

    before = plan(1000)
    gain = best(before, False) - best(before, True)
    steps = int(150 / gain)  # (the compiler gains 150 s over them: more than 60, not 300)
    assert plan(steps).chosen.compiler == "torch.compile:default"
    after = plan(steps, capped())
    assert after.decided_by == "model" and after.chosen.compiler is None
    p = compiled(after)
    assert p.warmup_s == pytest.approx(300.0) and p.compiling_s == pytest.approx(300.0)
    assert "warm-up at least 300 s: a trial here (trial-1) was still compiling after that" \
        in p.source
    assert stock(after).compiling_s is None
    # the row is no measurement: the workload's fingerprint is still its runs'
    assert p.seconds == pytest.approx(compiled(plan(steps)).seconds)
    # in another image it says nothing
    elsewhere = compiled(plan(steps, capped(image="pytorch-2.13.0-cpu-src")))
    assert elsewhere.compiling_s is None and elsewhere.warmup_s == pytest.approx(60.0)
    # a later run there that measured the compiler's warm-up (80 s) lifts it
    ran = row("mnist-cnn", "torch.compile:default", 2, "jemalloc", "fp32", 0.05) | {
        "compile_s": 80.0, "recorded_at": "2026-11-24T00:00:00+00:00"}
    lifted = compiled(plan(steps, capped(), ran))
    assert lifted.compiling_s is None and lifted.warmup_s == pytest.approx(80.0)


def test_a_saved_models_card_keeps_a_loss_that_became_infinite(tmp_path):
    """A run whose loss became NaN is stored with an infinite loss (``results.DIVERGED``);
    the saved model's card keeps it infinite in its measured groups, which a plan reads
    as they are where no run is newer than the fit (as null, the run read as one without a
    loss, and a bf16 whose job diverged was chosen again after the job's refit)."""
    from modak_lib.perf.predictor import FastPredictor

    df = synthetic()
    diverged = (df["precision"] == "bf16") & (df["workload"] == "mnist-cnn")
    df.loc[diverged, "final_loss"] = float("inf")
    df.loc[diverged, "steps"] = 100
    path = tmp_path / "model.joblib"
    m.fit(df, estimators=("linear",)).save(path)
    fast = FastPredictor.load(path)
    losses = [x["loss"] for g in fast.measured if g["precision"] == "bf16"
              and g["workload"] == "mnist-cnn" for x in g["losses"]]
    assert losses and all(v == float("inf") for v in losses)


def test_a_job_that_states_no_steps_is_as_long_as_its_last_full_run():
    """A user's script takes its own step argument (``--iters 200``), which MODAK cannot
    read: the job's length is then the steps its last deploy under the same script and
    arguments made, not as many as its wall time holds; a trial (capped: a few steps) is
    not the job's length.  So a 200-step job stays eager once it ran, where the wall-time
    guess (an hour: tens of thousands of steps) paid for the compiler."""
    from modak_lib.workload import key

    df = compiled_only_elsewhere()
    req = mnist_request()
    req = req.model_copy(update={"application": req.application.model_copy(
        update={"arguments": ("--iters", "200")})})
    ran = row("mnist-cnn", "off", 2, "glibc", "fp32", 0.05) | {
        "source": "deploy", "run_id": "job-run", "workload_key": key(req.application),
        "steps": 200, "recorded_at": "2026-11-23T00:00:00+00:00"}
    trial = ran | {"source": "autotune", "run_id": "trial-run", "steps": 12,
                   "recorded_at": "2026-11-24T00:00:00+00:00"}
    other = ran | {"workload_key": "wk-other-arguments", "steps": 900000, "run_id": "other"}

    def plan(*extra):
        data = pd.concat([df, pd.DataFrame(list(extra))], ignore_index=True) if extra else df
        return make_plan(req, predictor=predictor_for(data), run_id="t").plan

    guessed = plan(other)
    assert guessed.decided_by == "model" and guessed.steps is None
    assert guessed.chosen.compiler == "torch.compile:default"
    assert any("wall time (3600 s) holds at stock's predicted speed" in n
               for n in guessed.notes), guessed.notes
    known = plan(other, ran, trial)
    assert known.steps == 200 and known.chosen.compiler is None
    assert any(n.startswith("ranked by the time of a 200-step job (as its last full run under "
                            "these arguments made (job-run))") for n in known.notes), known.notes
    # the application's own statement wins over what was measured
    stated = make_plan(req.model_copy(update={"application": req.application.model_copy(
        update={"steps": 1_000_000})}), predictor=predictor_for(
            pd.concat([df, pd.DataFrame([ran])], ignore_index=True)), run_id="t").plan
    assert stated.steps == 1_000_000 and stated.chosen.compiler == "torch.compile:default"


def test_a_job_stated_in_epochs_is_as_long_as_its_runs_measured_an_epoch():
    """A user states the job's length in epochs, as their script's arguments have it: the
    job is as many steps as an epoch made when its runs last measured one (a trial's
    count counts: it ran the same script over the same data), so 4 epochs of 50 steps stay
    eager where a compiler pays only over many more; an epoch no run measured leaves the
    wall time's guess, and the plan says so."""
    from modak_lib.workload import key

    df = compiled_only_elsewhere()
    req = mnist_request()
    req = req.model_copy(update={"application": req.application.model_copy(
        update={"arguments": ("--epochs", "4"), "epochs": 4})})
    trial = row("mnist-cnn", "off", 2, "glibc", "fp32", 0.05) | {
        "source": "autotune", "run_id": "trial-run", "workload_key": key(req.application),
        "steps": 12, "steps_per_epoch": 50, "recorded_at": "2026-11-24T00:00:00+00:00"}

    def plan(*extra, request=req):
        data = pd.concat([df, pd.DataFrame(list(extra))], ignore_index=True) if extra else df
        return make_plan(request, predictor=predictor_for(data), run_id="t").plan

    unknown = plan(trial | {"steps_per_epoch": None})
    assert unknown.steps is None and unknown.epochs == 4
    assert unknown.chosen.compiler == "torch.compile:default"
    assert any(n.startswith("the application states 4 epoch(s), but no run of this workload "
                            "has measured an epoch's steps yet") for n in unknown.notes)
    known = plan(trial)
    assert known.steps == 200 and known.chosen.compiler is None
    assert any(n.startswith("ranked by the time of a 200-step job (the application's 4 "
                            "epoch(s) of 50 steps, as its runs measured an epoch)")
               for n in known.notes), known.notes
    # many epochs pay for the compiler
    many = plan(trial, request=req.model_copy(update={"application": req.application.model_copy(
        update={"epochs": 20_000})}))
    assert many.steps == 1_000_000 and many.chosen.compiler == "torch.compile:default"
    # the epochs stated are the job's length, and where its last full run under these
    # arguments made another number of them, the plan asks whether they are the script's
    job = trial | {"source": "deploy", "run_id": "job-run", "steps": 1000,
                   "recorded_at": "2026-11-25T00:00:00+00:00"}
    odd = plan(trial, job)
    assert odd.steps == 200
    assert "the application states 4 epoch(s) of 50 steps, but its last full run under these " \
        "arguments made 1000 steps (20 epochs): are its epochs the script's?" in odd.notes
    assert not any("are its epochs" in n for n in plan(trial, job | {"steps": 203}).notes)


def test_the_plot_writes_a_png_of_the_held_out_predictions(tmp_path):
    pytest.importorskip("matplotlib")
    from modak_lib.results import ResultsStore, load_frame
    frame = load_frame(ResultsStore(tmp_path / "empty.sqlite"))
    # four families of the shipped data (the evaluation of all of them takes half a minute)
    frame = frame[frame["workload"].isin(["mnist-cnn", "resnet18", "mlp", "gru"])]
    result = ev.evaluate(frame, "linear", compare=False)
    path = ev.plot(result, tmp_path / "model.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20000


def test_a_model_file_of_an_older_modak_is_refitted_not_an_error(tmp_path, monkeypatch):
    """MODAK 0.2 saved its model with classes of a module that is gone (modak_lib.model):
    loading it refits from the data and saves the new model in its place."""
    import sys
    import types

    import joblib

    old = types.ModuleType("modak_lib.model")

    class FloorScaler:  # as MODAK 0.2 pickled it
        pass
    FloorScaler.__module__, FloorScaler.__qualname__ = "modak_lib.model", "FloorScaler"
    old.FloorScaler = FloorScaler
    monkeypatch.setitem(sys.modules, "modak_lib.model", old)
    path = tmp_path / "model.joblib"
    joblib.dump({"estimator": FloorScaler(), "name": "linear", "meta": {}}, path)
    monkeypatch.delitem(sys.modules, "modak_lib.model")
    with pytest.raises(m.ModelError, match="saved by another MODAK"):
        m.load(path, refit=False)
    said = []
    model = m.load(path, say=said.append, store_path=tmp_path / "none.sqlite")
    assert said and "refitting it" in said[0]
    assert model.card.feature_version == F.FEATURE_VERSION
    assert m.load(path, refit=False).card.model_id == model.card.model_id  # saved in place


def test_the_evaluation_settles_what_the_model_ranks_with_recorded_trials():
    """``+search`` in ``modak model eval``: the held-out model's top candidates and stock go
    through the budgeted search, each trial one recorded run.  The model ranks bf16 first;
    the runs show it slower than stock and tcmalloc faster; compile's loss diverged."""
    def cfg(compiler="off", allocator="glibc", precision="fp32", predicted=1.0):
        return {"compiler": compiler, "threads": 2, "cores": 2, "allocator": allocator,
                "precision": precision, "channels_last": 0, "onednn": 1, "lowo": predicted,
                "configuration": f"{compiler}/{allocator}/{precision}"}
    g = pd.DataFrame([cfg(), cfg(precision="bf16", predicted=0.5),
                      cfg(compiler="torch.compile:default", predicted=0.6),
                      cfg(allocator="tcmalloc", predicted=0.7)])
    g["stock"] = m.stock_mask(g)
    def run(s, final, end, start=None):  # (as trial_runs gives a recorded run)
        return s, {"final_loss": final, "end_loss": end, "start_loss": start}
    runs = {"off/glibc/fp32": [run(1.0, 2.0, 2.1), run(1.0, 2.0, 2.1)],
            "off/glibc/bf16": [run(1.2, 2.0, 2.1), run(1.3, 2.0, 2.1)],
            "torch.compile:default/glibc/fp32": [run(0.3, 9.0, 9.5), run(0.3, 9.0, 9.5)],
            "off/tcmalloc/fp32": [run(0.8, 2.0, 2.1), run(0.85, 2.0, 2.1)]}
    assert ev.label(g.loc[g["lowo"].idxmin()]) == "bf16"
    assert ev.label(ev.searched(g, "lowo", runs)) == "tcmalloc"
    # everything measured slower than stock: stock stays
    slow = {k: [run(1.5, 2.0, 2.1)] if k != "off/glibc/fp32" else v for k, v in runs.items()}
    assert ev.label(ev.searched(g, "lowo", slow)) == "stock"
    # the losses compared are the trials' second halves' where recorded: tcmalloc's last
    # loss the same as stock's, its mean over the second half far worse
    spike = {**runs, "off/tcmalloc/fp32": [run(0.8, 2.0, 3.0), run(0.85, 2.0, 3.0)]}
    assert ev.label(ev.searched(g, "lowo", spike)) == "stock"
    # a loss taken near 0: tcmalloc's 8% above stock's is judged by how far stock's runs
    # lowered it (from their first loss, where recorded)
    for start, chosen in ((None, "stock"), (4.6, "tcmalloc")):
        near = {**runs, "off/glibc/fp32": [run(1.0, 0.001, 0.001031, start)] * 2,
                "off/tcmalloc/fp32": [run(0.8, 0.001, 0.001114, start)] * 2}
        assert ev.label(ev.searched(g, "lowo", near)) == chosen


def test_the_evaluation_chooses_as_the_planner_does():
    """``evaluate.planned``: the held-out model's fastest prediction, unless it is within the
    planner's margin of stock's (then stock), as ``planner._within_margin`` decides; never
    a reduced precision where a configuration keeps fp32 (``planner._unchecked_precision``:
    nothing measured shows that a held-out one keeps the loss)."""
    from modak_lib.perf.search import MIN_GAIN

    def cfg(allocator="glibc", precision="fp32", predicted=1.0):
        return {"compiler": "off", "threads": 2, "cores": 2, "allocator": allocator,
                "precision": precision, "channels_last": 0, "onednn": 1, "lowo": predicted}
    for gain, chosen in ((MIN_GAIN / 2, "stock"), (2 * MIN_GAIN, "tcmalloc")):
        g = pd.DataFrame([cfg(), cfg(allocator="tcmalloc", predicted=1.0 - gain),
                          cfg(precision="bf16", predicted=1.2)])
        g["stock"] = m.stock_mask(g)
        assert ev.label(ev.planned(g, "lowo")) == chosen
    # no stock in the cell (or not predicted): the fastest, whatever its gain
    g = pd.DataFrame([cfg(predicted=float("nan")), cfg(allocator="tcmalloc", predicted=0.99)])
    g["stock"] = m.stock_mask(g)
    assert ev.label(ev.planned(g, "lowo")) == "tcmalloc"
    # bf16 predicted fastest by far: the fastest fp32 one goes first, then the margin
    for gain, chosen in ((MIN_GAIN / 2, "stock"), (2 * MIN_GAIN, "tcmalloc")):
        g = pd.DataFrame([cfg(), cfg(precision="bf16", predicted=0.5),
                          cfg(allocator="tcmalloc", predicted=1.0 - gain),
                          cfg(allocator="tcmalloc", precision="bf16", predicted=0.4)])
        g["stock"] = m.stock_mask(g)
        assert ev.label(ev.planned(g, "lowo")) == chosen
    # nothing keeps fp32 (the planner has nothing else to put first): the fastest
    g = pd.DataFrame([cfg(precision="bf16", predicted=0.5),
                      cfg(allocator="tcmalloc", precision="bf16", predicted=0.4)])
    g["stock"] = m.stock_mask(g)
    assert ev.label(ev.planned(g, "lowo")) == "tcmalloc+bf16"


def test_the_models_choice_is_also_judged_against_the_best_that_keeps_fp32():
    """``evaluate.best_keeping_fp32``: the model alone never chooses an unchecked bf16, so
    its regret is also given against the fastest measured configuration keeping fp32 (where
    bf16 was the fastest, the regret against the best counts a gain only a trial takes)."""
    def cfg(allocator="glibc", precision="fp32", measured=1.0):
        return {"compiler": "off", "threads": 2, "cores": 2, "allocator": allocator,
                "precision": precision, "channels_last": 0, "onednn": 1, "measured": measured}
    g = pd.DataFrame([cfg(), cfg(precision="bf16", measured=0.5),
                      cfg(allocator="tcmalloc", measured=0.8),
                      cfg(allocator="tcmalloc", precision="bf16", measured=0.4)])
    assert ev.label(ev.best_keeping_fp32(g)) == "tcmalloc"
    assert ev.best_keeping_fp32(g[g["precision"] == "bf16"]) is None


def test_the_evaluation_tells_a_new_workloads_level_from_its_knobs():
    """``evaluate.level_given``: a cell's predictions all off by one factor (its level) count
    nothing; what is left is the configurations' times relative to one another."""
    measured = [1.0, 2.0, 4.0, 1.0, 3.0]
    cells = ["a", "a", "a", "b", "b"]
    # cell a 1.5x too slow, cell b 0.5x: each level off, the ratios exact
    off = [1.5, 3.0, 6.0, 0.5, 1.5]
    assert ev.level_given(measured, off, cells) == pytest.approx(0.0)
    assert m.mape(measured, off) == pytest.approx((0.5 * 3 + 0.5 * 2) / 5)
    # one configuration of cell b 2x off relative to the other: the cell's geometric mean
    # error is sqrt(2), so each is off by sqrt(2) the other way
    ratio = [1.0, 2.0, 4.0, 2.0, 3.0]
    want = (2 ** 0.5 - 1 + 1 - 2 ** -0.5) / 5
    assert ev.level_given(measured, ratio, cells) == pytest.approx(want)
    # a cell not predicted is left out
    assert ev.level_given(measured, [1.0, 2.0, 4.0, float("nan"), float("nan")],
                          cells) == pytest.approx(0.0)


def test_the_evaluation_says_how_far_the_measurements_scatter_themselves():
    """``repeatability``: each run of a configuration measured twice or more against the
    median of its other runs; stock (its cell's level after the round correction) and
    configurations measured once are left out."""
    def run(precision, steady, threads=2):
        return {"compiler": "off", "threads": threads, "cores": 2, "allocator": "glibc",
                "precision": precision, "channels_last": 0, "onednn": 1, "steady": steady,
                "configuration": f"{precision}/{threads}"}
    df = pd.DataFrame([run("fp32", 1.0), run("fp32", 3.0),  # stock: left out
                       run("bf16", 1.0), run("bf16", 1.0), run("bf16", 1.5),
                       run("fp32", 9.0, threads=1)])  # measured once: left out
    rep = ev.repeatability(df)
    assert rep["configurations"] == 1
    # 1.0 against median(1.0, 1.5) = 1.25 (twice); 1.5 against median(1.0, 1.0) = 1.0
    assert rep["mape"] == pytest.approx((0.25 / 1.25 * 2 + 0.5) / 3)


def test_the_evaluation_says_how_far_a_workload_scatters_between_like_machines():
    """``reproducibility``: each machine's speed taken out by the *other* families' runs,
    a configuration measured on two like machines is judged against its best single value.
    Machine M2 runs everything 2x slower, family f1 2.4x: f1's two times, so adjusted, are
    1.2 apart, whose best single value (least MAPE) is the faster one: errors 0 and 1/6;
    the other families are exact (the median over the other families ignores f1's factor).
    A target measured on one machine only, a configuration measured on one machine only,
    and a family with no other to take the machines' factor from count for nothing."""
    def run(family, machine_gflops, steady, target="t", precision="fp32"):
        return {"workload": family, "framework": "pytorch", "batch_size": 32,
                "image_size": None, "compiler": "off", "threads": 2, "allocator": "glibc",
                "precision": precision, "channels_last": 0, "onednn": 1, "target": target,
                "gflops_fp32": machine_gflops, "gflops_bf16": None, "bandwidth_gbs": 30.0,
                "op_us": None, "steady": steady}
    rows = []
    for f, base in (("f1", 1.0), ("f2", 3.0), ("f3", 5.0), ("f4", 7.0)):
        rows += [run(f, 100.0, base), run(f, 100.0, base * 1.1),  # median: 1.05 base
                 run(f, 110.0, base * 1.05 * (2.4 if f == "f1" else 2.0))]
    rows += [run("f1", 100.0, 1.0, precision="bf16"),  # on M1 only
             run("f1", 100.0, 9.0, target="u"), run("f2", 100.0, 9.0, target="u")]
    rep = ev.reproducibility(pd.DataFrame(rows))
    assert rep["configurations"] == 4 and rep["targets"] == 1
    assert rep["mape"] == pytest.approx((1 / 6) / 8)
    # the same factor for every family: no scatter
    even = pd.DataFrame([r for r in rows if r["workload"] != "f1"])
    assert ev.reproducibility(even)["mape"] == pytest.approx(0.0)
    alone = pd.DataFrame([r for r in rows if r["workload"] == "f2"])
    assert ev.reproducibility(alone)["configurations"] == 0
    # the best single value: the weighted median that minimises the mean relative error
    assert ev._least_mape([1.0, 2.0]) == 1.0 and ev._least_mape([1.0, 1.1, 5.0]) == 1.1


def _campaign_module():
    """``benchmarks/transfer_campaign.py`` as a module (it is a script, not a package's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "transfer_campaign", ROOT / "benchmarks/transfer_campaign.py")
    campaign = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(campaign)
    return campaign


def _campaign_rows(keep) -> list[dict]:
    """The shipped campaign's CSV rows that ``keep`` takes (as ``csv`` reads them)."""
    import csv

    with open_csv(ROOT / "modak_lib/data/transfer-campaign.csv.gz") as f:
        return [r for r in csv.DictReader(f) if keep(r)]


def _fake_runs(campaign, monkeypatch) -> list:
    """The campaign's runs and probes replaced: each run returns a record of the shipped
    campaign (as of this machine's boot, its own step time) and is noted in the list
    returned, as (family, target, configuration)."""
    raw = _campaign_rows(lambda r: r["run_id"] == "transfer/mlp/b0/2c/stock")[0]["raw"]
    ran = []

    def run_one(family, variant, target, config, steps, seconds=None):
        ran.append((family, target, config))
        rec = json.loads(raw)
        rec["host"]["boot_id"] = campaign.boot_id()
        rec["metrics"]["s_per_step"] = 0.01 * len(ran)  # (each run's own record)
        return rec
    monkeypatch.setattr(campaign, "run_one", run_one)
    # (the runs are fakes: the tcmalloc configuration is run whether or not this machine
    # has the library yet, which scripts/frontend installs)
    monkeypatch.setattr(campaign, "TCMALLOC", __import__("sys").executable)
    monkeypatch.setattr(campaign, "probe", lambda target: {
        "gflops_fp32": 200.0, "gflops_bf16": 900.0, "bandwidth_gbs": 50.0})
    return ran


def test_the_campaign_spends_its_next_round_where_the_model_is_most_wrong(tmp_path):
    """``transfer_campaign.py --uncertain N`` ranks the cells by the model's held-out error:
    a cell where one configuration ran 4x slower than anything else shows (an effect no
    feature explains) comes first."""
    campaign = _campaign_module()
    cells = ("small-cnn/b0/2c/", "resnet18/b0/2c/", "mlp/b0/2c/", "gru/b0/2c/")
    rows = [{k: (v if v != "" else None) for k, v in r.items() if k in COLUMNS}
            for r in _campaign_rows(  # (of the first machine: one description)
                lambda r: any(r["run_id"].startswith("transfer/" + c) for c in cells)
                and not r["boot_id"])]
    for r in rows:
        if r["run_id"] == "transfer/mlp/b0/2c/tcmalloc":
            r["s_per_step"] = str(4 * float(r["s_per_step"]))
    store = ResultsStore(tmp_path / "campaign.sqlite")
    store.append(rows)
    scores = campaign.uncertainty(store)
    assert set(scores) == {("small-cnn", 0, "2c"), ("resnet18", 0, "2c"), ("mlp", 0, "2c"),
                           ("gru", 0, "2c")}
    assert max(scores, key=scores.get) == ("mlp", 0, "2c")
    # on a machine of its own, a cell's next round is spent where that machine measured
    assert campaign.uncertainty(store, None) == scores  # (these rows recorded no boot)
    assert campaign.uncertainty(store, "another boot") == {}


def test_the_campaign_records_a_run_that_crashed_and_not_one_that_was_killed(tmp_path,
                                                                           monkeypatch):
    """A run whose process aborts before any record (oneDNN's abort where it has no bf16
    primitive) is stored as failed, with the signal and why, so the campaign does not run
    it on this machine again; one killed from outside (SIGKILL: out of memory) is not
    stored and runs again."""
    campaign = _campaign_module()
    (tmp_path / "aborts.py").write_text(
        "import os, sys\nprint('oneDNN: could not create a primitive', file=sys.stderr)\n"
        "sys.stderr.flush()\nos.abort()\n")
    (tmp_path / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setattr(campaign, "FAMILIES_DIR", tmp_path)
    monkeypatch.setitem(campaign.FAMILIES, "small-cnn", ("aborts.py", [[]]))
    monkeypatch.setitem(campaign.FAMILIES, "mlp", ("killed.py", [[]]))
    with pytest.raises(campaign.Crashed) as crash:
        campaign.run_one("small-cnn", 0, "2c", "bf16", 2)
    assert crash.value.reason() == "SIGABRT: oneDNN: could not create a primitive"
    with pytest.raises(RuntimeError) as killed:
        campaign.run_one("mlp", 0, "2c", "bf16", 2)
    assert not isinstance(killed.value, campaign.Crashed)

    store = ResultsStore(tmp_path / "campaign.sqlite")
    fp = {"id": "fp-0123456789ab", "trainable_parameters": 10, "flops_per_step": 100.0,
          "batch_size": 32}
    rid = campaign.run_id("small-cnn", 0, "2c", "compile+bf16")
    row = campaign.row_from_fom(
        campaign.crash_record("small-cnn", "2c", "compile+bf16", crash.value, fp),
        source=campaign.SOURCE, run_id=rid, repeat=0, image="host", target="2c")
    store.append([row])
    assert campaign.failed(store, campaign.boot_id()) == {rid}
    assert campaign.done(store, campaign.boot_id()) == {rid: 1}
    stored = store.rows()[0]
    assert (stored["status"], stored["compiler"], stored["precision"], stored["threads"],
            stored["fingerprint"], stored["error"]) == (
        "failed", "torch.compile:default", "bf16", stored["cores"], "fp-0123456789ab",
        "SIGABRT: oneDNN: could not create a primitive")
    assert campaign.failed(store, "another boot") == set()  # another machine runs it


def test_the_campaign_describes_each_machine_by_its_own_probes(tmp_path):
    """A target measured on two machines (two boots: another session's host of the same
    kind) is two descriptions: each machine's rows get the median of its own probes, never
    the other machine's; rows of runtimes that did not record a boot are one machine."""
    import csv

    campaign = _campaign_module()

    def row(n, boot, fp32, bf16):
        return {"recorded_at": f"2026-11-23T0{n}:00:00+00:00", "source": campaign.SOURCE,
                "run_id": "transfer/mlp/b0/2c/stock", "workload": "mlp",
                "framework": "pytorch", "compiler": "off", "allocator": "glibc",
                "precision": "fp32", "channels_last": 0, "onednn": 1, "status": "ok",
                "target": "2c", "boot_id": boot, "gflops_fp32": fp32, "gflops_bf16": bf16,
                "bandwidth_gbs": 30.0, "s_per_step": 0.1, "raw": f"run {n}"}
    store = ResultsStore(tmp_path / "campaign.sqlite")
    store.append([row(1, "a", 100.0, 400.0), row(2, "a", 120.0, 380.0),
                  row(5, "a", 120.0, 380.0),  # the same probe's second run counts once
                  row(6, "a", 300.0, 420.0),
                  row(3, "b", 200.0, 900.0), row(4, None, 90.0, 300.0)])
    assert campaign.export(store, tmp_path / "out.csv") == 6
    with open(tmp_path / "out.csv", newline="") as f:
        got = {r["raw"]: (float(r["gflops_fp32"]), float(r["gflops_bf16"]))
               for r in csv.DictReader(f)}
    a = (120.0, 400.0)  # medians of (100, 120, 300) and (400, 380, 420)
    assert got == {"run 1": a, "run 2": a, "run 5": a, "run 6": a,
                   "run 3": (200.0, 900.0), "run 4": (90.0, 300.0)}



def test_the_campaign_counts_each_machines_runs_for_itself(tmp_path):
    """Another session's host (another boot) is another target: the runs another machine
    made of a cell do not count as this machine's repeats, so ``--repeats 2`` runs that
    cell here until this machine has measured it twice."""
    campaign = _campaign_module()
    rid = "transfer/mlp/b0/2c/stock"
    store = ResultsStore(tmp_path / "campaign.sqlite")
    store.append([{"recorded_at": f"2026-11-23T0{n}:00:00+00:00", "source": campaign.SOURCE,
                   "run_id": rid, "workload": "mlp", "framework": "pytorch", "status": "ok",
                   "compiler": "off", "allocator": "glibc", "precision": "fp32",
                   "channels_last": 0, "onednn": 1, "boot_id": boot,
                   "s_per_step": 0.1, "raw": f"run {n}"}
                  for n, boot in enumerate(["a", "a", None, "b", None, None])])
    assert campaign.done(store, "a") == {rid: 2}
    assert campaign.done(store, "b") == {rid: 1}
    assert campaign.done(store, None) == {rid: 3}
    assert campaign.done(store, "c") == {}
    assert campaign.done(store) == {rid: 6}
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        assert campaign.boot_id() == f.read().strip()


def test_a_cell_that_failed_on_one_machine_is_still_run_on_another(tmp_path, monkeypatch):
    """A failure belongs to its machine: the campaign does not run again there a
    configuration that failed there, and does run it on a machine where it never failed
    (oneDNN's LSTM in bf16 fails on a CPU without native bf16 and runs on one with it)."""
    import sys

    campaign = _campaign_module()
    ran = _fake_runs(campaign, monkeypatch)
    store = tmp_path / "campaign.sqlite"
    here = campaign.boot_id()
    rid = "transfer/mlp/b0/2c/bf16"
    ResultsStore(store).append([{
        "recorded_at": "2026-11-23T01:00:00+00:00", "source": campaign.SOURCE,
        "run_id": rid, "workload": "mlp", "framework": "pytorch", "status": "failed",
        "compiler": "off", "allocator": "glibc", "precision": "bf16", "channels_last": 0,
        "onednn": 1, "boot_id": "another-machine", "raw": "failed elsewhere"}])
    assert campaign.failed(ResultsStore(store)) == {rid}
    assert campaign.failed(ResultsStore(store), "another-machine") == {rid}
    assert campaign.failed(ResultsStore(store), here) == set()

    def main():
        monkeypatch.setattr(sys, "argv", [
            "transfer_campaign.py", "--store", str(store), "--family", "mlp", "--target",
            "2c", "--variant", "0", "--config", "bf16", "--repeats", "1", "--max-busy", "1"])
        assert campaign.main() == 0
    main()
    assert len(ran) == 1  # run here, where it never failed
    ResultsStore(store).append([{
        "recorded_at": "2026-11-23T02:00:00+00:00", "source": campaign.SOURCE,
        "run_id": rid, "workload": "mlp", "framework": "pytorch", "status": "failed",
        "compiler": "off", "allocator": "glibc", "precision": "bf16", "channels_last": 0,
        "onednn": 1, "boot_id": here, "raw": "failed here"}])
    monkeypatch.setattr(campaign, "done", lambda *a, **k: {})  # as if nothing were measured
    main()
    assert len(ran) == 1  # failed here now: not run again


def test_the_campaign_runs_the_rounds_it_is_asked_for_round_by_round(tmp_path, monkeypatch):
    """``--repeats 2`` on a machine that measured nothing runs every configuration of every
    cell twice, the first round of each cell before the second of any; run again, it runs
    nothing; ``--repeats 3`` then runs one round more.  (It ran one round an invocation.)"""
    import sys

    campaign = _campaign_module()
    ran = _fake_runs(campaign, monkeypatch)
    store = tmp_path / "campaign.sqlite"

    def main(repeats):
        monkeypatch.setattr(sys, "argv", [
            "transfer_campaign.py", "--store", str(store), "--family", "mlp", "--family",
            "gru", "--target", "2c", "--variant", "0", "--config", "stock", "--config",
            "bf16", "--repeats", str(repeats), "--max-busy", "1"])
        assert campaign.main() == 0
    main(2)
    assert len(ran) == 8
    first, second = ran[:4], ran[4:]
    assert sorted(first) == sorted(second) and len(set(first)) == 4
    assert campaign.done(ResultsStore(store), campaign.boot_id()) == {
        f"transfer/{f}/b0/2c/{c}": 2 for f in ("mlp", "gru") for c in ("stock", "bf16")}
    main(2)
    assert len(ran) == 8
    main(3)
    assert len(ran) == 12 and sorted(ran[8:]) == sorted(first)


def test_the_campaign_repeats_the_cells_measured_once_a_whole_round_each(tmp_path, monkeypatch):
    """``--unrepeated`` runs one more round of each cell whose configurations all ran on this
    machine, some of them once: the whole cell, stock among it; not a cell already measured
    twice, nor one with only its stock run here (that would be its grid twice)."""
    import sys

    campaign = _campaign_module()
    ran = _fake_runs(campaign, monkeypatch)
    store = tmp_path / "campaign.sqlite"

    def main(*families, more=("--repeats", "1"), configs=("stock", "bf16")):
        monkeypatch.setattr(sys, "argv", [
            "transfer_campaign.py", "--store", str(store), *(
                a for f in families for a in ("--family", f)), "--target", "2c", "--variant",
            "0", *(a for c in configs for a in ("--config", c)), "--max-busy", "1", *more])
        assert campaign.main() == 0
    main("mlp", "gru")  # both cells once
    main("gru", more=("--repeats", "2"))  # the GRU's twice
    main("vit", configs=("stock",))  # the ViT: only its stock run here
    del ran[:]
    main("mlp", "gru", "vit", more=("--unrepeated",))
    assert sorted(ran) == [("mlp", "2c", "bf16"), ("mlp", "2c", "stock")]
    main("mlp", "gru", "vit", more=("--unrepeated",))  # each cell now measured twice
    assert len(ran) == 2
    assert campaign.done(ResultsStore(store), campaign.boot_id()) == {
        **{f"transfer/{f}/b0/2c/{c}": 2 for f in ("mlp", "gru") for c in ("stock", "bf16")},
        "transfer/vit/b0/2c/stock": 1}


def test_the_held_out_benchmark_takes_the_pytorch_grid_where_it_ran_not_a_stock_anchor():
    """``benchmarks/transfer_search.py`` describes a family by this machine's runs and takes
    the grid's best from this machine only where its grid ran here: its Keras twin's runs
    (recorded under the same workload name, faster under XLA) are not its grid, nor is a
    lone stock run that ties this machine's speed to the others'."""
    import importlib.util

    import pandas as pd

    spec = importlib.util.spec_from_file_location(
        "transfer_search", ROOT / "benchmarks/transfer_search.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def run(family, config, boot, framework="pytorch", micro="x86_64_v4", cores=2, t=1.0):
        return {"run_id": f"transfer/{family}/b0/2c/{config}", "workload": "mlp",
                "framework": framework, "boot_id": boot, "microarchitecture": micro,
                "cores": cores, "s_per_step": t}
    df = pd.DataFrame([
        run("mlp-keras", "xla", "here", framework="keras", t=0.1),  # the twin, first
        run("mlp", "stock", "here"),  # this machine's anchor
        run("mlp", "stock", "other"), run("mlp", "bf16", "other", t=0.5),
        run("mlp", "stock", "zen", micro="zen3"), run("mlp", "tcmalloc", "zen", micro="zen3",
                                                      t=0.2)])
    described, grid, where = bench.cells(df, "mlp", "2c", "here", 2)
    assert list(described["run_id"]) == ["transfer/mlp/b0/2c/stock"]
    assert (described["boot_id"] == "here").all() and where == "like"
    assert set(grid["boot_id"]) == {"other"}  # the same CPU kind and cores, not the twin's
    # the grid ran here: its best is this machine's
    more = pd.concat([df, pd.DataFrame([run("mlp", "bf16", "here", t=0.7)])])
    described, grid, where = bench.cells(more, "mlp", "2c", "here", 2)
    assert where == "here" and set(grid["framework"]) == {"pytorch"} and len(grid) == 2
    # a machine the campaign never ran on: described by every run, graded by its CPU kind
    described, grid, where = bench.cells(df, "mlp", "2c", "new", 2, "zen3")
    assert where == "like" and set(grid["boot_id"]) == {"zen"} and len(described) == 5
    assert bench.cells(df, "mlp", "2c", "new", 2, "icelake")[2] == "all"
    assert bench.cells(df, "gru", "2c", "here", 2)[0].empty


def test_the_held_out_benchmark_searches_a_keras_family_in_its_own_grid():
    """A Keras family in ``benchmarks/transfer_search.py`` is described and graded by its own
    framework's runs (not its PyTorch twin's, recorded under the same workload name), and
    its grid's configurations (XLA, not ``torch.compile``) map to the labels that run them."""
    import importlib.util

    import pandas as pd

    spec = importlib.util.spec_from_file_location(
        "transfer_search", ROOT / "benchmarks/transfer_search.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    campaign = bench.tc

    def run(family, config, framework, t):
        return {"run_id": f"transfer/{family}/b0/2c/{config}", "workload": "mlp",
                "framework": framework, "boot_id": "here", "microarchitecture": "x86_64_v4",
                "cores": 2, "s_per_step": t}
    df = pd.DataFrame([
        run("mlp", "stock", "pytorch", 1.0), run("mlp", "compile", "pytorch", 0.1),
        run("mlp-keras", "stock", "keras", 0.5), run("mlp-keras", "xla", "keras", 0.9),
        run("mlp-keras", "bf16", "keras", 0.4)])
    described, grid, where = bench.cells(df, "mlp-keras", "2c", "here", 2)
    assert where == "here" and set(grid["framework"]) == {"keras"} and len(grid) == 3
    assert grid.groupby("run_id")["s_per_step"].median().idxmin().endswith("/bf16")
    described, grid, where = bench.cells(df, "mlp", "2c", "here", 2)
    assert set(grid["framework"]) == {"pytorch"} and len(grid) == 2
    # each configuration of a family's grid is the one its label runs, and back
    for family in ("mlp", "mlp-keras"):
        framework = campaign.framework_of(family)
        labels = campaign.configs_for("2c", family)
        configs = [bench.config_of(k, 2, framework) for k in labels]
        assert len(set(configs)) == len(labels)
        assert [bench.label_of(c, 2) for c in configs] == labels
    xla = bench.config_of("xla+bf16", 2, "keras")
    assert xla.compiler == "xla" and xla.precision.value == "bf16"
    assert "xla" in campaign.configs_for("2c", "mlp-keras")
    assert "compile" not in campaign.configs_for("2c", "mlp-keras")
    assert bench.config_of("compile", 2).compiler == "torch.compile:default"


def test_a_campaign_run_measured_beside_other_work_is_not_recorded_but_run_again(
        tmp_path, monkeypatch):
    """A run during which more than ``--max-busy`` of the machine went to something else is
    not stored; the campaign waits for the machine to be quiet and goes on, and measures
    that configuration again when run again.  A machine that stays busy stops it."""
    import sys

    campaign = _campaign_module()
    ran = _fake_runs(campaign, monkeypatch)
    shares, waits = [], []

    class Disturbance:  # what /proc/stat would say of each run, in turn
        def __enter__(self):
            self.share = shares.pop(0)
            return self

        def __exit__(self, *exc):
            pass

    quiet = []
    monkeypatch.setattr(campaign, "Disturbance", Disturbance)
    monkeypatch.setattr(campaign, "wait_quiet",
                        lambda limit, deadline: waits.append(limit) or quiet.pop(0))
    store = tmp_path / "campaign.sqlite"

    def main(*more):
        monkeypatch.setattr(sys, "argv", [
            "transfer_campaign.py", "--store", str(store), "--family", "mlp", "--target", "2c",
            "--variant", "0", "--config", "stock", "--config", "bf16", "--config",
            "tcmalloc", *more])
        assert campaign.main() == 0

    def measured():
        return campaign.done(ResultsStore(store), campaign.boot_id())

    # quiet before the probe; the first run disturbed (a third of the machine elsewhere),
    # quiet again after it; the other two measured
    shares[:], quiet[:] = [0.33, 0.02, None], [True, True]
    main()
    assert len(ran) == 3 and waits == [0.1, 0.1] and not quiet and not shares
    assert sorted(measured()) == sorted(f"transfer/mlp/b0/2c/{c}" for _, _, c in ran[1:])
    # run again: only the disturbed one, now measured
    shares[:], quiet[:] = [0.05], [True]
    main()
    assert ran[3:] == ran[:1]
    assert measured() == {f"transfer/mlp/b0/2c/{c}": 1 for c in ("stock", "bf16", "tcmalloc")}
    # a second round on a machine that stays busy: one disturbed run, then it stops
    waits.clear()
    shares[:], quiet[:] = [0.5], [True, False]
    main("--repeats", "2", "--max-busy", "0.2")
    assert len(ran) == 5 and waits == [0.2, 0.2] and not quiet
    assert set(measured().values()) == {1}
    # --max-busy 1 records every run and waits for nothing
    shares[:] = [0.9, 0.9, 0.9]
    main("--repeats", "2", "--max-busy", "1")
    assert len(ran) == 8 and waits == [0.2, 0.2]
    assert set(measured().values()) == {2}


def test_a_runs_disturbance_is_the_cpu_of_others_not_of_the_runs_own_processes():
    """:class:`Disturbance` counts what the machine's CPUs did beside the processes started
    inside it: of the machine's busy and stolen CPU seconds over the wall time and its CPUs,
    its waited-for children's are the run's own. The arithmetic with set clocks (this
    machine is shared, the suite's other worker among those sharing it)."""
    from types import SimpleNamespace

    campaign = _campaign_module()

    def measured(clocks, children, walls, cpus=2):
        clocks, children, walls = iter(clocks), iter(children), iter(walls)
        campaign.cpu_clock = lambda: next(clocks)
        campaign.children_cpu = lambda: next(children)
        campaign.time = SimpleNamespace(monotonic=lambda: next(walls))
        campaign.os = SimpleNamespace(cpu_count=lambda: cpus)
        with campaign.Disturbance() as d:
            pass
        return d.share

    # 3 busy seconds, 1.5 of them the run's own child's, 0.5 stolen; 2 s on 2 CPUs
    assert measured([(100, 5), (103, 5.5)], [10, 11.5], [50, 52]) == pytest.approx(0.5)
    # the run's own children alone: nothing else (the coarser machine clock, no less)
    assert measured([(100, 0), (101.98, 0)], [10, 12], [50, 52]) == 0
    assert measured([(100, 0), (108, 0)], [0, 0], [0, 2], cpus=4) == 1.0  # all 4 CPUs
    assert measured([(100, 0), (101, 0)], [0, 0], [0, 0.9]) is None  # under a second
    assert measured([None, None], [0, 0], [0, 5]) is None  # no /proc/stat


def test_the_machines_clocks_see_the_runs_child_and_another_process():
    """On this machine: a child's spin is in both the machine's busy seconds and the run's
    children's (so :class:`Disturbance` takes it away), and another process's CPU seconds
    in the window are counted in full, whatever else the machine does meanwhile."""
    import os
    import subprocess
    import sys

    campaign = _campaign_module()
    if campaign.cpu_clock() is None:
        pytest.skip("no /proc/stat here: the campaign cannot tell a disturbed run")
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {}: pass"
    clock, kids = campaign.cpu_clock()[0], campaign.children_cpu()
    subprocess.run([sys.executable, "-c", spin.format(1.5)], check=True)
    own = campaign.children_cpu() - kids
    assert own > 0.3  # (under 1.5 s of CPU where the machine is busy)
    assert campaign.cpu_clock()[0] - clock >= own - 0.1  # (the clock's ticks: 10 ms a CPU)

    def cpu_of(pid):  # utime + stime, /proc/PID/stat's 14th and 15th fields, after the name
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    other = subprocess.Popen([sys.executable, "-c", spin.format(3.0)])
    try:
        time.sleep(0.3)
        start = cpu_of(other.pid)
        with campaign.Disturbance() as beside:
            time.sleep(1.5)
        spent = cpu_of(other.pid) - start
    finally:
        other.wait()
    assert spent > 0.3
    assert beside.share * 1.5 * os.cpu_count() >= spent - 0.1  # (its wall: 1.5 s and a hair)


def test_a_gpu_machines_campaign_joins_the_shipped_one_as_a_target_of_its_own(tmp_path):
    """A campaign run on a GPU machine comes back as a store file; ``--merge`` adds its
    rows once (a second merge adds none), and the model's data name its GPU target apart
    from the same host's CPU.  The GPU target takes no thread-count configuration, and a
    machine without tcmalloc none of tcmalloc."""

    import pandas as pd

    from modak_lib.perf.fit import target_id

    campaign = _campaign_module()

    def row(n, target, accelerator):
        return {"recorded_at": f"2026-11-24T0{n}:00:00+00:00", "source": campaign.SOURCE,
                "run_id": f"transfer/mlp/b1/{target}/stock", "workload": "mlp",
                "framework": "pytorch", "compiler": "off", "allocator": "glibc",
                "precision": "fp32", "channels_last": 0, "onednn": 1, "status": "ok",
                "target": target, "boot_id": "gpu-node", "accelerator": accelerator,
                "microarchitecture": "icelake", "cores": 16, "s_per_step": 0.01,
                "raw": f"gpu node run {n}"}
    theirs = ResultsStore(tmp_path / "gpu.sqlite")
    theirs.append([row(1, "gpu", "H100"), row(2, "2c", None),
                   {**row(3, "gpu", "H100"), "source": "deploy"}])  # not the campaign's
    ours = ResultsStore(tmp_path / "here.sqlite")
    ours.append([{**row(0, "2c", None), "boot_id": "here", "raw": "here run"}])
    assert campaign.merge(ours, theirs.path) == 2
    assert campaign.merge(ours, theirs.path) == 0
    frame = pd.DataFrame(ours.rows())
    assert sorted(target_id(frame)) == ["icelake/16 cores", "icelake/16 cores",
                                        "icelake/16 cores + H100"]
    # a runtime without archspec names no microarchitecture: the target is still named
    # (as the features name it), not left out of every held-out group
    gpu_row = frame[frame["accelerator"] == "H100"].iloc[0].to_dict()
    frame.loc[len(frame)] = {**gpu_row, "microarchitecture": None}
    assert target_id(frame).iloc[-1] == "unknown/16 cores + H100"
    assert campaign.accelerator_model({"accelerator": "NVIDIA H100 80GB HBM3"}) == "H100"
    assert campaign.accelerator_model({"accelerator": "NVIDIA A100-SXM4-40GB"}) == "A100"
    assert campaign.accelerator_model({}) is None
    gpu = campaign.configs_for("gpu")
    assert "threads=1" not in gpu and {"stock", "compile", "bf16", "compile+bf16"} <= set(gpu)
    campaign.TCMALLOC = str(tmp_path / "no-such-libtcmalloc.so")
    assert "tcmalloc" not in campaign.configs_for("2c")


def test_a_keras_family_runs_under_its_architectures_name_with_xla_as_its_compiler():
    """The campaign's Keras families are the PyTorch families' architectures in Keras 3: a
    run of one goes through the runtime like any script, is recorded under the architecture's
    name (held out of the model with its PyTorch twin) with its framework, and its graph
    compiler is XLA (``Model.compile(jit_compile=True)``), never torch.compile, and not on
    a target of capped ISA; a PyTorch family is never offered XLA."""
    campaign = _campaign_module()
    keras_configs = campaign.configs_for("2c", "mlp-keras")
    assert {"xla", "xla+bf16", "bf16", "stock"} <= set(keras_configs)
    assert not {"compile", "compile+bf16"} & set(keras_configs)
    assert not {"xla", "xla+bf16"} & set(campaign.configs_for("2c", "mlp"))
    assert campaign.configs_for("2c", "mlp") == campaign.configs_for("2c")
    # on the target made by capping oneDNN's and ATen's ISA, no XLA: its code generator
    # is not capped, and would measure this machine
    capped = campaign.configs_for("avx2", "mlp-keras")
    assert "bf16" in capped and not {"xla", "xla+bf16"} & set(capped)
    shipped = _campaign_rows(lambda r: r["status"] in ("ok", "capped")
                             and r["trainable_parameters"])
    for family, workload in campaign.KERAS_FAMILIES.items():
        assert workload in campaign.FAMILIES and campaign.workload_of(family) == workload
        assert campaign.FAMILIES[family][0].startswith("keras_")
        assert campaign.FAMILIES[family][1] == campaign.FAMILIES[workload][1]
        # measured, and the same layers as its PyTorch twin: each of its counts of trainable
        # parameters is one of the twin's (the transformer LM's are two: its position
        # table is as long as each batch variant's sequences); the LSTM LM's differ by
        # their biases (Keras's LSTM has one a gate, PyTorch's two)
        params = {fw: {int(float(r["trainable_parameters"])) for r in shipped
                       if r["workload"] == workload and r["framework"] == fw}
                  for fw in ("keras", "pytorch")}
        assert params["keras"], family
        if workload != "lstm-lm":
            assert params["keras"] <= params["pytorch"], (family, params)
    rec = campaign.run_one("mlp-keras", 0, "2c", "xla", 2)
    assert rec["status"] in ("ok", "capped"), rec.get("error")
    assert rec["workload"] == "mlp" and rec["framework"] == "keras"
    assert rec["effect"]["compiled"] is True and "jit_compile=True" in rec["applied"]["compiler"]
    assert rec["metrics"]["s_per_step"] > 0
    # the same layers as the PyTorch MLP at its batch: its parameters, and its FLOPs a step
    # within what the two counts differ by (Keras's is three forwards; PyTorch's counts the
    # backward as run, which computes no gradient of the input: 10% less here)
    torch_rows = [r for r in shipped if r["run_id"] == "transfer/mlp/b0/2c/stock"]
    assert rec["fingerprint"]["trainable_parameters"] == int(torch_rows[0]["trainable_parameters"])
    assert 1.0 < rec["fingerprint"]["flops_per_step"] / float(torch_rows[0]["flops_per_step"]) \
        < 1.15
    # the elements a step writes, estimated from the layers' outputs, near what PyTorch's
    # dispatcher counted (its activations and the loss's tensors are operations of their own)
    assert 0.8 < rec["fingerprint"]["elements_per_step"] \
        / float(torch_rows[0]["elements_per_step"]) < 1.25
    assert rec["fingerprint"]["recurrent_steps"] == 0


def test_a_campaign_csv_named_gz_is_written_compressed_and_read_back_as_it_was(tmp_path):
    """The shipped campaign is gzip-compressed (``--csv NAME.gz``): the export writes it so,
    the same rows always as the same bytes (no time stamp: a commit changes the file only
    when its rows change), a fresh store resumes from it, and the model's loader reads it
    as a ``--data`` file; a plain ``.csv`` name stays plain text."""
    import gzip

    campaign = _campaign_module()
    store = ResultsStore(tmp_path / "campaign.sqlite")
    store.append([{"recorded_at": f"2026-11-27T0{n}:00:00+00:00", "source": campaign.SOURCE,
                   "run_id": "transfer/mlp/b0/2c/stock", "workload": "mlp",
                   "framework": "pytorch", "compiler": "off", "allocator": "glibc",
                   "precision": "fp32", "channels_last": 0, "onednn": 1, "status": "ok",
                   "target": "2c", "boot_id": "a", "s_per_step": 0.1 + n / 100,
                   "raw": json.dumps({"run": n, "note": "caf\u00e9, \"quoted\"\nline"})}
                  for n in range(3)])
    packed, plain = tmp_path / "campaign.csv.gz", tmp_path / "campaign.csv"
    assert campaign.export(store, packed) == 3 == campaign.export(store, plain)
    first = packed.read_bytes()
    assert first[:2] == b"\x1f\x8b" and plain.read_bytes()[:2] != b"\x1f\x8b"
    assert gzip.decompress(first) == plain.read_bytes()
    assert first[4:8] == b"\x00\x00\x00\x00"  # (the header's MTIME: no time stamp)
    campaign.export(store, packed)
    assert packed.read_bytes() == first
    fresh = ResultsStore(tmp_path / "fresh.sqlite")
    assert campaign.seed(fresh, packed) == 3
    assert [r["raw"] for r in fresh.rows()] == [r["raw"] for r in store.rows()]
    frame = load_frame(None, include_shipped=False, extra=[packed])
    assert sorted(frame["s_per_step"]) == pytest.approx([0.1, 0.11, 0.12])
    assert json.loads(frame["raw"].iloc[0])["note"] == "caf\u00e9, \"quoted\"\nline"


def test_refingerprint_fills_a_new_count_and_an_accelerators_rows_only_what_the_modules_say(
        tmp_path, monkeypatch):
    """``--refingerprint`` fills a figure a newer runtime counts into the rows of each
    fingerprint it runs again; a GPU's rows of the same workload (its parameters, batch and
    input shape) whose device counted other operations keep their own fingerprint and get
    only what is counted from the modules and the script's Python (``recurrent_steps``, the
    calls); a run that failed in its first step keeps what it counted; any other row whose
    fingerprint differs stops it, the CSV unchanged."""
    import csv

    campaign = _campaign_module()
    cpu = _campaign_rows(lambda r: r["run_id"] == "transfer/gru/b0/2c/stock"
                         and not r["accelerator"])[0]
    record = json.loads(cpu["raw"])
    counts = {"recurrent_steps": 128, "python_ops_per_step": 29, "module_calls_per_step": 3}
    record["fingerprint"].update(counts)
    monkeypatch.setattr(campaign, "run_one", lambda *a, **k: json.loads(json.dumps(record)))
    cpu = {**cpu, **{c: "" for c in counts}}
    gpu = {**cpu, "run_id": "transfer/gru/b0/gpu/stock", "accelerator": "H100",
           "fingerprint": "fp-device00000", "ops_per_step": "30"}
    # (oneDNN could not make its bf16 primitive: the run failed after counting a little)
    failed = {**cpu, "run_id": "transfer/gru/b0/2c/bf16", "status": "failed",
              "fingerprint": "fp-partial0000", "flops_per_step": "0.0"}
    path = tmp_path / "campaign.csv"
    campaign.write_csv(path, [cpu, gpu, failed])
    assert campaign.refingerprint(path) == 2 * len(counts)
    with open_csv(path) as f:
        here, there, broken = list(csv.DictReader(f))
    for c, v in counts.items():
        assert here[c] == there[c] == str(v) and broken[c] == ""
    assert (broken["fingerprint"], broken["flops_per_step"]) == ("fp-partial0000", "0.0")
    assert here["fingerprint"] == record["fingerprint"]["id"] == cpu["fingerprint"]
    assert (there["fingerprint"], there["ops_per_step"]) == ("fp-device00000", "30")
    # another workload under the same name: not the measured one, on either device
    for wrong in ({**cpu, "fingerprint": "fp-other000000"},
                  {**gpu, "trainable_parameters": "7"}):
        campaign.write_csv(path, [wrong])
        before = path.read_bytes()
        with pytest.raises(SystemExit, match="not the measured workload"):
            campaign.refingerprint(path)
        assert path.read_bytes() == before


def test_the_shipped_campaign_gives_a_first_model_that_speaks_for_new_families(tmp_path):
    """An installed MODAK fits its first model (the quick estimators) on the shipped datasets:
    the transfer campaign is among them, read once even when named again with --data, and
    the model it keeps is trusted for a workload family it never measured (its held-out
    family error within the planner's MAX_UNSEEN_SIGMA), with its trees exported for the
    planner; the linear models alone are further off on held-out families (they were off by
    more than MAX_UNSEEN_SIGMA until the second H100 machine's runs: 0.48 now)."""
    from modak_lib.perf.predictor import MAX_UNSEEN_SIGMA
    from modak_lib.results import CAMPAIGN, SHIPPED_DATASETS

    assert CAMPAIGN in SHIPPED_DATASETS and CAMPAIGN.exists()
    data = load_frame(None)
    assert len(load_frame(None, extra=[CAMPAIGN, str(CAMPAIGN)])) == len(data)
    assert {"mobile-cnn", "gru", "transformer-lm", "recommender"} <= set(data["workload"])
    model = m.fit(data, estimators=m.QUICK_ESTIMATORS)
    assert model.card.sigma_log_unseen < MAX_UNSEEN_SIGMA
    assert model.meta["light"]["formula"].get("kind") == "trees"
    linear = m.fit(data, estimators=("linear", "linear-main"))
    assert linear.card.sigma_log_unseen > 1.2 * model.card.sigma_log_unseen  # 0.48 and 0.35


def test_a_first_fit_takes_the_shipped_comparison_which_is_the_one_it_would_compute(
        monkeypatch):
    """A first fit on the shipped datasets alone (a fresh install's first plan) takes the
    quick estimators' comparison shipped beside them instead of computing it (15 s to a
    minute), and only there: of other measurements, other estimators or other features it
    computes its own.  The shipped one is the comparison computed afresh."""
    data = load_frame(None)
    frame = m.usable(m.training_frame(data))
    shipped = m.shipped_comparison(frame, m.QUICK_ESTIMATORS, "workload")
    assert shipped is not None, \
        f"{m.SHIPPED_COMPARISON.name} is not of the shipped data: run scripts/ship-comparison"
    afresh = m.compare(frame, m.QUICK_ESTIMATORS, "workload")
    assert (afresh.estimator, afresh.rows, afresh.data_fingerprint) == (
        shipped.estimator, shipped.rows, shipped.data_fingerprint)
    assert afresh.held_out_mape == pytest.approx(shipped.held_out_mape, rel=0.01)
    assert (afresh.sigma_log, afresh.sigma_log_unseen) == pytest.approx(
        (shipped.sigma_log, shipped.sigma_log_unseen), rel=0.01)
    assert afresh.sigma_log_unseen_by_framework == pytest.approx(
        shipped.sigma_log_unseen_by_framework, rel=0.01)

    def computed(*args, **kwargs):
        raise AssertionError("compared the estimators again")
    monkeypatch.setattr(m, "compare", computed)
    card = m.fit(data, estimators=m.QUICK_ESTIMATORS).card
    assert (card.estimator, card.held_out_mape, card.sigma_log_unseen, card.held_out_rows) \
        == (shipped.estimator, shipped.held_out_mape, shipped.sigma_log_unseen, len(frame))
    assert card.sigma_log_unseen_by_framework == shipped.sigma_log_unseen_by_framework
    with pytest.raises(AssertionError, match="compared the estimators again"):
        m.fit(pd.concat([data, synthetic()], ignore_index=True), estimators=m.QUICK_ESTIMATORS)
    with pytest.raises(AssertionError, match="compared the estimators again"):
        m.fit(data, estimators=("linear", "extra-trees"))
    monkeypatch.setattr(F, "FEATURE_VERSION", F.FEATURE_VERSION + 1)
    assert m.shipped_comparison(frame, m.QUICK_ESTIMATORS, "workload") is None


def test_a_model_of_cpu_data_does_not_decide_for_an_accelerator_it_never_measured():
    """A GPU target's figures can be given, but a model fitted on CPU runs only has learned
    nothing of a GPU's efficiency: it leaves the choice to the prior and the trials."""
    from modak_lib.perf.predictor import FastPredictor
    fitted = m.fit(synthetic(noise=0.05, seed=3), estimators=("linear",))
    assert fitted.meta["light"]["accelerators"] == []
    # (trusted for unseen targets, so that only the accelerator can stop it)
    fast = FastPredictor({**fitted.meta, "sigma_log_unseen": 0.1,
                          "sigma_log_unseen_by_framework": {"pytorch": 0.1}})
    new = {"microarchitecture": "skylake_avx512"}  # (nothing measured there to answer it)
    cpu = make_plan(mnist_request(**new), predictor=fast, run_id="c").plan
    gpu = make_plan(mnist_request(**new, accelerators={"vendor": "nvidia", "model": "V100",
                                                       "count": 1}),
                    predictor=fast, run_id="g").plan
    assert cpu.decided_by == "model" and gpu.decided_by == "prior"
    assert any("a measurement on a V100 (its data are of CPUs only)" in n for n in gpu.notes)


def test_a_measurement_answers_only_for_the_accelerator_it_ran_on():
    """The same CPU and cores with a GPU is another target: its runs answer for it, and the
    CPU node's runs do not (nor the other way round)."""
    v100 = {"vendor": "nvidia", "model": "V100", "count": 1}
    cpu_runs = synthetic()
    gpu_runs = synthetic().assign(accelerator="V100",
                                  s_per_step=lambda d: d["s_per_step"] / 10)
    cpu_only = predictor_for(cpu_runs)
    gpu = make_plan(mnist_request(accelerators=v100), predictor=cpu_only, run_id="g").plan
    assert gpu.decided_by == "prior"
    assert not any(c.prediction and c.prediction.measured for c in gpu.candidates)
    both = predictor_for(pd.concat([cpu_runs, gpu_runs], ignore_index=True))
    for acc, runs in ((v100, gpu_runs), (None, cpu_runs)):
        plan = make_plan(mnist_request(**({"accelerators": acc} if acc else {})),
                         predictor=both, run_id="b").plan
        stock = next(c for c in plan.candidates if c.configuration.compiler is None
                     and c.configuration.threads == 2
                     and c.configuration.allocator == Allocator.glibc
                     and c.configuration.precision == Precision.fp32)
        s = runs[(runs.workload == "mnist-cnn") & (runs.compiler == "off") & (runs.threads == 2)
                 & (runs.allocator == "glibc")
                 & (runs.precision == "fp32")]["s_per_step"].median()
        assert stock.prediction.measured and stock.prediction.seconds == pytest.approx(s)


def test_a_run_in_one_image_is_not_another_images_measurement():
    """With an optimised build allowed, the source-built image and the pip one are both
    candidates. Runs recorded in the pip image answer only for it; runs outside any image
    (the shipped campaigns ran on the host) stand for both, and where the times are equal
    the better-scored image (the source build) is chosen, not the first by name. A target
    that runs no container runs in the host's environment: a run in an image is not its
    measurement."""
    pip, src = "pytorch-2.13.0-cpu", "pytorch-2.13.0-cpu-src"
    req = mnist_request(max_build_hours=10, container_runtime="podman")
    in_pip = predictor_for(synthetic().assign(image=pip))
    plan = make_plan(req, predictor=in_pip, run_id="i").plan
    by_image: dict[str, list] = {}
    for c in plan.candidates:
        by_image.setdefault(c.configuration.image, []).append(c)
    assert set(by_image) == {pip, src}
    assert all(c.prediction.measured for c in by_image[pip])
    assert not any(c.prediction and c.prediction.measured for c in by_image[src])
    plan = make_plan(req, predictor=predictor_for(synthetic()), run_id="h").plan
    assert all(c.prediction.measured for c in plan.candidates)
    assert plan.chosen.image == src
    on_host = make_plan(mnist_request(), predictor=in_pip, run_id="n").plan
    assert on_host.candidates and not any(c.prediction and c.prediction.measured
                                          for c in on_host.candidates)


def test_a_run_of_several_ranks_answers_only_a_job_of_as_many_and_is_not_fitted_on():
    """A data-parallel run (rank 0's record, ``effect.ranks``) is a measurement of that many
    ranks: it answers a job of as many, a single process's run does not answer that job, nor
    it a single process's.  The model, fitted on single processes, does not speak for a job
    of several ranks: its unmeasured configurations are left to the prior and the trials.  A
    script that starts its own ranks (``mp.spawn``, no launcher) is as many ranks in a job
    of one process, as its latest run was."""
    single = synthetic()
    ranked = synthetic().assign(ranks=2, launcher="torchrun", recorded_at="2026-11-23T00:00:00",
                                run_id="ranked", s_per_step=lambda d: d["s_per_step"] * 3)
    both = pd.concat([single, ranked], ignore_index=True)
    assert len(m.usable(m.training_frame(both))) == len(single)
    fitted = m.fit(both, estimators=("linear",))
    assert fitted.meta["rows"] == len(single)
    groups = m.measured_groups(m.training_frame(both))
    assert sorted({g["ranks"] for g in groups}) == [1, 2]

    def stock_time(runs, threads):
        return runs[(runs.workload == "mnist-cnn") & (runs.compiler == "off")
                    & (runs.threads == threads) & (runs.allocator == "glibc")
                    & (runs.precision == "fp32")]["s_per_step"].median()

    def stock_of(plan, threads):
        return next(c for c in plan.candidates if c.configuration.compiler is None
                    and c.configuration.threads == threads
                    and c.configuration.allocator == Allocator.glibc
                    and c.configuration.precision == Precision.fp32)

    base = mnist_request()  # (torchrun's two ranks of one thread each)
    two = base.model_copy(update={"job": base.job.model_copy(
        update={"process_count_per_node": 2})})
    only_single = predictor_for(single)
    plan = make_plan(two, predictor=only_single, run_id="s").plan
    assert plan.decided_by == "prior"
    assert not any(c.prediction for c in plan.candidates)
    assert any("a model of 2 training ranks" in n for n in plan.notes)
    with_ranked = m.model_predictor(fitted, both)
    plan = make_plan(two, predictor=with_ranked, run_id="r").plan
    stock = stock_of(plan, 1)
    assert stock.prediction.measured
    assert stock.prediction.seconds == pytest.approx(stock_time(ranked, 1))
    assert all(c.prediction is None or c.prediction.measured for c in plan.candidates)
    alone = make_plan(mnist_request(), predictor=with_ranked, run_id="a").plan
    assert stock_of(alone, 1).prediction.seconds == pytest.approx(stock_time(single, 1))
    # the script's own ranks: a job of one process, its runs of two ranks without a launcher
    spawned = ranked.assign(launcher=None, run_id="spawned")
    spawns = m.model_predictor(m.fit(pd.concat([single, spawned], ignore_index=True),
                                     estimators=("linear",)),
                               pd.concat([single, spawned], ignore_index=True))
    plan = make_plan(mnist_request(), predictor=spawns, run_id="p").plan
    assert stock_of(plan, 2).prediction.seconds == pytest.approx(stock_time(spawned, 2))
    # and once it trains in one process again, its latest run says so
    again = single.assign(recorded_at="2026-11-24T00:00:00", run_id="again")
    data = pd.concat([spawned, again], ignore_index=True)
    plan = make_plan(mnist_request(), predictor=m.model_predictor(
        m.fit(data, estimators=("linear",)), data), run_id="q").plan
    assert stock_of(plan, 2).prediction.seconds == pytest.approx(stock_time(again, 2))


def test_a_failure_or_a_refused_knob_answers_for_the_place_it_happened():
    """torch.compile failing on another CPU, or tcmalloc missing from one image, does not
    keep them from this target or the host: a refused knob or a failed configuration is
    withheld only at its place (the target and the image: the host's word is not an
    image's), only at the refused value (jemalloc is not tcmalloc), and only until a later
    run there applied it."""
    pip = "pytorch-2.13.0-cpu"
    compiled = ("torch.compile:default", 2, "glibc", "fp32")
    failed = row("mnist-cnn", *compiled, 1.0, micro="x86_64_v3") | {
        "status": "failed", "failed_knob": "compiler", "s_per_step": None,
        "error": "InductorError: no vector ISA", "run_id": "avx2-run"}
    refused = row("mnist-cnn", "off", 2, "tcmalloc", "fp32", 0.05) | {
        "image": pip, "not_applied": "allocator", "run_id": "pip-run",
        "recorded_at": "2026-11-23T00:00:00+00:00",
        "raw": json.dumps({"not_applied": {"allocator": "tcmalloc is not loaded"}})}
    data = pd.concat([synthetic(), pd.DataFrame([failed, refused])], ignore_index=True)
    predictor = predictor_for(data)

    def not_offered(req):
        notes = make_plan(req, predictor=predictor, run_id="p").plan.notes
        return [n for n in notes if n.startswith("not offered:")]

    def label(compiler, threads, alloc, prec, image=pip):
        return f"{image} compiler={compiler} threads={threads} alloc={alloc} prec={prec}"

    assert not_offered(mnist_request()) == []  # zen4, on the host
    v3 = not_offered(mnist_request(microarchitecture="x86_64_v3"))
    assert len(v3) == 1 and v3[0].startswith(f"not offered: {label(*compiled)}: failed when "
                                             "run here (avx2-run, under the knob compiler)")
    # nor does the host's say anything of an image
    assert not_offered(mnist_request(microarchitecture="x86_64_v3",
                                     container_runtime="podman")) == []
    in_pip = not_offered(mnist_request(container_runtime="podman"))
    assert in_pip and all("alloc=tcmalloc" in n and "tcmalloc is not loaded" in n
                          for n in in_pip), in_pip
    assert any(label("off", 1, "tcmalloc", "bf16") in n for n in in_pip)
    # tcmalloc installed in the image: the next run there applied it
    applied = refused | {"not_applied": None, "recorded_at": "2026-11-24T00:00:00+00:00",
                         "raw": json.dumps({})}
    predictor = predictor_for(pd.concat([data, pd.DataFrame([applied])], ignore_index=True))
    assert not_offered(mnist_request(container_runtime="podman")) == []


def test_threads_the_script_sets_itself_withhold_their_configurations_but_not_stocks():
    """A script that sets its own threads: a run at 1 thread of 2 cores found the knob not
    applied, so the next plan withholds configurations at 1 thread (their trials would
    measure the script's count).  Stock's run at all cores found it not applied too (every
    run has the script's count): stock and the other configurations at all cores stay
    offered."""
    why = "the script sets 2 thread(s) itself (torch.set_num_threads), over MODAK's 1"

    def refused(threads, when):
        return row("mnist-cnn", "off", threads, "glibc", "fp32", 0.05) | {
            "not_applied": "threads", "run_id": f"own-{threads}",
            "recorded_at": f"2026-11-23T00:00:0{when}+00:00",
            "raw": json.dumps({"not_applied": {"threads": why}})}
    data = pd.concat([synthetic(), pd.DataFrame([refused(1, 1), refused(2, 2)])],
                     ignore_index=True)
    plan = make_plan(mnist_request(), predictor=predictor_for(data), run_id="p").plan
    withheld = [n for n in plan.notes if n.startswith("not offered:")]
    assert withheld and all(" threads=1 " in n and f"threads=1 was not applied to this "
                            f"script here: {why}" in n for n in withheld), withheld
    offered = [c.configuration for c in plan.candidates]
    assert offered and {c.threads for c in offered} == {2}
    assert any(c.compiler is None and c.precision.value == "fp32"
               and c.allocator.value == "glibc" for c in offered)
    # a search's trial of one (planned before the refusal) is told why it is no candidate
    one = next(Configuration(**{**c.configuration.model_dump(), "threads": 1})
               for c in plan.candidates)
    with pytest.raises(InputError, match=r"is not a candidate of this request \(not offered: "
                       r"threads=1 was not applied to this script here: the script sets 2"):
        make_plan(mnist_request(), predictor=predictor_for(data), run_id="p", force=one)


def test_a_script_that_compiles_itself_is_offered_no_compiled_configuration():
    """A stock run whose script compiled its model itself (the runtime's
    ``effect.script_compile``): the next plan offers no configuration with MODAK's compiler,
    there or on any other target or image (its trial would only find the knob not applied),
    stock and the uncompiled ones stay; a later run whose script no longer compiles lifts
    it."""
    def stock(when, **effect):
        return row("mnist-cnn", "off", 2, "glibc", "fp32", 0.05) | {
            "run_id": f"own-{when}", "recorded_at": f"2026-11-23T00:00:0{when}+00:00",
            "raw": json.dumps({"effect": {"compiled": bool(effect), **effect}})}
    data = pd.concat([synthetic(), pd.DataFrame([stock(1, script_compile="torch.compile")])],
                     ignore_index=True)
    plan = make_plan(mnist_request(), predictor=predictor_for(data), run_id="p").plan
    withheld = [n for n in plan.notes if n.startswith("not offered:")]
    assert withheld and all("compiler=torch.compile" in n and "was not applied to this script "
                            "here: the script compiles its model itself (torch.compile)" in n
                            for n in withheld), withheld
    offered = [c.configuration for c in plan.candidates]
    assert offered and all(c.compiler is None for c in offered)
    assert any(c.precision.value == "fp32" and c.allocator.value == "glibc" for c in offered)
    # (the script compiles itself wherever it runs: in an image too, on another CPU)
    elsewhere = make_plan(mnist_request(container_runtime="podman",
                                        microarchitecture="x86_64_v3"),
                          predictor=predictor_for(data), run_id="p").plan
    assert all(c.configuration.compiler is None for c in elsewhere.candidates)
    later = pd.concat([data, pd.DataFrame([stock(2)])], ignore_index=True)
    plan = make_plan(mnist_request(), predictor=predictor_for(later), run_id="p").plan
    assert not [n for n in plan.notes if n.startswith("not offered:")]
    assert any(c.configuration.compiler is not None for c in plan.candidates)


def test_a_failure_the_script_is_to_blame_for_withholds_no_configuration():
    """A round whose every trial failed the same way (a file the run directory lacked):
    stock failed first, then the candidates, the runtime blaming no knob.  None of them is
    withheld from the next plan, stock above all (the search's choice then, and the run
    after the fix needs it).  A candidate that failed on its own after stock ran, or that
    the runtime blamed on its knob, still is."""
    compiled = ("torch.compile:default", 2, "glibc", "fp32")
    bf16 = ("off", 2, "glibc", "bf16")
    missing = {"status": "failed", "failed_knob": None, "s_per_step": None,
               "steps_per_s": None, "error": "FileNotFoundError: no such file: data.npz"}

    def at(when, *config, **extra):
        return row("mnist-cnn", *config, 1.0) | {
            "recorded_at": f"2026-11-23T00:00:{when:02d}+00:00", "run_id": f"r{when}",
            **missing, **extra}

    def not_offered(*rows):
        data = pd.concat([synthetic(), pd.DataFrame(list(rows))], ignore_index=True)
        notes = make_plan(mnist_request(), predictor=predictor_for(data), run_id="p").plan.notes
        return [n for n in notes if n.startswith("not offered:")]

    stock = at(1, "off", 2, "glibc", "fp32")
    assert not_offered(stock, at(2, *compiled), at(3, *bf16)) == []
    # the candidate failed after stock ran (its own failure, whatever the runtime said)
    ok = at(1, "off", 2, "glibc", "fp32") | {"status": "ok", "s_per_step": 0.05,
                                             "error": None}
    own = not_offered(ok, at(2, *compiled))
    assert len(own) == 1 and "compiler=torch.compile:default" in own[0] \
        and "failed when run here (r2)" in own[0], own
    # blamed on its knob by the runtime: withheld even in a round where stock failed too
    blamed = not_offered(stock, at(2, *compiled, failed_knob="compiler"))
    assert len(blamed) == 1 and "under the knob compiler" in blamed[0], blamed
    # stock's failure alone withholds nothing, and a later success lifts a candidate's
    assert not_offered(stock) == []
    assert not_offered(ok, at(2, *compiled), at(3, *compiled) | {
        "status": "ok", "s_per_step": 0.05, "error": None}) == []
