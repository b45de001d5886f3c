"""The planner: request (+ catalogue, + optional performance model) -> decision.

It enumerates the candidate configurations that the catalogue allows on the
target (image x compiler x threads x allocator x precision), asks a predictor
for their times when one is given, and ranks them.  Without predictions it
falls back to a documented prior:

1. the image with the highest catalogue score (its breakdown is reported);
2. the graph compilers the user asked for switched on (the user's explicit
   request is the only evidence there is before anything was measured);
3. framework defaults for everything else: all cores of the task as threads,
   glibc malloc, fp32.

The planner touches no files and no network: it returns plain data.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from .catalogue import Catalogue, Match, load_catalogue, select_images, wanted_accelerator
from .errors import InputError
from .models import (Allocator, Candidate, Compiler, Configuration, Framework, JobRequest,
                     Launcher, Precision, Prediction, Runtime, StepLosses, compiler_id)
from .perf.search import (MIN_GAIN, clears_margin, first_round, job_time, scatter_gain,
                          wall_steps)
from .schedulers import SCHEDULERS, Resources
from .workload import wrappable

MAX_IMAGES = 3  # image variants considered per plan (best catalogue scores)


class Predictor(Protocol):
    """What the performance model offers the planner."""

    notes: list[str]  # what the last predict() call has to say (shown with the plan)

    def predict(self, request: JobRequest, configs: Sequence[Configuration]
                ) -> list[Optional[Prediction]]:
        """A prediction per configuration, or None where the model cannot say."""

    def exclusions(self, request: JobRequest, configs: Sequence[Configuration]
                   ) -> list[Optional[str]]:
        """Per configuration, why it must not be offered (a knob that cannot be applied to
        this workload, a configuration it failed under), or None."""

    def job_steps(self, request: JobRequest) -> Optional[tuple[int, Optional[str]]]:
        """The steps the request's job made when it last ran in full under the same script
        and arguments, and that run's id; None when it never did."""

    def steps_per_epoch(self, request: JobRequest) -> Optional[int]:
        """The optimizer steps an epoch of the request's workload makes, as measured; None
        when no run measured them."""


AUTOTUNE_K = 3  # candidates a proposed autotuning trial runs (and stock)
LOSS_TOLERANCE = 0.05  # a measured loss worse than stock's by more than this changes the result


@dataclass(frozen=True)
class Decision:
    chosen: Configuration
    candidates: tuple[Candidate, ...]
    decided_by: str
    autotune: tuple[Configuration, ...]
    search: bool
    match: Match
    matches: tuple[Match, ...]
    resources: Resources
    runtime: Runtime
    launcher: Launcher
    inner_launcher: Launcher
    notes: tuple[str, ...]
    # the optimizer steps the job will run as stated or measured (not a wall-time guess)
    known_steps: Optional[int] = None


# ---------------------------------------------------------------------------
def choose_runtime(request: JobRequest) -> Runtime:
    if request.target.container_runtime is not None:
        return request.target.container_runtime
    # as in the seed paper (Singularity): an HPC scheduler gets Apptainer
    return Runtime.apptainer if request.target.scheduler != "local" else Runtime.none


