"""Each workload family held out of the model in turn: plan it cold, search, compare.

    .venv/bin/python benchmarks/transfer_search.py [--data CSV ...]
        [--family F ... | --framework pytorch|keras|all] [--target 2c]
        [--job-steps 5000 | --job-minutes M] [--budget 0.1] [--repeats 3]
        [--estimators linear,linear-main,gbr-split,extra-trees] [--trial-overhead S]

For each family of ``--framework`` (``benchmarks/families/``, batch variant 0: the PyTorch
ones by default; a Keras one searches its own grid, XLA in place of ``torch.compile``, and
is held out of the model with its PyTorch twin, the same workload) on one target of this
machine (described by this machine's campaign runs where the campaign ran the family here, else by
its own probe, run once, and its microarchitecture; its grid's best taken from this
machine's runs where the campaign ran the cell's grid here, not only a stock run, else from
the campaign's runs on machines of the same target, the same microarchitecture and cores,
or where it has none, on every machine: the table says which):

1. **cold plan**: the model is fitted on the shipped datasets (the transfer campaign
   among them) and ``--data`` *without* that family (the estimators of ``--estimators``,
   by default those of the refit after a deploy, the better on held-out families kept, as
   ``modak model fit`` does); it ranks every candidate from the family's
   fingerprint (as its first run measures it) and the target's probe;
2. **search**: the budgeted successive-halving search (``modak_lib.perf.search``) over the
   model's top three candidates and stock, with real short trials of the script through
   the runtime, within ``--budget`` of the job's expected time (``--job-steps`` at stock's
   predicted speed, or ``--job-minutes`` of it: a Keras family's steps take 5-60 ms here,
   and 5000 of them buy no trial), its first round cut to the trials the budget affords as
   the deploy cuts it (``--trial-overhead`` seconds a trial, by default a Python process
   starting the script: 2.5 s with PyTorch, 4 s with Keras, plus its steps at stock's
   predicted speed);
3. **compare**, interleaved and repeated: stock, MODAK's final choice and the best
   configuration of the campaign's grid for that cell, each for ``--steps`` steps through the
   runtime, with the job time (warm-up + job steps x s/step) and the final loss.

It prints, per family, each trial (its round, steps, seconds and step time), the
verdicts and each side-by-side run (step time, warm-up), then one table: the family, what
was chosen, the trial cost, the three job times, and how much of the machine went to
other work during its runs (the campaign's ``Disturbance``: a figure measured beside other
work is not of its configuration alone).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import transfer_campaign as tc  # noqa: E402

from modak_lib.models import Allocator, Configuration, Precision  # noqa: E402
from modak_lib.perf.fit import QUICK_ESTIMATORS, fit, model_predictor  # noqa: E402
from modak_lib.perf.search import (Trial, first_round, job_seconds, search,  # noqa: E402
                                   time_capped)
from modak_lib.report import table_lines  # noqa: E402
from modak_lib.results import load_frame  # noqa: E402

# the catalogue's image of each framework (a label here: the runs use this machine's Python)
IMAGES = {"pytorch": "pytorch-2.13.0-cpu", "keras": "keras-3.15.1-cpu"}


def config_of(label: str, cores: int, framework: str = "pytorch") -> Configuration:
    env = tc.CONFIGS[label]
    compiler = "torch.compile:default" if "MODAK_TORCH_COMPILE" in env else \
        "xla" if "MODAK_JIT_COMPILE" in env else None
    return Configuration(
        image=IMAGES[framework], compiler=compiler,
        threads=int(env.get("MODAK_THREADS", cores)),
        allocator=Allocator(env.get("MODAK_ALLOCATOR", "glibc")),
        precision=Precision(env.get("MODAK_PRECISION", "fp32")))


def label_of(c: Configuration, cores: int) -> str:
    return next(k for k in tc.CONFIGS for fw in IMAGES if config_of(k, cores, fw) == c)


BUSY: list[float] = []  # each run's share of the machine that went to other work


def trial(family: str, target: str, c: Configuration, steps: int, cores: int,
          seconds: float | None = None) -> Trial:
    with tc.Disturbance() as d:
        rec = tc.run_one(family, 0, target, label_of(c, cores), steps, seconds)
    if d.share is not None:
        BUSY.append(d.share)
    m = rec["metrics"]
    failed = None if rec["status"] != "failed" and m.get("s_per_step") else \
        (rec.get("error") or {}).get("message") or rec["status"]
    return Trial(c, int(m.get("steps") or steps), m.get("s_per_step"),
                 float(m.get("warmup_s") or 0.0), float(m.get("wall_s") or 0.0),
                 m.get("final_loss"), failed,
                 capped=time_capped(failed, rec.get("error")),
                 startup_s=float(m.get("startup_s") or 0.0), end_loss=m.get("end_loss"),
                 start_loss=m.get("start_loss"), losses=m.get("losses") or (),
                 # (the trial's cost is the runtime's clock here: nothing outside it)
                 runtime_s=float(m.get("wall_s") or 0.0))


def this_machine(target: str) -> dict:
    """A target of this machine as the model describes it, for a machine the campaign never
    ran on: its probe's figures (``transfer_campaign.probe``, a few seconds) and its
    microarchitecture (the target's own where it names one, else archspec's name of this
    host); not another machine's, whose figures (native bf16 or not) may be far off."""
    import archspec.cpu

    from modak_lib.perf.features import TARGET_FIGURES

    probe = tc.probe(target)
    micro = tc.TARGETS[target][2] or archspec.cpu.host().name
    print(f"this machine ({micro}, campaign never ran here), target {target}: fp32 "
          f"{probe.get('gflops_fp32')} GFLOP/s, bf16 {probe.get('gflops_bf16')}, "
          f"{probe.get('bandwidth_gbs')} GB/s", flush=True)
    return {"microarchitecture": micro, "accelerator": tc.accelerator_model(probe),
            **{k: float(probe[k]) if probe.get(k) else None for k in TARGET_FIGURES}}