def rank_layout(request: JobRequest) -> tuple[int, int]:
    """(nodes, tasks per node) of the request's job: its ranks are their product."""
    nodes = request.job.node_count
    return nodes, max(request.job.process_count_per_node,
                      -(-request.application.mpi_ranks // nodes))


def resources(request: JobRequest) -> Resources:
    job, app, target = request.job, request.application, request.target
    nodes, tasks = rank_layout(request)
    # (a batch scheduler would hold such a job pending for good: modak_job's "stuck")
    if nodes > 1 and target.scheduler == "local":
        raise InputError([("job.node_count", f"{nodes} nodes asked for, but a target without "
                           "a scheduler is one host")], request.source)
    if target.nodes is not None and nodes > target.nodes:
        raise InputError([("job.node_count", f"{nodes} nodes exceed the target's nodes "
                           f"{target.nodes}")], request.source)
    if job.core_count is not None:
        if job.core_count % (nodes * tasks):
            raise InputError([("job.core_count", f"{job.core_count} cores do not divide into "
                               f"{nodes} node(s) x {tasks} task(s)")], request.source)
        cpus = job.core_count // (nodes * tasks)
    else:
        cpus = max(1, target.cores_per_node // tasks)
    if tasks * cpus > target.cores_per_node:
        raise InputError([("job.core_count", f"{tasks} task(s) x {cpus} core(s) per node exceed "
                           f"the target's cores_per_node {target.cores_per_node}")],
                         request.source)
    if app.threads is not None and app.threads > cpus:
        raise InputError([("application.threads", f"{app.threads} threads exceed the "
                           f"{cpus} core(s) of each task")], request.source)
    gpus = 0
    if wanted_accelerator(request) != "none" and target.accelerators is not None:
        gpus = job.request_gpus if job.request_gpus is not None else target.accelerators.count
        if gpus > target.accelerators.count:
            raise InputError([("job.request_gpus", f"{gpus} GPUs requested, the target's nodes "
                               f"have {target.accelerators.count}")], request.source)
    elif job.request_gpus:
        raise InputError([("job.request_gpus", "GPUs requested but the target declares no "
                           "accelerators")], request.source)
    partition = job.partition or job.queue or (target.partitions[0] if target.partitions else None)
    if partition and target.partitions and partition not in target.partitions:
        raise InputError([("job.partition", f"{partition!r} is not one of the target's "
                           f"partitions {list(target.partitions)}")], request.source)
    problems = SCHEDULERS[target.scheduler].job_problems(job)
    if problems:
        raise InputError(problems, request.source)
    stdout = job.standard_output_file or f"{job.job_name}.out"
    stderr = None if job.combine_stdout_stderr else job.standard_error_file
    return Resources(nodes=nodes, tasks_per_node=tasks, cpus_per_task=cpus, gpus_per_node=gpus,
                     walltime_s=job.wall_time_limit, memory_gb=job.memory_gb,
                     partition=partition, stdout=stdout, stderr=stderr)


def choose_launchers(request: JobRequest, res: Resources) -> tuple[Launcher, Launcher]:
    """(outer, inner): outer starts the container(s), inner runs inside one."""
    spec = SCHEDULERS[request.target.scheduler]
    ranks = res.nodes * res.tasks_per_node
    if request.application.framework == Framework.pytorch and res.tasks_per_node > 1 \
            and res.nodes == 1:
        return Launcher.none, Launcher.torchrun
    if ranks > 1 or spec.launch_single:
        return spec.launcher, Launcher.none
    return Launcher.none, Launcher.none


def _bf16_ok(request: JobRequest, cat: Catalogue) -> bool:
    target = request.target
    if wanted_accelerator(request) == "nvidia":
        model = target.accelerators.model if target.accelerators else None
        gpu = cat.gpus.get(model) if model else None
        return bool(gpu and gpu.cuda_arch and float(gpu.cuda_arch) >= 8.0)
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(target.cpu_features))


def enumerate_configurations(request: JobRequest, matches: Sequence[Match], res: Resources,
                             cat: Catalogue) -> list[Configuration]:
    opt, app = request.optimisation, request.application
    threads = [app.threads] if app.threads else sorted({res.cpus_per_task,
                                                        max(1, res.cpus_per_task // 2)},
                                                       reverse=True)
    configs = []
    runtime_applies = wrappable(app)
    for m in matches[:MAX_IMAGES]:
        v = m.variant
        compilers: list[Optional[str]] = [None]
        for c in opt.compilers:
            if c in v.compilers and runtime_applies:
                if c == Compiler.torch_compile:
                    modes = opt.compiler_modes or ("default",)
                    compilers += [compiler_id(c, mode) for mode in modes]
                else:
                    compilers.append(c.value)
        allocators = [Allocator.glibc] + [a for a in v.allocators
                                          if not opt.allocators or a in opt.allocators]
        precisions = [Precision.fp32]
        if opt.allow_reduced_precision and _bf16_ok(request, cat) and \
                Precision.bf16 in v.precisions and runtime_applies:
            precisions.append(Precision.bf16)
        for comp, t, alloc, prec in itertools.product(compilers, threads, allocators, precisions):
            configs.append(Configuration(image=v.id, compiler=comp, threads=t, allocator=alloc,
                                         precision=prec))
    return configs


def _prior_key(cfg: Configuration, scores: dict[str, float], requested: set[str],
               default_threads: int) -> tuple:
    kind = cfg.compiler_kind
    compiler_penalty = 0 if ((kind and kind.value in requested) or
                             (not kind and not requested)) else 1
    return (-scores[cfg.image], compiler_penalty, cfg.threads != default_threads,
            cfg.allocator != Allocator.glibc, cfg.precision != Precision.fp32, cfg.label())


def _prior_reason(cfg: Configuration, best: Configuration, scores: dict[str, float],
                  requested: set[str], default_threads: int) -> str:
    if cfg.image != best.image:
        return f"image score {scores[cfg.image]:g} < {scores[best.image]:g} ({best.image})"
    if cfg.compiler != best.compiler:
        if best.compiler:
            return f"prior: the user asked for {best.compiler_kind.value}; not measured yet"
        return "prior: no graph compiler requested; not measured yet"
    if cfg.threads != best.threads:
        return f"prior: {default_threads} threads (all cores of the task); not measured yet"
    if cfg.allocator != best.allocator:
        return f"prior: framework default allocator glibc; {cfg.allocator.value} not measured yet"
    if cfg.precision != best.precision:
        return f"prior: fp32 unless measured faster; {cfg.precision.value} not measured yet"
    return "same as chosen"


def stock_configuration(configs: Sequence[Configuration], scores: dict[str, float],
                        cpus: int) -> Optional[Configuration]:
    """The framework's defaults on the best-scored image: no compiler, all the task's
    cores, glibc malloc, fp32 (what a user's plain run is)."""
    plain = [c for c in configs if c.compiler is None and c.allocator == Allocator.glibc
             and c.precision == Precision.fp32 and c.threads == cpus]
    return max(plain, key=lambda c: scores[c.image], default=None)


def _with_stock(trials: tuple[Configuration, ...], stock: Optional[Configuration]
                ) -> tuple[Configuration, ...]:
    """Trials always measure stock too: every choice is compared with it."""
    return trials if stock is None or stock in trials else trials + (stock,)


def known_steps(request: JobRequest, measured: Optional[tuple[int, Optional[str]]],
                per_epoch: Optional[int] = None) -> Optional[tuple[int, str]]:
    """The optimizer steps the job will run as far as they are known, and where that figure
    comes from: the application's ``steps``; else its ``epochs`` times the steps an epoch of
    it makes as its runs measured them (``per_epoch``); else the steps its last full run
    under the same script and arguments made (``measured``: steps, run id); None when none
    of these."""
    app = request.application
    if app.steps:
        return app.steps, "stated by the application's steps"
    if app.epochs and per_epoch:
        return app.epochs * per_epoch, (f"the application's {app.epochs} epoch(s) of "
                                        f"{per_epoch} steps, as its runs measured an epoch")
    if measured:
        steps, run = measured
        return steps, ("as its last full run under these arguments made"
                       + (f" ({run})" if run else ""))
    return None


def planned_steps(res: Resources, stock: Optional[Prediction],
                  known: Optional[tuple[int, str]]) -> tuple[Optional[int], str]:
    """The steps the job is ranked by, and where they come from: the ``known`` ones
    (:func:`known_steps`), else as many as its wall time holds at stock's speed (an upper
    bound: a job that stops sooner makes a compiler's warm-up weigh more); (None, "") when
    neither."""
    if known:
        return known
    steps = wall_steps(res.walltime_s, stock.seconds if stock is not None else None)
    if steps:
        return (steps, f"as many as its wall time ({res.walltime_s:g} s) holds at stock's "
                "predicted speed: the application states no steps and never ran in full")
    return None, ""


def job_seconds(p: Prediction, steps: Optional[int]) -> float:
    """A candidate's time for the job (``search.job_time``): its warm-up once (measured)
    and its steps; per step when the job's length is unknown."""
    return job_time(p.seconds, p.warmup_s or 0.0, steps)


def _job_time(p: Prediction, steps: Optional[int]) -> str:
    """The job's time, with the warm-up it counts, for a candidate's reason: empty where
    the job's length is unknown or the candidate has no warm-up."""
    if not steps or not p.warmup_s:
        return ""
    return f", the job {job_seconds(p, steps):.3g} s with its warm-up {p.warmup_s:.3g} s"


def _by_steps(p: Prediction) -> dict[int, StepLosses]:
    """A measured prediction's losses by the steps its runs made (its pooled figures as
    one entry where it has none by steps: a predictor that gives only those)."""
    if p.losses:
        return {x.steps: x for x in p.losses}
    n = p.steps or 0
    return {n: StepLosses(steps=n, loss=p.loss, end_loss=p.end_loss, start_loss=p.start_loss)}


def _loss_pairs(p: Optional[Prediction], stock: Optional[Prediction]
                ) -> list[tuple[StepLosses, StepLosses]]:
    """``p``'s runs' losses beside stock's after as many steps (a round of a search's
    trials, a job of the same length), where both are measured: their losses compare
    (``perf.search.changes_result``); a run never compares with a longer or shorter one."""
    if p is None or not p.measured or stock is None or not stock.measured:
        return []
    mine, ref = _by_steps(p), _by_steps(stock)
    return [(mine[n], ref[n]) for n in sorted(mine) if n in ref]


def _has_loss(x: StepLosses) -> bool:
    return x.loss is not None or x.end_loss is not None


def _diverged(p: Optional[Prediction]) -> Optional[str]:
    """Where a measured prediction's runs ended some number of steps with a loss that is
    not finite (``results.DIVERGED``): what it was, and after how many steps (None where
    none did).  A job's loss can blow up long after its trials, which compared it with
    stock's after their few steps; no run of stock as long compares with it."""
    if p is None or not p.measured:
        return None
    for x in sorted(_by_steps(p).values(), key=lambda x: x.steps):
        for v in (x.loss, x.end_loss):
            if v is not None and not math.isfinite(v):
                return (f"its loss was {v} after {x.steps} steps, and no run of stock's "
                        "lost its loss: it changes the result")
    return None


def _reject_changed_results(configs: Sequence[Configuration],
                            predictions: list[Optional[Prediction]],
                            stock: Optional[Configuration]):
    """Measured candidates whose loss was worse than stock's after as many steps beyond
    LOSS_TOLERANCE, at any number of steps both ran, lose their prediction: a speed-up
    that changes the result is none.  So do those whose loss was not finite after any
    number of steps, where stock's never was (:func:`_diverged`)."""
    from .perf.search import Trial, changes_result

    by_config = dict(zip(configs, predictions))
    base = by_config.get(stock) if stock is not None else None
    out, rejected = [], []
    stock_diverged = _diverged(base) is not None
    for cfg, p in zip(configs, predictions):
        why = _diverged(p) if cfg != stock and not stock_diverged else None
        for mine, ref in (_loss_pairs(p, base) if cfg != stock and not why else ()):
            why = changes_result(
                Trial(cfg, mine.steps, p.seconds, final_loss=mine.loss, end_loss=mine.end_loss),
                Trial(stock, ref.steps, base.seconds, final_loss=ref.loss,
                      end_loss=ref.end_loss, start_loss=ref.start_loss), LOSS_TOLERANCE)
            if why:
                break
        out.append(None if why else p)
        if why:
            rejected.append((cfg, why))
    return out, rejected


def _unchecked_precision(predicted: list[tuple[Configuration, Prediction]],
                         stock: Optional[Prediction]):
    """Where the fastest predicted candidate reduces precision and nothing measured shows
    that it keeps this script's loss (a run of it and one of stock after the same steps,
    compared within LOSS_TOLERANCE by ``_reject_changed_results``; or neither with a loss,
    a script whose loss the runtime cannot see, which the search takes as it is too): the
    fastest candidate that keeps fp32 or was so checked, and a note on why it goes first;
    else None.  A prediction of speed says nothing of the loss: bf16 autocast applied
    eagerly to a transformer script trained to a far worse one here.  Trials (autotuning)
    check it."""
    def checked(p: Prediction) -> bool:
        pairs = _loss_pairs(p, stock)
        # (compared after as many steps: one that changed the result has no prediction
        # by now; or neither has a loss at all)
        return any(_has_loss(a) and _has_loss(b) for a, b in pairs) or \
            (bool(pairs) and p.loss is None and stock.loss is None)

    fastest, p = predicted[0]
    if fastest.precision == Precision.fp32 or checked(p):
        return None
    keep = next((c for c, q in predicted
                 if c.precision == Precision.fp32 or checked(q)), None)
    if keep is None:
        return None
    return keep, (f"{fastest.label()} is predicted fastest but not chosen: nothing measured "
                  f"shows that its {fastest.precision.value} keeps this script's loss (a run "
                  "of it beside stock's after the same steps); autotuning's trials check it, "
                  "and reject it if the loss is worse than stock's by more than "
                  f"{LOSS_TOLERANCE:.0%}")


def _to_front(ranked: list[tuple[Configuration, Optional[Prediction]]],
              cfg: Configuration) -> bool:
    """Move ``cfg``'s (configuration, prediction) to the front of ``ranked``, the others
    kept in their order; False where it is not there."""
    index = next((i for i, (c, _) in enumerate(ranked) if c == cfg), None)
    if index is not None:
        ranked.insert(0, ranked.pop(index))
    return index is not None


def _needed(pred: Optional[Prediction]) -> float:
    """The gain over stock a candidate's prediction must show to replace it: ``MIN_GAIN``;
    for one measured beside stock in some rounds (a search's trials), also more than those
    rounds' scatter (``search.scatter_gain``), as the search asked of it."""
    if pred is not None and pred.measured and pred.rounds:
        return max(MIN_GAIN, scatter_gain(pred.rounds))
    return MIN_GAIN


def _within_margin(leader: tuple[Configuration, Prediction], stock: Optional[Configuration],
                   stock_p: Optional[Prediction], steps: Optional[int]) -> Optional[str]:
    """Where the ``leader`` of the ranking is not stock and would not make the job at least
    ``_needed`` shorter than stock's (both as predicted or measured, by the job's time):
    a note on why stock goes first instead; else None.  The budgeted search keeps stock
    unless a candidate beat it by ``MIN_GAIN`` in every round, and by more than the trials'
    scatter over them; the plan asks the same of a prediction, of one short run's median
    (whose scatter on a shared machine is larger than such a gain) and of a search's
    trials."""
    best, best_p = leader
    if stock_p is None or best == stock:
        return None
    mine, theirs = job_seconds(best_p, steps), job_seconds(stock_p, steps)
    need = _needed(best_p)
    if clears_margin(mine, theirs, need):
        return None
    how = "measured" if best_p.measured and stock_p.measured else "predicted"
    over = (f" over the {best_p.rounds} round(s) it ran beside stock, within what they "
            "scatter by" if need > MIN_GAIN else
            " (as in the budgeted search: within what two short runs or a prediction "
            "scatter by)")
    return (f"stock is kept: {best.label()}, the fastest other candidate, is {how} "
            f"{100 * (1.0 - mine / theirs):.1f}% faster than stock by the job's time, less "
            f"than the {100 * need:.3g}% a gain must clear{over}")


def decide(request: JobRequest, predictor: Predictor | None = None,
           catalogue: Catalogue | None = None, force: Configuration | None = None) -> Decision:
    """Rank the candidates; ``force`` pins the choice (an autotuning trial of one of them)."""
    cat = catalogue or load_catalogue()
    matches = select_images(request, cat)
    res = resources(request)
    runtime = choose_runtime(request)
    outer, inner = choose_launchers(request, res)
    configs = enumerate_configurations(request, matches, res, cat)
    scores = {m.variant.id: m.score for m in matches}
    requested = {c.value for c in request.optimisation.compilers}
    notes = []
    for c in request.optimisation.compilers:
        if not any(c in m.variant.compilers for m in matches[:MAX_IMAGES]):
            notes.append(f"{c.value} was requested but no matching image supports it")
    if not wrappable(request.application) and (request.optimisation.compilers or
                                               request.optimisation.allow_reduced_precision):
        notes.append("graph compilers and reduced precision not offered: MODAK's runtime applies "
                     "them to a Python script started by python (this application is "
                     f"{request.application.executable!r} {request.application.script or ''})"
                     .rstrip())

    # what earlier runs showed cannot be applied to this workload, or failed, is not offered
    excluded = (predictor.exclusions(request, configs) if predictor is not None
                else [None] * len(configs))
    if any(excluded) and not all(excluded):
        for cfg, why in zip(configs, excluded):
            if why:
                notes.append(f"not offered: {cfg.label()}: {why}")
        configs = [c for c, why in zip(configs, excluded) if not why]

    predictions = predictor.predict(request, configs) if predictor else [None] * len(configs)
    notes += predictor.notes if predictor is not None else []
    stock = stock_configuration(configs, scores, res.cpus_per_task)
    predictions, rejected = _reject_changed_results(configs, predictions, stock)
    for cfg, why in rejected:
        notes.append(f"not offered: {cfg.label()}: {why}")
    keep = [i for i, c in enumerate(configs) if c not in dict(rejected)]
    configs, predictions = [configs[i] for i in keep], [predictions[i] for i in keep]
    predicted = [(c, p) for c, p in zip(configs, predictions) if p is not None]
    epochs = request.application.epochs
    per_epoch = predictor.steps_per_epoch(request) if predictor is not None and epochs else None
    last_job = predictor.job_steps(request) if predictor is not None else None
    known = known_steps(request, last_job, per_epoch)
    if epochs and per_epoch and last_job and abs(last_job[0] - epochs * per_epoch) >= per_epoch:
        notes.append(f"the application states {epochs} epoch(s) of {per_epoch} steps, but its "
                     f"last full run under these arguments made {last_job[0]} steps "
                     f"({last_job[0] / per_epoch:.3g} epochs): are its epochs the script's?")
    if epochs and not per_epoch:
        notes.append(f"the application states {epochs} epoch(s), but no run of this workload "
                     "has measured an epoch's steps yet (a pass over a data loader of known "
                     "length, or Keras fit): the job is ranked by "
                     + ("its last full run's steps" if known else "its wall time")
                     + "; a search's stock trial, or this run, measures them")
    stock_p = dict(predicted).get(stock)
    job_steps, steps_from = planned_steps(res, stock_p, known)
    unchecked = margin = None
    if predicted:
        decided_by = "model"
        unpredicted = [c for c, p in zip(configs, predictions) if p is None]
        # (equal times: the better-scored image, as the prior would have it)
        predicted.sort(key=lambda cp: (job_seconds(cp[1], job_steps), -scores[cp[0].image],
                                       cp[0].label()))
        if job_steps and any(p.warmup_s for _, p in predicted):
            notes.append(f"ranked by the time of a {job_steps}-step job ({steps_from}): "
                         "each candidate's warm-up (compilation) once, as measured (a "
                         "compiler this workload never ran with: as measured of the "
                         "others), then its steps")
        # (a forced choice is the search's: its trials compared the losses)
        unchecked = _unchecked_precision(predicted, stock_p) if force is None else None
        if unchecked:  # the fastest that keeps fp32 (or whose loss was checked) goes first
            _to_front(predicted, unchecked[0])
            notes.append(unchecked[1])
        # what trials would examine: the candidates as predicted, before the margin
        by_prediction = list(predicted)
        # a gain within the margin is none: stock goes first (a forced choice is the
        # search's, which applied the margin to its trials)
        margin = (_within_margin(predicted[0], stock, stock_p, job_steps) if force is None
                  else None)
        if margin:
            _to_front(predicted, stock)
            notes.append(margin)
        best, best_p = predicted[0]
        rest = [(c, None) for c in sorted(
            unpredicted, key=lambda c: _prior_key(c, scores, requested, res.cpus_per_task))]
        ranked, to_try = predicted + rest, by_prediction + rest
    else:
        decided_by = "prior"
        ranked = [(c, None) for c in sorted(
            configs, key=lambda c: _prior_key(c, scores, requested, res.cpus_per_task))]
        best, best_p = ranked[0]
        to_try = ranked

    # what the model cannot settle is settled by measuring: short trials of the top
    # candidates and stock (the deploy runs them first when autotuning is enabled)
    autotune: tuple[Configuration, ...] = ()
    # (the top as predicted: stock kept by the margin does not hide a candidate whose
    # interval says a trial could find it far faster)
    top = [p for _, p in to_try[:AUTOTUNE_K] if p is not None]
    unsettled = None
    if decided_by == "model" and unchecked:
        unsettled = "reduced precision's effect on this script's loss is unmeasured"
    elif decided_by == "model" and len(top) > 1 and top[1].low <= top[0].high \
            and not top[0].measured:
        unsettled = f"the top {min(len(ranked), AUTOTUNE_K)} candidates are within the " \
            "model's uncertainty"
    elif decided_by == "prior" and len(ranked) > 1:
        unsettled = "the model cannot speak for this workload on this target"
    if (unsettled or request.optimisation.enable_autotuning) and len(ranked) > 1:
        autotune = _with_stock(tuple(first_round(
            [(c, p is not None and p.measured) for c, p in to_try], AUTOTUNE_K, stock)), stock)
    search = bool(unsettled) and request.optimisation.enable_autotuning and force is None
    if unsettled and search:
        notes.append(f"{unsettled}: the deploy first runs short trials of "
                     f"{len(autotune)} candidates, stock among them (a budgeted search)")
    elif unsettled and force is None:
        notes.append(f"{unsettled}: short trials would settle it (enable autotuning in the "
                     "request, and the deploy runs them first; or playbooks/autotune.yml)")
    if force is not None:
        if not _to_front(ranked, force):
            why = next((n.partition(f"{force.label()}: ")[2] for n in notes
                        if n.startswith(f"not offered: {force.label()}: ")), None)
            raise InputError(f"configuration {force.label()} is not a candidate of this request"
                             + (f" (not offered: {why})" if why else ""), request.source)
        best, best_p = ranked[0]
        decided_by = "autotune"

    candidates = []
    for i, (cfg, pred) in enumerate(ranked):
        if i == 0 and force is not None:
            reason = "autotuning trial of this candidate"
        elif i == 0 and margin:
            reason = (f"stock, kept: {best_p.seconds:.3g} s/step" + _job_time(best_p, job_steps)
                      + f" ({best_p.source}); no candidate that may replace it is "
                      f"faster by the margin (above)")
        elif i == 0:
            reason = (f"fastest predicted: {best_p.seconds:.3g} s/step"
                      + _job_time(best_p, job_steps) + f" ({best_p.source})"
                      if best_p else
                      f"highest image score {scores[cfg.image]:g}; prior: "
                      + (f"{cfg.compiler_kind.value} as requested" if cfg.compiler_kind
                         else "no graph compiler") + ", framework defaults otherwise")
        elif unchecked and pred is not None and best_p is not None and \
                cfg.precision != Precision.fp32 and \
                job_seconds(pred, job_steps) < job_seconds(best_p, job_steps):
            reason = (f"predicted {pred.seconds:.3g} s/step{_job_time(pred, job_steps)}, "
                      f"faster, but no run of its {cfg.precision.value} beside stock's shows "
                      f"that it keeps the loss ({pred.source})")
        elif margin and pred is not None and best_p is not None and \
                job_seconds(pred, job_steps) < job_seconds(best_p, job_steps):
            reason = (f"predicted {pred.seconds:.3g} s/step{_job_time(pred, job_steps)}, "
                      f"faster than stock by less than the {100 * _needed(pred):.3g}% a gain "
                      f"must clear ({pred.source})")
        elif pred is not None and best_p is not None:
            job = _job_time(pred, job_steps)  # (compared as ranked: by the job's time)
            than = (f"{job_seconds(best_p, job_steps):.3g} s" if job
                    else f"{best_p.seconds:.3g} s/step")
            reason = f"predicted {pred.seconds:.3g} s/step{job} > {than} ({pred.source})"
        elif best_p is not None:
            reason = "no prediction for this configuration"
        else:
            reason = _prior_reason(cfg, best, scores, requested, res.cpus_per_task)
        candidates.append(Candidate(configuration=cfg, rank=i + 1, score=scores[cfg.image],
                                    prediction=pred, reason=reason))
    match = next(m for m in matches if m.variant.id == best.image)
    return Decision(chosen=best, candidates=tuple(candidates), decided_by=decided_by,
                    autotune=autotune, search=search,
                    match=match, matches=tuple(matches), resources=res, runtime=runtime,
                    launcher=outer, inner_launcher=inner, notes=tuple(notes),
                    known_steps=known[0] if known else None)