def cells(df, family: str, target: str, boot: str | None, cores: int,
          micro: str | None = None):
    """The campaign's runs of a family at its first batch on ``target`` in its own framework
    (a PyTorch family's Keras twin's, recorded under the same workload name, left out), as
    ``(described, grid, where)``: the runs that describe the family and the target (this
    machine's, ``boot``, where it has any: its probe's figures), and those whose
    configurations' medians give the grid's best, with where they ran: ``here`` where this
    machine ran the cell's grid (more than one configuration: a lone stock run, which ties
    a machine's speed to the others', is not a grid), else ``like``, other machines of the
    same microarchitecture (this machine's, or ``micro`` where it has no run) and cores,
    else ``all``.  Empty frames where the campaign has no such runs."""
    cell = df[df["run_id"].astype(str).str.startswith(f"transfer/{family}/b0/{target}/")]
    if "framework" in cell:
        cell = cell[cell["framework"].astype(str) == tc.framework_of(family)]
    # (rows that record no boot are no machine's in particular: none of them is this one's)
    mine = (cell["boot_id"] == boot) if "boot_id" in cell else cell["run_id"].isna()
    here = cell[mine]
    if here["run_id"].nunique() > 1:
        return here, here, "here"
    if len(here):
        micro = here.iloc[0]["microarchitecture"]
    others = cell[~mine]
    like = others[(others["microarchitecture"] == micro)
                  & (others["cores"].astype(float) == float(cores))]
    grid, where = (like, "like") if len(like) else (others, "all")
    return (here if len(here) else cell), grid, where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", default=[],
                    help="a campaign's CSV besides the shipped datasets")
    ap.add_argument("--family", action="append", choices=sorted(tc.FAMILIES))
    ap.add_argument("--framework", choices=["pytorch", "keras", "all"], default="pytorch",
                    help="the families searched where --family names none")
    ap.add_argument("--target", default="2c", choices=sorted(tc.TARGETS))
    job = ap.add_mutually_exclusive_group()
    job.add_argument("--job-steps", type=int, default=5000)
    job.add_argument("--job-minutes", type=float,
                     help="the job's length in minutes at stock's predicted speed, in place "
                          "of --job-steps (a family's steps differ 10x in time)")
    ap.add_argument("--estimators", default=",".join(QUICK_ESTIMATORS))
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trial-overhead", type=float,
                    help="seconds a trial costs besides its steps, for the first round's cut "
                         "(by default a Python process starting the script: 2.5 for "
                         "PyTorch, 4 for Keras, whose TensorFlow takes 2.5-3 s to start; the "
                         "deploy's default, through the job path, is 10)")
    a = ap.parse_args()
    df = load_frame(None, extra=a.data)
    cores = tc.cores_of(a.target)
    families = a.family or [f for f in tc.FAMILIES
                            if a.framework in ("all", tc.framework_of(f))]
    rows = []
    machine = None  # this machine's description, probed once where the campaign never ran here
    for family in families:
        BUSY.clear()
        framework, workload = tc.framework_of(family), tc.workload_of(family)
        labels = tc.configs_for(a.target, family)
        described, cell, grid = cells(df, family, a.target, tc.boot_id(), cores)
        if described.empty:
            print(f"{family}: not in the campaign's data on {a.target}; skipped", flush=True)
            continue
        rec = described.iloc[0].to_dict()  # the family's fingerprint and the target's figures
        if "boot_id" not in described or not (described["boot_id"] == tc.boot_id()).any():
            if machine is None:  # a machine the campaign never ran on: its own probe
                machine = this_machine(a.target)
            rec.update(machine)
            described, cell, grid = cells(df, family, a.target, tc.boot_id(), cores,
                                          machine["microarchitecture"])
        # the family held out in both frameworks (a Keras twin is the same workload)
        others = df[df["workload"] != workload]
        model = fit(others, estimators=a.estimators.split(","))
        configs = [config_of(k, cores, framework) for k in labels]
        stock = config_of("stock", cores, framework)
        predictor = model_predictor(model, others)
        preds = {c: predictor.formula({**rec, **{
            "compiler": c.compiler or "off", "threads": c.threads,
            "allocator": c.allocator.value, "precision": c.precision.value,
            "channels_last": 0, "onednn": 1}}) for c in configs}
        ranked = sorted(configs, key=lambda c: preds[c])
        per_step = 2.718281828 ** preds[stock]
        job_steps = round(a.job_minutes * 60 / per_step) if a.job_minutes else a.job_steps
        budget = a.budget * job_steps * per_step
        overhead = a.trial_overhead if a.trial_overhead is not None else \
            {"pytorch": 2.5, "keras": 4.0}[framework]
        print(f"== {family}: the {model.name} model (held-out families' MAPE "
              f"{model.card.held_out_mape.get(model.name, float('nan')):.0%}) ranks "
              f"{[label_of(c, cores) for c in ranked[:3]]}, a job of {job_steps} steps, "
              f"budget {budget:.0f} s", flush=True)
        out = search(first_round([(c, False) for c in ranked], 3, stock), stock,
                     lambda c, n, cap: trial(family, a.target, c, n, cores, cap),
                     job_steps=job_steps, budget_s=budget, first_steps=8,
                     budget_fraction=a.budget, trial_overhead_s=overhead,
                     s_per_step=per_step)
        best_label = cell.groupby("run_id")["s_per_step"].median().idxmin().split("/")[-1]
        compare = {"stock": stock, "chosen": out.chosen,
                   "grid best": config_of(best_label, cores, framework)}
        # each distinct configuration runs once per repeat (a choice that is stock, or the
        # grid's best, is the same runs: two measurements of one configuration would only
        # show the noise as a speed-up)
        distinct = list(dict.fromkeys(compare.values()))
        times: dict[Configuration, list[float]] = {c: [] for c in distinct}
        losses: dict[Configuration, list[float]] = {c: [] for c in distinct}
        runs: list[str] = []
        for r in range(a.repeats):
            for c in distinct:
                t = trial(family, a.target, c, a.steps, cores)
                times[c].append(job_seconds(t, job_steps))
                runs.append(f"   compared, repeat {r + 1}: {label_of(c, cores)}, " + (
                    f"{t.s_per_step:.4g} s/step, warm-up {t.warmup_s:.1f} s"
                    if t.s_per_step else f"failed: {t.failed}"))
                if t.final_loss is not None:
                    losses[c].append(t.final_loss)
        med = {k: statistics.median(times[c]) for k, c in compare.items()}
        losses = {k: losses[c] for k, c in compare.items()}
        rows.append([family, model.name, label_of(ranked[0], cores),
                     label_of(out.chosen, cores),
                     best_label + {"here": "", "like": " (like)", "all": " (all)"}[grid],
                     f"{out.spent_s:.0f}/{out.budget_s:.0f} s", str(job_steps),
                     f"{med['stock']:.0f}",
                     f"{med['chosen']:.0f}", f"{med['grid best']:.0f}",
                     f"{med['stock'] / med['chosen']:.2f}x",
                     f"{med['stock'] / med['grid best']:.2f}x",
                     f"{statistics.median(losses['chosen']) if losses['chosen'] else '-':.4}"
                     if losses["chosen"] else "-",
                     f"{max(BUSY):.0%}" if BUSY else "-"])
        print(out.summary(), flush=True)
        for t in out.trials:  # what each trial cost (the runtime's clock) and measured
            print(f"   round {t.round}: {label_of(t.configuration, cores)}, {t.steps} steps, "
                  f"{t.wall_s:.1f} s, " + (f"{t.s_per_step:.4g} s/step" if t.s_per_step
                                           else f"failed: {t.failed}"), flush=True)
        for name, why in out.verdicts.items():  # (keyed by Configuration.label())
            print(f"   {name.split(' ', 1)[-1]}: {why}", flush=True)
        print("\n".join(runs), flush=True)  # the side-by-side runs, in the order they ran
    print("\n".join(table_lines(rows, [
        "family (held out)", "model", "model's first", "MODAK chose", "grid best", "trials",
        "job steps", "stock s", "chosen s", "best s", "chosen vs stock", "best vs stock",
        "chosen loss",
        "busy elsewhere"])))
    print("grid best: of this machine's campaign runs; (like): of other machines of this "
          "target (the same microarchitecture and cores), the campaign never ran its grid "
          "here; (all): of every machine, the campaign never ran on this target")
    print("busy elsewhere: the most of the machine's CPU (the host's steal included) that went "
          "to anything but the family's runs during one of them; over 10% (the campaign's "
          "--max-busy), its figures are not of the configurations alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
