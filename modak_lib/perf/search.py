"""A budgeted search for what the model cannot settle: short trials of the user's script.

Successive halving (Jamieson and Talwalkar; Li et al.'s Hyperband uses it as its inner loop):
every candidate runs a short trial; the better half (by the time the job would take with
it) runs again, twice as long; and so on, while the trial budget lasts.  Of the better
half, one that already lost a round to stock (below: it cannot be chosen) does not go on.
Here:

- **stock is always a candidate** and is never dropped, so that every choice is measured
  against it in the same rounds; the others are the model's best-ranked, at most two of
  them compiled ones never measured here, which run last in their round
  (:func:`first_round`);
- **a candidate that changes the result is rejected**: its loss after the trial is worse
  than stock's after the same steps by more than ``loss_tolerance`` of stock's loss or, where
  that is larger, of how far stock's trial lowered its loss (:func:`changes_result`), the
  loss averaged over the trial's second half where both trials sampled it there
  (``end_loss``: one step's loss is one batch's, as noisy as the trial is short), else the
  last one.
  Every trial is seeded alike (:data:`TRIAL_SEED`), so that a script that does not seed
  its model and data itself starts every trial from the same weights and batches.  bf16
  autocast applied eagerly to a transformer script trained to a far worse loss here, while
  the same precision under torch.compile matched fp32;
- **compile time is amortised over the job's planned length**: a candidate is ranked by
  ``warm-up + s/step x job steps``, so a compiler that pays only after two hours is not
  chosen for a ten-minute job.  A job stated in ``epochs`` is as many steps as an epoch made
  in stock's first trial (the runtime counts them, :meth:`Halving.steps_for`; the plan's
  ``job_steps`` for it, from an earlier run, until then); one that states no steps
  (``job_steps`` None) and no epochs is as long as its wall time
  (``walltime_s``) holds at stock's speed as its first trial measured it (:func:`wall_steps`,
  the planner's rule too): an upper bound, as the planner's;
- **the budget** is a fraction of the job's expected run time (stock's), in seconds of
  the trials' whole cost: their jobs' time and what the deploy spends around each
  (``Trial.path_s``: its plan, staging, wait and record; :func:`cost`); a round that would
  exceed it is not started.  The first round runs
  without a measured cost to go by: it is cut to the candidates that fit the budget at an
  estimated ``trial_overhead_s`` (start-up through the job path, warm-up: what earlier
  trials at the target took besides their training, :func:`measured_overhead`, where
  they were recorded, with the deploy's tasks around each where the store kept them,
  ``path_s``) plus its steps at the predicted ``s_per_step`` and its predicted
  warm-up beyond stock's (``warmups``: a compiler's) each, best-ranked first; where not
  even stock and one candidate fit, no trial runs and stock is kept (a job too short for
  trials to pay for themselves).  The first round measures stock, and with
  ``budget_fraction`` the budget is
  then re-based on stock's measured job time (the planner's estimate of it may be far off
  for a new workload), once: a later round's stock trial does not move it, so what was
  spent by it stays within it; unless that one ran :data:`DISTURBED_STOCK` times faster or
  more (the first was disturbed): then the budget is re-based on it, never below what was
  spent.  Where a round leaves no candidate going on and the first
  round's cut left some untried, the best-ranked of those run in a round of their own, at
  the first round's steps, as many as the budget has left at stock's cost each
  (:meth:`Halving._refill`): a cut made on a prediction does not leave the re-based budget
  unspent while candidates wait;
- **a trial is stopped at its share of the budget**: just before a candidate's trial runs,
  it is given what the budget has left after the trials already run (this round's too),
  and in the first round after as much again as stock's trial took and
  ``CAP_OVERRUN_S``, kept for stock's second trial (``reserve``, below), shared equally
  with the round's candidates still to run (``cap``; the runtime stops the run there:
  ``MODAK_MAX_SECONDS``), so that a compilation longer than the budget (Inductor took
  122 s for a GRU here) ends its trial, not the budget.  Stock runs first in every round
  and is not capped (every choice is measured against it); once its trial has
  measured the job, the shares are of the budget re-based on it, so a first round planned
  on a prediction keeps to the measured budget too.  A candidate stopped before it measured
  a step time fails its trial (it could not pay for itself within the budget), without
  being barred from later plans: a longer job affords it.  Where what is left does not
  afford the round's candidates the shortest cap each, the worst-ranked with nothing
  measured to keep are not tried at all (``skip``): a job measured that short is too short
  for trials to pay for themselves.  The shortest cap is what stock's trial in the round
  took to measure a step time (:func:`shortest_cap`: the script's own start-up, its
  warm-up and two steps), at least ``MIN_CAP_S``: a share shorter than that ends before
  any configuration could measure one (a small CNN's start-up took 3.4 s here, and shares
  of 2.6 s measured nothing).  The cap is on the runtime's clock, and the job path's time
  outside it (scheduler, container, the record) comes on top: a share is given less what
  a trial may take beyond its cap, up to ``OUTSIDE_SCATTER`` times the time outside the
  clock that stock's trial in the round took (:func:`outside_clock`, :func:`beyond_cap`;
  a compiled trial capped at its 17 s share through Slurm and Podman cost 26.3 s, and
  used up what the first round kept for stock's second trial);
- **the final choice is never slower than the stock trial as measured** (amortised) in
  any round the two ran side by side, and never a rejected one: a single short trial on a
  shared machine can run 1.5x off its usual speed, so a candidate faster than stock in the
  last round but slower in an earlier one is not trusted to be faster, and stock is kept
  (the rounds are paired: stock runs in every round, beside the candidates);
- **and than stock's second trial, where its choice rests on one**: a candidate that ran
  beside stock in one round only, with no other stock trial to judge it against, is
  checked against a second trial of stock, run alone after the last round (as many steps
  as its last) where the budget has it left (the first round's candidates leave it that
  much: the last of them used to get all that was left), and capped at what the budget has
  left (a trial can run slower than the one before it); stock's figure in each
  comparison is the faster of its round's trial and its trials in rounds the candidate
  measured nothing in.
  A trial's slowdowns are one-sided (another process, a cold cache): ResNet-50's stock
  trial ran 1.57x its usual step time, and a compiled bf16 0.86x stock's speed was chosen
  on it;
- **and it beats stock by a margin** (``min_gain``, a fraction of stock's job time) in
  every such round: a candidate whose gain is within what two single trials scatter by
  is not a gain (a compiled bf16 GRU that beat stock in both of its rounds here measured
  0.98x of stock when the two ran again side by side);
- **and by more than the trials scatter by**: on average over the n rounds it ran beside
  stock, its log time ratio to stock must clear ``scatter`` / sqrt(n), one standard
  deviation of that average where each round's ratio scatters by ``scatter``
  (:data:`TRIAL_SCATTER`: what the shipped campaign's configurations measured in two or
  more rounds show, ``modak model eval`` prints it).  A candidate 7% faster than stock in
  the one 8-step round a budget allowed was 16% slower when the two ran again.  Between
  candidates that clear both, the faster wins.

``run`` is given by the caller: the deploy runs a trial through the real job path, the
tests and benchmarks run it here.  Every trial's record can go into the results store.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from ..models import Configuration
from .features import HOST_IMAGE

MIN_CAP_S = 1.0  # the shortest time cap: a candidate the budget cannot give it is not tried
# how far past its time cap a capped trial may run: the runtime's alarm repeats every 0.25 s
# until the run stops (``modak_runtime.session.ALARM_REPEAT_S``), and the run then writes
# its record; the first round keeps this on top of stock's second trial's cost
# (:meth:`Halving.reserve`), or a compilation stopped just past its cap leaves that trial
# a tenth of a second short
CAP_OVERRUN_S = 0.5
# how far a candidate's time outside the runtime's clock may run past stock's in the same
# round (a multiple of it): a trial stopped while compiling ends its processes on the way
# out; through Slurm and Podman here two such trials took 1.7x and 2.1x stock's 1.09 s,
# and an eager one on a slower container store 1.5x stock's 15.1 s
OUTSIDE_SCATTER = 2.0
# how much slower than a later stock trial of the same search stock's first trial must have
# been to be taken as disturbed (another process, a cold cache), and the budget re-based on
# the later one instead (:meth:`Halving._budget`): far beyond a trial's round-to-round
# scatter (TRIAL_SCATTER, 0.091 in log time; one round in ten 35% off), and the one seen
# here was 10x (0.647 s a step against 0.065, a sanity check running beside it: the budget
# re-based on it was 498 s where the job's 30% was about 50 s)
DISTURBED_STOCK = 2.0
# the fewest steps the runtime measures a step time from (the second step's end less the
# first's)
MEASURED_STEPS = 2
# how much faster than stock (a fraction of its job time) a candidate must be in every round
# the two ran side by side to be chosen over it
MIN_GAIN = 0.03
# how far a configuration's log time ratio to stock scatters from one round to the next (a
# standard deviation): the median over the shipped campaign's configurations measured in
# two or more rounds (``evaluate.round_scatter``, printed by ``modak model eval``)
TRIAL_SCATTER = 0.091


# of a first round's candidates, at most this many compiled ones never measured here: they
# share one unknown, the compilation's time, and a budget that cannot pay it caps them all
MAX_UNMEASURED_COMPILED = 2
# a compiled candidate is not tried after another trial of the same compiler in the same
# image was stopped at its cap while compiling, unless its own cap is this many times the
# time that trial ran (on the runtime's clock): the compilation is the same work whatever
# the allocator, and a cap as short stops it too (:func:`compiling_in`)
RECOMPILE_SHARE = 1.5


def first_round(ranked: Sequence[tuple[Configuration, bool]], k: int,
                stock: Optional[Configuration] = None) -> list[Configuration]:
    """The ``k`` candidates a search tries besides ``stock`` (which every search runs, and
    which takes none of the ``k`` places), in the order its rounds run them, from the
    model's ranking (best first, each with whether it was measured here): the best-ranked,
    but at most :data:`MAX_UNMEASURED_COMPILED` compiled ones never measured here (the
    next best of the others take the rest of the places); and those compiled ones run
    after the others.  A plan the prior decides (the compiler asked for first) ranked
    stock right after its compiled candidates: counted among the ``k``, it left a
    transformer regressor's round two compiled candidates, both stopped while compiling.

    A trial is capped at its share of what the budget has left when it starts, so a
    compilation that runs after the eager candidates (whose trials take their steps and
    end well within their shares) gets what they left, not an equal share (with two eager
    candidates and 32.5 s left after stock's trial and what is kept for its second:
    10.8 s first, about 25.5 s last).  And a first round of three compiled candidates,
    each stopped while compiling (a transformer regressor's, in shares of 7-15 s),
    measured nothing but stock.  The best-ranked that the budget cannot give the shortest
    cap are not tried (:meth:`Halving.skip`), so where the budget is that short, an
    unmeasured compilation (which could not pay for itself in it) is the first to go."""
    picked: list[tuple[Configuration, bool]] = []
    unmeasured = 0
    for config, measured in ranked:
        if len(picked) >= k:
            break
        if config == stock:
            continue
        late = bool(config.compiler) and not measured
        if late and unmeasured >= MAX_UNMEASURED_COMPILED:
            continue
        unmeasured += late
        picked.append((config, late))
    return [c for c, late in picked if not late] + [c for c, late in picked if late]


def scatter_gain(rounds: int, scatter: float = TRIAL_SCATTER) -> float:
    """The gain over stock, as a fraction of its time, that ``rounds`` paired rounds must
    show on average (geometric) to be more than the trials' ``scatter``: one standard
    deviation of that average, ``scatter`` / sqrt(rounds) in log time."""
    return 1.0 - math.exp(-scatter / math.sqrt(max(1, rounds)))


def clears_margin(mine: float, stock: float, min_gain: float = MIN_GAIN) -> bool:
    """Whether a time ``mine`` is at least ``min_gain`` shorter than stock's ``stock``: the
    one test of the margin, for the search's rounds, the planner and the evaluation."""
    return mine <= stock * (1.0 - min_gain)


@dataclass(frozen=True)
class Trial:
    """What one trial of a candidate measured."""
    configuration: Configuration
    steps: int
    s_per_step: Optional[float]       # steady-state seconds per step (None: failed)
    warmup_s: float = 0.0             # the warm-up's excess (compilation)
    wall_s: float = 0.0               # its job's whole time, start-up included
    final_loss: Optional[float] = None
    failed: Optional[str] = None      # why it failed, if it did
    round: int = 0                    # the search's round it ran in (set by Halving.record)
    # stopped at its time cap (its share of the budget) before it measured a step time:
    # the budget ran out, which says nothing against the configuration
    capped: bool = False
    # not run: its share of the budget could not measure it (``failed`` says why;
    # :meth:`Halving.skip`)
    skipped: bool = False
    # the runtime's clock from its start to the training's (the script's own set-up:
    # imports, data, model), 0 where not recorded
    startup_s: float = 0.0
    # the runtime's clock from its start to the run's end, 0 where not recorded: ``wall_s``
    # less this is the job path's time outside it (:func:`outside_clock`)
    runtime_s: float = 0.0
    # the mean loss over the trial's second half (``modak_runtime.record.end_loss``), None
    # where not recorded: what :func:`changes_result` compares where both trials have it
    end_loss: Optional[float] = None
    # the first loss the trial sampled (``modak_runtime.record.start_loss``), None where not
    # recorded: stock's sets how far its trial lowered its loss (:func:`changes_result`)
    start_loss: Optional[float] = None
    # the knobs its runtime did not apply to the script, where they made it another
    # configuration than its own (:func:`departures`: knob -> why): a later candidate of the
    # round with the same value of one is not tried (:meth:`Halving.skip`)
    refused: dict[str, str] = field(default_factory=dict)
    # it failed by an exception of the script's own: the runtime's record names its type,
    # blames no knob, and it is not the time cap (a job of the same configuration fails
    # the same way)
    script_error: bool = False
    # the losses the runtime sampled, ``[step, loss]`` pairs (``modak_runtime.record``'s
    # ``losses``), empty where not recorded: what a trial's figures after fewer steps than
    # its own are read from (:func:`losses_after`), when a trial of the same round ran fewer
    losses: Sequence[Sequence[float]] = ()
    # the optimizer steps an epoch of the script makes, as the runtime measured them
    # (``modak_runtime.record``'s ``steps_per_epoch``), None where it did not: stock's sets
    # the length of a job stated in epochs (:meth:`Halving.steps_for`)
    steps_per_epoch: Optional[int] = None
    # what the deploy spent on the trial around its job, on the controller's clock: its
    # plan, staging, submission, the wait's last poll, fetching and recording (0 where it
    # ran in-process, as the benchmarks' trials).  Part of its cost (:func:`cost`): a user
    # waits for it as for the job; 4.9-5.5 s a trial through the local job path here,
    # beside jobs of 3.3-6.0 s
    path_s: float = 0.0
    # what building its image took, where the trial built it (0 where it was there): spent
    # of the budget (:func:`cost`), but once per recipe, not a trial's cost around its job
    # (``path_s``), by which the later trials' are foreseen: a Charliecloud image made for
    # a job's dataset took 80 s here, beside trials of 4 s, and the search foresaw every
    # later trial at 86 s
    build_s: float = 0.0
    # what building stock's image took, where its trial built it: not spent of the budget,
    # since the job needs that image whatever the search chooses among the runtime's knobs
    # (a fresh front-end's first search had its whole budget spent on it: a 2-3 minute
    # build here, beside trials of seconds, and nothing but stock tried); another image's
    # build is a trial's cost (``build_s``)
    shared_build_s: float = 0.0


def _script_broke(trial: Optional[Trial]) -> Optional[str]:
    """Why ``trial`` measured nothing where the script itself raised in it (None
    otherwise): a trial of another configuration would fail the same way."""
    if trial is not None and trial.s_per_step is None and trial.script_error:
        return trial.failed
    return None


def _not_measured(trial: Optional[Trial]) -> Optional[str]:
    """A round's verdict on a candidate whose trial measured nothing to compare (None: it
    measured): not run, not tried (and why), or failed."""
    if trial is None:
        return "not measured"
    if trial.skipped:
        return trial.failed
    return f"failed: {trial.failed}" if trial.failed else None


def script_error(failed: Optional[str], error: Optional[dict]) -> bool:
    """Whether a failed trial's record says the script itself raised (:attr:`Trial.script_error`):
    an error with a type, no knob blamed, not ``TimeCap``."""
    error = error or {}
    return bool(failed) and bool(error.get("type")) and not error.get("knob") \
        and not time_capped(failed, error)


def cost(trial: Trial) -> float:
    """What ``trial`` cost of the budget: its job's time (``wall_s``), what the deploy
    spent around it (``path_s``) and on its image's build (``build_s``)."""
    return trial.wall_s + trial.path_s + trial.build_s


def shortest_cap(stock: Optional[Trial]) -> float:
    """The shortest time cap a candidate's trial is given: what ``stock``'s trial (in the
    same round) took on the runtime's clock to measure a step time, its start-up, warm-up
    and :data:`MEASURED_STEPS` steps; at least :data:`MIN_CAP_S` (also where stock's trial
    has not measured, or did not record its start-up).  A configuration pays the script's
    start-up as stock does, so a cap shorter than that measures nothing."""
    if stock is None or stock.s_per_step is None or not stock.startup_s > 0:
        return MIN_CAP_S
    return max(MIN_CAP_S, stock.startup_s + stock.warmup_s
               + MEASURED_STEPS * stock.s_per_step)


def outside_clock(stock: Optional[Trial]) -> float:
    """The job path's seconds outside the runtime's clock in ``stock``'s trial: its whole
    cost (``wall_s``: the scheduler, the container's start, the interpreter's before the
    runtime starts its clock, the record's writing) less what the runtime's clock measured
    of it (``runtime_s``); 0 where that is not recorded.  A time cap runs on the runtime's
    clock, so a candidate's trial costs its cap plus this much: a compiled trial capped at
    17 s through Slurm and Podman here cost 26.3 s of the budget."""
    if stock is None or not stock.runtime_s > 0:
        return 0.0
    return max(0.0, stock.wall_s - stock.runtime_s)


def beyond_cap(stock: Optional[Trial]) -> float:
    """What a candidate's capped trial may cost beyond its cap through the job path, judged
    by ``stock``'s trial in the same round: its time outside the runtime's clock
    (:func:`outside_clock`), up to :data:`OUTSIDE_SCATTER` times stock's (the overrun on
    the clock itself, :data:`CAP_OVERRUN_S`, is in the first round's reserve), and what the
    deploy spent around stock's job (``path_s``), once: a candidate's trial goes the same
    way.  A share is
    given less this, so that a trial its cap stops ends within its share: two compilations
    capped at their shares less stock's time outside cost 0.7 and 1.1 s more here, and
    left what the round kept for stock's second trial short.  0 outside the job path (the
    benchmarks' trials, on the runtime's clock alone)."""
    return OUTSIDE_SCATTER * outside_clock(stock) + (stock.path_s if stock is not None else 0.0)


def _as_cap(seconds: float, stock: Optional[Trial]) -> float:
    """``seconds`` as a trial's time cap: to a tenth of a second, down (a share rounded up
    eats into what is kept for stock's second trial), and at least :func:`shortest_cap`
    judged by ``stock``'s trial."""
    return max(math.floor(10 * seconds + 1e-6) / 10, round(shortest_cap(stock), 1))


def time_capped(failed: Optional[str], error: Optional[dict]) -> bool:
    """Whether a failed trial is one its time cap stopped before it measured a step time:
    the runtime's record says so with an error of type ``TimeCap`` (:attr:`Trial.capped`)."""
    return bool(failed) and (error or {}).get("type") == "TimeCap"


def departures(not_applied: dict[str, str], config: Configuration,
               stock: Optional[Configuration]) -> dict[str, str]:
    """The knobs a trial's runtime did not apply (``not_applied``: knob -> why) that make it
    another configuration than the one it stands for: a trial that measured another one
    fails.  A knob left at what stock asks for is not one of them: where the script sets
    its own threads, stock's trial and a candidate's at stock's threads both ran with the
    script's count, and stand side by side as measured."""
    return {knob: why for knob, why in not_applied.items()
            if stock is None or not hasattr(config, knob)
            or getattr(config, knob) != getattr(stock, knob)}


def refused_in(configuration: Configuration, done: Sequence[Trial]) -> Optional[str]:
    """Why ``configuration`` is not tried after the trials ``done`` (None: it may be): one
    of them, in the same image, found a knob the configuration has at the same value not
    applicable to the script (``Trial.refused``; the planner's rule too: another image may
    well have what this one lacked)."""
    for t in done:
        if t.configuration.image != configuration.image:
            continue
        for knob, why in sorted(t.refused.items()):
            value = getattr(configuration, knob, None)
            if value is not None and value == getattr(t.configuration, knob, None):
                shown = getattr(value, "value", value)
                return (f"not tried: {knob}={shown} was not applied to this script in the "
                        f"trial of {t.configuration.label()} ({why})")
    return None


def compiling_in(configuration: Configuration, done: Sequence[Trial],
                 cap: Optional[float]) -> Optional[str]:
    """Why ``configuration`` is not tried at its time cap ``cap`` after the trials ``done``
    (None: it may be): it is compiled, and a trial in the same image with the same compiler
    was stopped at its cap before it measured a step time, after its start-up (so while
    compiling), having run less than ``cap`` / :data:`RECOMPILE_SHARE` on the runtime's
    clock.  A user's diffusion MLP here: torch.compile capped at 9.5 s after one step, and
    the same compilation with jemalloc was then capped at 9.9 s, both measuring nothing.
    A trial that recorded no clock (``runtime_s``) says nothing.  ``done`` may hold an
    earlier search's such trials (:func:`compiled_earlier`)."""
    if not configuration.compiler or cap is None:
        return None
    for t in done:
        c = t.configuration
        if (t.capped and t.s_per_step is None and c.image == configuration.image
                and c.compiler == configuration.compiler
                and t.runtime_s > t.startup_s
                and cap < RECOMPILE_SHARE * t.runtime_s):
            which = (f"the trial of {c.label()}" if t.round >= 0 else
                     f"an earlier search's trial of {c.label()} here")
            return (f"not tried: compiler={c.compiler} was still compiling this script when "
                    f"{which} stopped at its cap, {t.runtime_s:.1f} s into its run; this "
                    f"trial's share, {cap:.1f} s, is not {RECOMPILE_SHARE:g}x that")
    return None


def compiled_earlier(configuration: Configuration, ran_s: Optional[float]
                     ) -> Optional[Trial]:
    """An earlier search's trial, stopped at its time cap while ``configuration``'s compiler
    was still compiling the script ``ran_s`` seconds into its training (the plan's
    ``Prediction.compiling_s``, from the results store), as :func:`compiling_in` reads a
    trial: a search that gave the same compilation a share as short measured nothing
    again (round -1: not one of this search's)."""
    if not configuration.compiler or not ran_s or ran_s <= 0:
        return None
    return Trial(configuration, 0, None, failed="stopped at its time cap while compiling",
                 round=-1, capped=True, runtime_s=float(ran_s))


@dataclass
class Outcome:
    chosen: Configuration
    stock: Configuration
    trials: list[Trial] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)  # candidate label -> why
    spent_s: float = 0.0
    budget_s: float = 0.0
    rounds: int = 0
    # the round whose stock trial the budget was re-based on after the first round's, where
    # that was disturbed (:func:`disturbed_stock`)
    rebased_on: Optional[int] = None

    def summary(self) -> str:
        """One line: the choice, the trials and rounds, and the time spent of the budget;
        where that is over the budget, what stock's trials took, which run whatever the
        budget (a job of a few seconds read "5.4 s of a 0.5 s budget" and nothing more)."""
        trials, rounds = len(self.trials), self.rounds
        line = (f"chose {self.chosen.label()} after {trials} trial{'s' * (trials != 1)} in "
                f"{rounds} round{'s' * (rounds != 1)}, {_secs(self.spent_s)} s of a "
                f"{_secs(self.budget_s)} s budget")
        if self.spent_s > self.budget_s:
            stock = sum(cost(t) for t in self.trials if t.configuration == self.stock)
            line += f" (stock's trials, which always run, took {_secs(stock)} s of it)"
        shared = sum(t.shared_build_s for t in self.trials)
        if shared:
            line += (f"; building stock's image, {_secs(shared)} s, not counted: the job "
                     "needs it")
        return line


def _secs(seconds: float) -> str:
    """Seconds for a summary: whole ones, a tenth below ten (a budget re-based on a job
    of 2.3 s read "4 s of a 0 s budget")."""
    return f"{seconds:.0f}" if seconds >= 9.95 else f"{seconds:.1f}"


def job_time(s_per_step: float, warmup_s: float, job_steps: Optional[int]) -> float:
    """A candidate's time for the job: its warm-up once, then its steps; per step where the
    job's length is unknown (the search's trials and the planner's predictions alike)."""
    return warmup_s + s_per_step * job_steps if job_steps else s_per_step


def job_seconds(trial: Trial, job_steps: Optional[int]) -> float:
    """How long the job would take with this candidate (:func:`job_time`; a failed trial:
    infinite)."""
    if trial.s_per_step is None:
        return math.inf
    return job_time(trial.s_per_step, trial.warmup_s, job_steps)


def disturbed_stock(trials: Sequence[Trial], stock: Configuration) -> Optional[Trial]:
    """The stock trial of a later round, of ``trials`` (a search's, in order), that ran
    :data:`DISTURBED_STOCK` times faster than stock's first trial or more (the fastest such,
    the last of equals), which says the first was disturbed; None where none did."""
    measured = [t for t in trials if t.configuration == stock and t.s_per_step]
    if len(measured) < 2:
        return None
    first, later = measured[0], measured[1:]
    found = None
    for t in later:
        if t.round != first.round and t.s_per_step * DISTURBED_STOCK <= first.s_per_step \
                and (found is None or t.s_per_step <= found.s_per_step):
            found = t
    return found


def wall_steps(walltime_s: Optional[float], s_per_step: Optional[float]) -> Optional[int]:
    """As many steps as the wall time holds at this speed: the length of a job that states
    no steps (an upper bound: a job that stops sooner makes a compiler's warm-up weigh
    more).  None where either is unknown."""
    if walltime_s and s_per_step and s_per_step > 0:
        return max(1, int(walltime_s / s_per_step))
    return None


def _job(job_steps: Optional[int]) -> str:
    return f"a {job_steps}-step job" if job_steps else "a job of unknown length (per step)"


# every trial's random number generators are seeded with it (``MODAK_SEED``, the runtime's
# ``seed_the_run``): trials of different configurations start from the same weights and
# see the same batches, so that what their losses differ by is the configuration's doing
TRIAL_SEED = 0


def losses_after(trial: Trial, steps: int) -> Optional[Trial]:
    """``trial`` as it stood after its first ``steps`` steps, from the losses it sampled
    (:attr:`Trial.losses`): its last loss sampled by then (``final_loss``, from the second
    half of those steps) and the mean over their second half (``end_loss``, as
    ``modak_runtime.record.end_loss`` takes it over a whole run); None where it sampled no
    loss in that half, or ran fewer steps.  Every trial starts from the same weights and
    batches (:data:`TRIAL_SEED`), so two trials' losses compare step for step."""
    from modak_runtime.record import losses_after as figures

    if steps <= 0 or trial.steps < steps:
        return None
    if trial.steps == steps:
        return trial
    then = figures(trial.losses, steps)
    if then is None:
        return None
    return replace(trial, steps=steps, final_loss=then[0], end_loss=then[1])


def changes_result(trial: Trial, stock: Trial, tolerance: float) -> Optional[str]:
    """Why a candidate's trial is rejected as changing the result (None: it is not): its
    loss is not finite, or worse than stock's by more than ``tolerance`` of stock's loss
    or, where that is larger, of how far stock's trial lowered its loss from its first
    sampled one (``start_loss``).  The losses compared are the means over the trials'
    second halves (``end_loss``) where both have one, else the last ones (``final_loss``),
    after as many steps: where one trial ran fewer (a time cap stopped it after it had
    measured its step time, or the candidate's trial is an earlier round's), the other's
    figures are read from its sampled losses at that many steps (:func:`losses_after`).
    Where they cannot be (a trial that sampled none), the two are compared as they ended,
    and the reason names both lengths.

    Relative to stock's loss alone, the check was strict near 0: a ResNet-18 script that
    memorises its batches (the campaign's runs of it start near 4.6) ended a trial at
    0.001114 in bf16 against stock's 0.001031, 8% worse, and bf16, faster in all three
    rounds, was rejected.  Measured against what stock's trial achieved, a candidate is
    rejected where it falls short of that by more than ``tolerance``; where the loss fell
    by less than where it ended (a short trial, a loss that barely moves: most of the
    campaign's families), the scale is stock's loss, as before."""
    for v in (trial.final_loss, trial.end_loss):
        if v is not None and not math.isfinite(v):
            return f"its loss is {v}"
    if trial.steps != stock.steps:  # (after as many steps, where the losses tell)
        n = min(trial.steps, stock.steps)
        mine_n, stock_n = losses_after(trial, n), losses_after(stock, n)
        if mine_n is not None and stock_n is not None:
            trial, stock = mine_n, stock_n
    of_stock = "stock's" if trial.steps == stock.steps else f"stock's after {stock.steps} steps"
    if trial.end_loss is not None and stock.end_loss is not None:
        mine, ref = trial.end_loss, stock.end_loss
        what = f"its mean loss over the second half of {trial.steps} steps"
    elif trial.final_loss is not None and stock.final_loss is not None:
        mine, ref = trial.final_loss, stock.final_loss
        what = f"its loss after {trial.steps} steps"
    else:
        return None  # nothing to compare (a script whose loss the runtime cannot see)
    worse = mine - ref
    fell = stock.start_loss - ref if stock.start_loss is not None and \
        math.isfinite(stock.start_loss) else 0.0
    if fell > abs(ref):
        scale, of = fell, (f"of the {fell:.4g} stock's trial lowered its loss by (from "
                           f"{stock.start_loss:.4g})")
    else:
        scale, of = max(abs(ref), 1e-8), "of stock's"
    if worse > tolerance * scale:
        return (f"{what} is {mine:.4g}, {of_stock} {ref:.4g}: worse by {worse / scale:.0%} "
                f"{of} (tolerance {tolerance:.0%}): it changes the result")
    return None


# the trials at a target whose cost besides their training the first round is estimated by
# (the latest; one trial's start-up scatters, a target's job path changes)
OVERHEAD_TRIALS = 5


def measured_overhead(trials: Sequence[dict], in_container: bool,
                      workload: Optional[str] = None) -> Optional[tuple[float, int, bool]]:
    """What a search's trial costs at a target besides its training, as its earlier trials
    there took it: the median, over the latest :data:`OVERHEAD_TRIALS` of them run as this
    one will be (in a container or outside any, ``in_container``), of its job's clock
    around the launch (``job_s``: the container's start, the runtime's start-up, the
    script's own set-up) less the runtime's clock of its training (its wall clock less
    its start-up), plus what the deploy spent around its job up to its record
    (``path_s``: its plan, staging, submission, wait and fetch; 0 in a row without it),
    with how many there were and whether they were of ``workload`` (its
    label: the script's own set-up is the larger part, so that workload's trials are taken
    where there are any, else any workload's); None where none was recorded.  ``trials``:
    the store's rows of them, newest first (``ResultsStore.trial_clocks``).

    Without it, the first round's cut took every trial to cost a fixed ten seconds: on this
    project's own machine a trial outside any container cost 3 s, and a job of 3.5 minutes
    whose budget afforded five trials was given none ("too short for trials to pay for
    themselves"); behind a cluster's queue or in a container it can cost more."""
    seen: dict[bool, list[float]] = {True: [], False: []}
    for row in trials:
        if (str(row.get("image") or HOST_IMAGE) != HOST_IMAGE) != in_container:
            continue
        try:
            m = json.loads(row["raw"]).get("metrics") or {}
            rest = float(row["job_s"]) - (float(m["wall_s"]) - float(m["startup_s"]))
            # and what the deploy spent around its job (a row of an earlier MODAK has none)
            rest += float(row.get("path_s") or 0.0)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if math.isfinite(rest) and rest >= 0:
            seen[False].append(rest)
            if workload is not None and row.get("workload") == workload:
                seen[True].append(rest)
    for own in (True, False):
        if seen[own]:
            last = seen[own][:OVERHEAD_TRIALS]
            return statistics.median(last), len(last), own
    return None


class Halving:
    """The search as steps, so that a caller that cannot loop in Python (a playbook, round
    by round through the job path) can drive it: ``next_round()`` says which candidates to
    try and for how many steps (None: done), ``record(trials)`` takes what they measured,
    ``outcome()`` is the choice.  ``state()``/``from_state()`` keep it between calls."""

    def __init__(self, candidates: Sequence[Configuration], stock: Configuration, *,
                 job_steps: Optional[int], budget_s: float, first_steps: int = 10,
                 eta: int = 2, loss_tolerance: float = 0.05, max_rounds: int = 4,
                 budget_fraction: Optional[float] = None, trial_overhead_s: float = 0.0,
                 s_per_step: Optional[float] = None, min_gain: float = MIN_GAIN,
                 walltime_s: Optional[float] = None, scatter: float = TRIAL_SCATTER,
                 epochs: Optional[int] = None, earlier: Sequence[Trial] = (),
                 warmups: Optional[dict[Configuration, float]] = None):
        self.stock, self.job_steps, self.budget_s = stock, job_steps or None, budget_s
        # trials of earlier searches that their caps stopped while compiling
        # (:func:`compiled_earlier`): a compiled candidate's share must be longer
        self.earlier = list(earlier)
        self.walltime_s, self.epochs = walltime_s, epochs or None
        self.min_gain, self.scatter = min_gain, scatter
        self.budget_fraction = budget_fraction
        # the first round's cost before anything is measured: per trial, this much plus
        # its steps at the predicted seconds per step
        self.trial_overhead_s, self.s_per_step = trial_overhead_s, s_per_step
        # a candidate's predicted warm-up beyond stock's (a compiler's), which its first
        # trial pays besides that
        self.warmups = {c: s for c, s in (warmups or {}).items() if s and s > 0}
        self.eta, self.tolerance, self.max_rounds = eta, loss_tolerance, max_rounds
        self.pool = [stock] + [c for c in candidates if c != stock]
        self.steps = self.first_steps = first_steps
        # the candidates the first round's predicted cost cut (best-ranked first): tried in
        # a round of their own where a round leaves none going on (:meth:`_refill`)
        self.held: list[Configuration] = []
        self.out = Outcome(chosen=stock, stock=stock, budget_s=budget_s)
        self.last: dict[Configuration, Trial] = {}
        self.finished = False
        # stock's second trial, run after the last round where a candidate would be chosen
        # on one round beside stock (:meth:`_confirmation`); ``confirming``: it is the
        # round under way; ``confirmed``: it was asked for (it runs once)
        self.confirm: Optional[Trial] = None
        self.confirming = self.confirmed = False

    def next_round(self) -> Optional[tuple[list[Configuration], int]]:
        if self.finished or not self.pool or self.out.rounds >= self.max_rounds:
            return self._confirmation()
        if not self.out.rounds and not self._first_round_fits():
            return self._finish()
        # the round's cost, estimated from the last round (its trials at this many steps)
        estimate = sum(_estimate(self.last.get(c), self.steps) for c in self.pool)
        if self.out.rounds and self.out.spent_s + estimate > self.budget_s:
            return self._confirmation()
        return list(self.pool), self.steps

    def _confirmation(self) -> Optional[tuple[list[Configuration], int]]:
        """Stock's second trial, as one more round of stock alone, where the search would
        end choosing a candidate that ran beside stock in one round only, and the budget
        has stock's trial left (as the last round measured it); else the end (None).

        A single trial's slowdown is one-sided (another process, a cold cache), and the
        tail is long: in the shipped data the median configuration's ratio to stock
        scatters by 8.6% from one round to the next, but one round in ten puts it 35% or
        more off its mean.  A stock trial that ran slow makes any candidate look faster:
        ResNet-50's 8-step stock trial measured 0.201 s a step, 1.57x its usual 0.128, and
        a compiled bf16 that is 0.86x stock's speed for the job was chosen on it.  So the
        choice must also beat stock's second trial (the faster of the two counts,
        :meth:`stock_trial`)."""
        steps = self._confirm_steps()
        if self.confirming:  # (asked again before it ran: the same round)
            return [self.stock], steps
        if not self.confirmed:
            best, _ = self._choice()
            if (best != self.stock and sum(map(len, self._stock_trials(best))) < 2
                    and self.out.spent_s + _estimate(self.last.get(self.stock), steps)
                    <= self.budget_s):
                self.finished = self.confirming = self.confirmed = True
                return [self.stock], steps
        return self._finish()

    def _confirm_steps(self) -> int:
        """Stock's second trial runs as many steps as its last."""
        base = self.last.get(self.stock)
        return base.steps if base is not None and base.steps > 0 else self.steps

    def cap(self, configuration: Configuration, done: Sequence[Trial] = ()) -> Optional[float]:
        """The time cap, in seconds, of this round's trial of ``configuration``, given the
        round's trials ``done`` so far: what the budget (re-based on stock's first trial once
        it ran) has left after them, shared equally among the round's candidates not yet run
        that it affords (:meth:`skip`), this one included (less stock's estimated trial
        while it has not run), less what its trial may take beyond its cap, judged by
        stock's trial in the round (:func:`beyond_cap`: the cap runs on the runtime's clock,
        the share is of the budget's, which also pays the job path's time outside that
        clock), to a tenth of a second rounded down.  None for stock's trial in a round
        and an unbounded budget; at least :func:`shortest_cap`.

        Stock's second trial (:meth:`_confirmation`), alone after the last round, is given
        what the budget has left less the time stock's trial before it took outside the
        runtime's clock: it runs only where the budget has its cost again left, but a
        trial can run slower than the one before it, and uncapped it ran past the budget
        (ResNet-50's search in the held-out benchmark: 77 s of a 76 s budget, the second
        trial 1.5 s slower than the first).  Stopped there after it measured a step time,
        it counts with what it measured; before, the choice rests on the one round, as
        where the budget had no second trial left."""
        if not math.isfinite(self.budget_s):
            return None
        if configuration == self.stock:
            return self._confirmation_cap() if self.confirming else None
        left, waiting, _, base = self._share(done)
        return _as_cap(left / max(1, self._afforded(left, waiting, base)) - beyond_cap(base),
                       base)

    def _confirmation_cap(self) -> float:
        """The time cap of stock's second trial (see :meth:`cap`)."""
        base = self.last.get(self.stock)
        return _as_cap(self.budget_s - self.out.spent_s - outside_clock(base)
                       - (base.path_s if base is not None else 0.0), base)

    def skip(self, configuration: Configuration, done: Sequence[Trial] = ()) -> Optional[str]:
        """Why this round's trial of ``configuration`` is not run (None: it runs): once
        stock's trial in this round has measured the job, what the budget has left affords
        the round's candidates still to run the shortest cap (:func:`shortest_cap`: what
        stock's trial took to measure a step time, at least ``MIN_CAP_S``) each, the
        best-ranked first; one it does not afford, with nothing measured from an earlier
        round to keep, is not tried.  A job measured that short is too short for trials to
        pay for themselves (a 600-step job of 27 s, its budget 2.7 s and stock's trial 5 s,
        ran three trials capped at 1 s, none measured a step); and a share shorter than
        the script's own start-up measures nothing (a small CNN's three candidates, capped
        at 2.6 s each, ended before their first steps: its start-up took 3.4 s).  A cap
        runs on the runtime's clock, without the process's start (a benchmark's MLP
        measured tcmalloc 1.21x faster in shares of 1.7 s).

        Nor is a candidate with a knob at the value an earlier trial of the round found the
        runtime could not apply to this script (:func:`refused_in`): its trial would measure
        another configuration than its own (the planner no longer offers it either, and
        planning its trial failed in the middle of the deploy).  Nor a compiled candidate
        whose compiler an earlier trial in its image was still running when its cap stopped
        it, where this one's cap is not :data:`RECOMPILE_SHARE` times as long
        (:func:`compiling_in`), or an earlier search's trial of it here
        (:func:`compiled_earlier`): its share goes to the candidates after it.  Nor any
        candidate once stock's trial in the round failed in the script itself (a package the
        job's Python lacks, a file the run directory lacks): each of them would fail the
        same way, and the search stops with stock's failure (a Keras script in a Python
        without TensorFlow ran all four trials of its round, each failing in a second)."""
        if configuration == self.stock:
            return None
        broken = _script_broke(next((t for t in done if t.configuration == self.stock), None))
        if broken is not None:
            return (f"not tried: stock's trial failed in the script itself ({broken}): "
                    "its trial would fail the same way")
        why = refused_in(configuration, done)
        if why or not math.isfinite(self.budget_s):
            return why
        earlier = self.last.get(configuration)
        if earlier is not None and earlier.s_per_step is not None:
            return None  # (capped, it keeps what it measured: see ``record``)
        why = compiling_in(configuration, [*self.earlier, *self.out.trials, *done],
                           self.cap(configuration, done))
        if why:
            return why
        left, waiting, budget, base = self._share(done)
        if configuration not in waiting or \
                waiting.index(configuration) < self._afforded(left, waiting, base):
            return None
        shortest = shortest_cap(base)
        why = (f"{MIN_CAP_S:g} s" if shortest <= MIN_CAP_S else
               f"{shortest:.1f} s: what stock's trial took to measure a step time, its "
               f"start-up {base.startup_s:.1f} s")
        outside = outside_clock(base)
        if outside or base.path_s:
            tasks = (f", and the {base.path_s:.1f} s the deploy spent around its job"
                     if base.path_s else "")
            why += (f"; and {beyond_cap(base):.1f} s a trial may take beyond its cap "
                    f"through the job path: up to {OUTSIDE_SCATTER:g}x the {outside:.1f} s "
                    f"stock's took outside the runtime's clock{tasks}")
        kept = self.reserve(base)
        kept = f", and {kept:.1f} s kept for its second trial" if kept else ""
        return (f"not tried: the budget ({budget:.1f} s, the job as stock's trial measured "
                f"it) has {max(left, 0.0):.1f} s left after the trials before it (stock's "
                f"{cost(base):.1f} s{kept}), not the shortest cap ({why}) for it and the "
                f"better-ranked: the job is too short for trials to pay for themselves")

    @staticmethod
    def _afforded(left: float, waiting: list, base: Optional[Trial]) -> int:
        """How many of the round's candidates still to run (best-ranked first) get a trial:
        all while stock's trial has not measured the job, then as many as ``left`` affords
        the shortest cap (:func:`shortest_cap`) each, with what a trial may take beyond its
        cap (:func:`beyond_cap`) on top of it."""
        if base is None or base.s_per_step is None:
            return len(waiting)
        each = shortest_cap(base) + beyond_cap(base)
        return min(len(waiting), max(0, int(left // each)))

    def _share(self, done: Sequence[Trial]) -> tuple[float, list, float, Optional[Trial]]:
        """(what the budget has left after the round's trials ``done``, and in the first
        round after the reserve for stock's second trial (:meth:`reserve`); the round's
        candidates not yet run, best-ranked first; the budget, re-based on stock's first
        trial once it ran; stock's trial in this round, None while it has not run)."""
        ran = {t.configuration: t for t in done}
        base = ran.get(self.stock)
        budget = self._budget(base, first_round=not self.out.rounds)
        left = budget - self.out.spent_s - sum(map(cost, done)) - self.reserve(base)
        if base is None:  # (stock's trial still to come in this round)
            left -= (_estimate(self.last.get(self.stock), self.steps) if self.out.rounds
                     else self._first_trial_s())
        waiting = [c for c in self.pool if c != self.stock and c not in ran]
        return left, waiting, budget, base

    def _budget(self, base: Optional[Trial], first_round: bool) -> float:
        """The budget once stock's trial ``base`` has run in a round: with
        ``budget_fraction``, in the first round, that fraction of the job's time as ``base``
        measured it; else the budget as it stands.  Re-based once: re-based again on a
        later, faster stock trial, it shrank below what the rounds before had spent by it
        (an LSTM LM's search, its budget 33 s after round 1, 24 s after round 2: 29 s spent
        "of a 24 s budget").  Except where stock's first trial was disturbed (a later one
        measured it :data:`DISTURBED_STOCK` times faster or more, :func:`disturbed_stock`):
        then on that later trial, never below what was spent (a first trial that ran 10x
        slow had made the budget 10x the job's fraction)."""
        if first_round and self.budget_fraction and base is not None and \
                base.s_per_step is not None and (steps := self.steps_for(base)):
            return self.budget_fraction * job_seconds(base, steps)
        if not first_round and self.budget_fraction and base is not None and \
                disturbed_stock(self.out.trials + [base], self.stock) is base and \
                (steps := self.steps_for(base)):
            return min(self.budget_s, max(self.out.spent_s,
                                          self.budget_fraction * job_seconds(base, steps)))
        return self.budget_s

    def steps_for(self, base: Optional[Trial]) -> Optional[int]:
        """The job's steps once stock's first trial ``base`` has run: for a job stated in
        ``epochs``, those epochs at the steps an epoch made in that trial (the script as it
        runs now, over its data now: the plan's figure came from an earlier run, perhaps
        under other arguments); else as stated (``job_steps``); else as many as its wall
        time holds at that trial's speed (:func:`wall_steps`: an upper bound).  Before
        that trial, as stated (None: not known)."""
        if base is None:
            return self.job_steps
        if self.epochs and base.steps_per_epoch:
            return self.epochs * base.steps_per_epoch
        if self.job_steps is not None:
            return self.job_steps
        return wall_steps(self.walltime_s, base.s_per_step)

    def reserve(self, base: Optional[Trial]) -> float:
        """What the first round's candidates leave of the budget for stock's second trial
        (:meth:`_confirmation`: as many steps as ``base``, stock's trial in this round, so
        its cost again): a candidate chosen on the first round alone is checked against it.
        Without the reserve the round's last candidate got all that was left: a character
        LSTM's compiled bf16, last in its round, used its 17 s share to the end, and
        tcmalloc was chosen on the one round, its 18.7% gain over a stock trial that was
        the first process of the round; side by side it ran 0.91x stock's speed.  Plus
        :data:`CAP_OVERRUN_S`, since a capped trial ends a little past its cap: with the
        reserve alone, a MobileNet-style CNN's compilation, last in its round and capped
        at what was left less it, left too little for stock's second trial (its cost
        again, to the tenth of a second), and tcmalloc was chosen on the one round.  0
        from the second round on (a candidate measured in two rounds beside stock needs
        no second stock trial), and before stock's trial has measured."""
        if self.out.rounds or base is None or base.s_per_step is None:
            return 0.0
        return _estimate(base, base.steps) + CAP_OVERRUN_S

    def _first_trial_s(self, configuration: Optional[Configuration] = None) -> float:
        """A first-round trial's cost before anything is measured: the overhead plus its
        steps at the predicted seconds per step, plus ``configuration``'s predicted warm-up
        beyond stock's."""
        return (self.trial_overhead_s + self.steps * (self.s_per_step or 0.0)
                + self.warmups.get(configuration, 0.0))

    def _first_round_fits(self) -> bool:
        """Cut the first round to the trials its budget affords (stock and the
        best-ranked candidates, in order, each at its estimated cost); False where it
        affords fewer than stock and one."""
        per_trial = self._first_trial_s()
        if per_trial <= 0 or not math.isfinite(self.budget_s):
            return True
        fits, total = 0, 0.0
        for c in self.pool:
            total += self._first_trial_s(c)
            if total > self.budget_s:
                break
            fits += 1
        if fits >= len(self.pool):
            return True
        more = (", more for a compiler's warm-up"
                if any(c in self.warmups for c in self.pool[:fits + 1]) else "")
        estimate = f"{per_trial:.0f} s a trial{more}, {self.budget_s:.0f} s of budget"
        if fits < 2:
            self.out.verdicts[self.stock.label()] = (
                f"chosen without trials: the budget affords {fits} ({estimate}); the job "
                f"is too short for trials to pay for themselves")
            for c in self.pool[1:]:
                self.out.verdicts[c.label()] = "not tried: the job is too short for trials"
            self.pool = [self.stock]
            return False
        for c in self.pool[fits:]:
            self.out.verdicts[c.label()] = (f"not tried: the first round affords {fits} "
                                            f"trials ({estimate})")
        self.pool, self.held = self.pool[:fits], self.pool[fits:]
        return True

    def record(self, trials: Sequence[Trial]) -> None:
        out = self.out
        out.rounds += 1
        trials = [replace(t, round=out.rounds) for t in trials]
        if self.confirming:  # (stock's second trial: it changes no pool, the search ends)
            self.confirming = False
            for t in trials:
                out.trials.append(t)
                out.spent_s += cost(t)
            self.confirm = next((t for t in trials if t.configuration == self.stock
                                 and t.s_per_step is not None), None)
            return
        results = {t.configuration: t for t in trials}
        for t in trials:
            if not t.skipped:
                out.trials.append(t)
                out.spent_s += cost(t)
        # a candidate the budget stopped in this round before it measured anything keeps
        # what it measured in the rounds before: the round ran out of budget, and the
        # search ends on the evidence it has (an interrupted round must not undo a win)
        kept = {c: self.last[c] for c, t in results.items()
                if t.capped and self.last.get(c) is not None
                and self.last[c].s_per_step is not None}
        self.last.update({c: t for c, t in results.items() if c not in kept})
        if kept:
            self.finished = True
        base = results.get(self.stock)
        if out.rounds == 1:  # (the job's length, as stock's first trial measured it)
            self.job_steps = self.steps_for(base)
        budget = self._budget(base, first_round=out.rounds == 1)
        if out.rounds > 1 and budget < self.budget_s:  # (stock's first trial was disturbed)
            out.rebased_on = out.rounds
        out.budget_s = self.budget_s = budget
        if base is None or base.s_per_step is None:  # nothing to compare with
            out.verdicts[self.stock.label()] = "stock failed: " + str(
                base.failed if base else "not measured")
            for c in self.pool[1:]:  # (each with what its own trial came to)
                out.verdicts[c.label()] = (_not_measured(results.get(c))
                                           or "not compared: stock measured nothing")
            self.pool, self.finished = [self.stock], True
            return
        ranked = []
        for c in self.pool[1:]:
            t = kept.get(c) or results.get(c)
            why = _not_measured(t) or changes_result(t, base, self.tolerance)
            if why:
                out.verdicts[c.label()] = why
                continue
            ranked.append((job_seconds(t, self.job_steps), c))
        ranked.sort(key=lambda x: x[0])
        keep = max(1, len(ranked) // self.eta) if len(ranked) > 1 else len(ranked)
        for secs, c in ranked[keep:]:
            out.verdicts[c.label()] = (f"dropped in round {out.rounds}: {secs:.0f} s for the "
                                       f"job, the better {keep} went on")
        # one that lost a round to stock cannot be chosen (:meth:`_lost_to_stock`): its
        # trials in later rounds would spend the budget on nothing
        going = []
        for _, c in ranked[:keep]:
            lost = self._lost_a_round(c)
            if lost:
                out.verdicts[c.label()] = (f"dropped in round {out.rounds}: {lost[0]}; a "
                                           f"candidate must beat stock in every round")
            else:
                going.append(c)
        self.pool = [self.stock] + going
        if self.finished or (not going and self._refill(base)):
            return
        if len(self.pool) == 1 or (len(self.pool) == 2 and out.rounds > 1 and
                                   _settled(results[self.pool[1]], base, self.job_steps)):
            self.finished = True
        self.steps *= self.eta

    def _refill(self, base: Trial) -> bool:
        """Where a round left no candidate going on (each lost to stock, failed or changed
        the result) and the first round's predicted cost cut candidates (``held``), the
        best-ranked of them run in a round of their own, at the first round's steps, as
        many as the budget has left a trial each at stock's cost in the round ``base``
        (stock's trial beside them included); True where they do.  The first round is cut
        on a prediction, and the budget is then re-based on stock's measured job: a user's
        MLP, predicted at 0.11 s a step, measured 0.19 s, so the budget rose from 27 s to
        47 s, while the first round had been cut to stock and one candidate, which lost to
        stock, and the search ended with 31 s left and bf16 untried.  Stock has then run
        twice, so a candidate chosen on this round needs no second stock trial."""
        each = _estimate(base, self.first_steps)
        if not self.held or self.out.rounds >= self.max_rounds or each <= 0:
            return False
        fits = int((self.budget_s - self.out.spent_s) // each) - 1  # (less stock's trial)
        if fits < 1:
            return False
        taken, self.held = self.held[:fits], self.held[fits:]
        for c in taken:  # (their "not tried" verdicts: a new one comes from their round)
            self.out.verdicts.pop(c.label(), None)
        self.pool, self.steps = [self.stock] + taken, self.first_steps
        return True

    def _choice(self) -> tuple[Configuration, dict[Configuration, str]]:
        """The fastest of the last round that was faster than stock by ``min_gain`` in
        every round both ran, and on average by more than the trials' ``scatter`` allows
        (stock if none was); and why the others faster than stock are not trusted to be."""
        base, lost = self.last.get(self.stock), {}
        if base is None or base.s_per_step is None:
            return self.stock, lost
        own = job_seconds(base, self.job_steps)  # (stock's trial in the last round)
        best, best_s = self.stock, job_seconds(self.stock_trial(), self.job_steps)
        for c in self.pool[1:]:
            t = self.last.get(c)
            if t is None or t.s_per_step is None or changes_result(t, base, self.tolerance):
                continue
            secs = job_seconds(t, self.job_steps)
            why = self._lost_to_stock(c) if secs < own else None
            if why:
                lost[c] = why
            elif secs < best_s:
                best, best_s = c, secs
        return best, lost

    def stock_broken(self) -> Optional[str]:
        """Why stock's trial failed where the script itself raised there (None otherwise):
        the job, of stock's configuration where nothing else measured, would fail the
        same way."""
        return _script_broke(self.last.get(self.stock))

    def stock_trial(self) -> Optional[Trial]:
        """Stock's trial whose figure counts for the job: its last round's, or its second
        trial, run to confirm (:meth:`_confirmation`), where that measured it faster."""
        base = self.last.get(self.stock)
        if base is None or self.confirm is None:
            return base
        return min(base, self.confirm, key=lambda t: job_seconds(t, self.job_steps))

    def _finish(self) -> None:
        """The final choice (:meth:`_choice`), with every candidate's verdict."""
        self.finished = True
        out, base = self.out, self.last.get(self.stock)
        if base is None or base.s_per_step is None:
            out.chosen = self.stock
            return None
        best, lost = self._choice()
        for c, why in lost.items():
            out.verdicts.setdefault(c.label(), why)
        for c in self.pool[1:]:
            out.verdicts.setdefault(c.label(), self._chosen(c) if c == best else
                                    f"slower than {best.label()} for {_job(self.job_steps)}")
        stock_s = job_seconds(self.stock_trial(), self.job_steps)
        again = ("" if self.confirm is None else
                 f"; its second trial, run to confirm: {self._seconds(self.confirm)}")
        out.verdicts[self.stock.label()] = (
            f"chosen (nothing measured faster without changing the result{again})"
            if best == self.stock else f"stock: {stock_s:.0f} s for the job{again}")
        out.chosen = best
        return None

    def _side_by_side(self, c: Configuration) -> list[tuple[int, float, float, int]]:
        """Each round ``c`` and stock both ran in: (round, c's job seconds, stock's, and
        the round of the stock trial that is, 0 for the round's own).  Stock's figure is
        the faster of its own trial in that round and its trials in rounds ``c`` measured
        nothing in (its second trial, run to confirm: :meth:`_confirmation`; a round whose
        trial of ``c`` its time cap stopped): a slow stock trial must not make ``c`` look
        faster."""
        paired, unpaired = self._stock_trials(c)
        other = min(unpaired, key=lambda t: job_seconds(t, self.job_steps), default=None)
        other_s = math.inf if other is None else job_seconds(other, self.job_steps)
        out = []
        for n, a, b in paired:
            own = job_seconds(b, self.job_steps)
            out.append((n, job_seconds(a, self.job_steps), *(
                (other_s, other.round) if other_s < own else (own, 0))))
        return out

    def _stock_trials(self, c: Configuration) -> tuple[list[tuple[int, Trial, Trial]],
                                                        list[Trial]]:
        """Stock's measured trials as ``c`` is judged against them: (round, c's trial,
        stock's) for each round both measured in; stock's trials in the other rounds."""
        rounds: dict[int, dict[Configuration, Trial]] = {}
        for t in self.out.trials:
            if t.s_per_step is not None:
                rounds.setdefault(t.round, {})[t.configuration] = t
        paired, unpaired = [], []
        for n in sorted(rounds):
            a, b = rounds[n].get(c), rounds[n].get(self.stock)
            if b is not None:
                (paired.append((n, a, b)) if a is not None else unpaired.append(b))
        return paired, unpaired

    def _seconds(self, t: Trial) -> str:
        return f"{job_seconds(t, self.job_steps):.0f} s for the job, {t.s_per_step:.4g} s a step"

    def _chosen(self, c: Configuration) -> str:
        """The chosen candidate's verdict: its gain over stock in each round."""
        pairs = self._side_by_side(c)
        gains = ", ".join(f"{1.0 - mine / stock:.1%} in round {n}" + (
            f" against stock's trial in round {other}, the faster" if other else "")
            for n, mine, stock, other in pairs)
        return (f"chosen: faster than stock by {gains} (at least {100 * self.min_gain:g}% "
                f"needed in each, and {self._needed(len(pairs)):.1%} over "
                f"{len(pairs)} round(s) for what trials scatter by)")

    def _needed(self, rounds: int) -> float:
        return scatter_gain(rounds, self.scatter)

    def _lost_a_round(self, c: Configuration) -> Optional[tuple[str, str]]:
        """The first round in which ``c`` and stock ran side by side and ``c`` would not
        have made the job ``min_gain`` faster: (what it measured there, what that says),
        None where there is none.  It is not trusted to be faster whatever it measures after
        (:meth:`_lost_to_stock`)."""
        for n, mine, stock, other in self._side_by_side(c):
            again = f" in its trial in round {other}, the faster" if other else ""
            if mine >= stock:
                return (f"not faster than stock in round {n} ({mine:.0f} s for the job "
                        f"against stock's {stock:.0f} s{again})", "not consistently faster")
            if not clears_margin(mine, stock, self.min_gain):
                return (f"{1.0 - mine / stock:.1%} faster than stock in round {n} ({mine:.0f} s "
                        f"for the job against stock's {stock:.0f} s{again}), less than the "
                        f"{100 * self.min_gain:g}% a gain must clear",
                        "within what two trials scatter by")
        return None

    def _lost_to_stock(self, c: Configuration) -> Optional[str]:
        """Why ``c`` is not trusted to be faster than stock: a round in which the two ran
        side by side and ``c`` would not have made the job ``min_gain`` faster, or an
        average gain over those rounds within their scatter (None: it is trusted)."""
        lost = self._lost_a_round(c)
        if lost:
            return f"{lost[0]}: {lost[1]}, stock kept"
        pairs = self._side_by_side(c)
        if pairs and self.scatter > 0:
            mean = sum(math.log(stock / mine) for _, mine, stock, _ in pairs) / len(pairs)
            gain, need = 1.0 - math.exp(-mean), self._needed(len(pairs))
            against = "".join(f" (round {n} against stock's {stock:.0f} s in its trial in "
                              f"round {other})" for n, _, stock, other in pairs if other)
            if gain <= need:
                return (f"{gain:.1%} faster than stock over {len(pairs)} round(s){against}, "
                        f"less than the {need:.1%} a gain must show in as many rounds: a "
                        f"round's ratio to stock scatters by {100 * self.scatter:.1f}%, so not "
                        f"shown to be faster, stock kept")
        return None

    def outcome(self) -> Outcome:
        if not self.finished:
            self._finish()
        return self.out

    # -- between calls -------------------------------------------------------------
    def state(self) -> dict:
        def trial(t: Trial) -> dict:
            return {**t.__dict__, "configuration": t.configuration.model_dump(mode="json")}
        return {"stock": self.stock.model_dump(mode="json"), "job_steps": self.job_steps,
                "walltime_s": self.walltime_s, "epochs": self.epochs,
                "budget_s": self.budget_s, "budget_fraction": self.budget_fraction,
                "trial_overhead_s": self.trial_overhead_s, "s_per_step": self.s_per_step,
                "warmups": [[c.model_dump(mode="json"), s] for c, s in self.warmups.items()],
                "eta": self.eta, "tolerance": self.tolerance,
                "max_rounds": self.max_rounds, "min_gain": self.min_gain,
                "scatter": self.scatter,
                "steps": self.steps, "first_steps": self.first_steps,
                "held": [c.model_dump(mode="json") for c in self.held],
                "finished": self.finished,
                "confirming": self.confirming, "confirmed": self.confirmed,
                "confirm": None if self.confirm is None else trial(self.confirm),
                "earlier": [trial(t) for t in self.earlier],
                "pool": [c.model_dump(mode="json") for c in self.pool],
                "rounds": self.out.rounds, "spent_s": self.out.spent_s,
                "rebased_on": self.out.rebased_on,
                "verdicts": self.out.verdicts, "trials": [trial(t) for t in self.out.trials],
                "last": [trial(t) for t in self.last.values()]}

    @classmethod
    def from_state(cls, st: dict) -> "Halving":
        def trial(d: dict) -> Trial:
            return Trial(**{**d, "configuration": Configuration(**d["configuration"])})
        h = cls([], Configuration(**st["stock"]), job_steps=st["job_steps"],
                budget_s=st["budget_s"], eta=st["eta"], loss_tolerance=st["tolerance"],
                max_rounds=st["max_rounds"], budget_fraction=st.get("budget_fraction"),
                trial_overhead_s=st.get("trial_overhead_s", 0.0),
                s_per_step=st.get("s_per_step"), min_gain=st.get("min_gain", MIN_GAIN),
                walltime_s=st.get("walltime_s"), scatter=st.get("scatter", TRIAL_SCATTER),
                first_steps=st.get("first_steps", st["steps"]), epochs=st.get("epochs"),
                earlier=[trial(d) for d in st.get("earlier", ())],
                warmups={Configuration(**c): s for c, s in st.get("warmups", ())})
        h.pool = [Configuration(**c) for c in st["pool"]]
        h.held = [Configuration(**c) for c in st.get("held", [])]
        h.steps, h.finished = st["steps"], st["finished"]
        h.out.rounds, h.out.spent_s = st["rounds"], st["spent_s"]
        h.out.rebased_on = st.get("rebased_on")
        h.out.verdicts = dict(st["verdicts"])
        h.out.trials = [trial(d) for d in st["trials"]]
        h.last = {t.configuration: t for t in map(trial, st["last"])}
        h.confirming, h.confirmed = st.get("confirming", False), st.get("confirmed", False)
        h.confirm = trial(st["confirm"]) if st.get("confirm") else None
        return h


def search(candidates: Sequence[Configuration], stock: Configuration,
           run: Callable[[Configuration, int, Optional[float]], Trial], *,
           job_steps: Optional[int], budget_s: float,
           first_steps: int = 10, eta: int = 2, loss_tolerance: float = 0.05,
           max_rounds: int = 4, budget_fraction: Optional[float] = None,
           trial_overhead_s: float = 0.0, s_per_step: Optional[float] = None,
           min_gain: float = MIN_GAIN, walltime_s: Optional[float] = None,
           scatter: float = TRIAL_SCATTER, epochs: Optional[int] = None,
           earlier: Sequence[Trial] = (),
           warmups: Optional[dict[Configuration, float]] = None) -> Outcome:
    """Successive halving over ``candidates`` (stock added if missing), within ``budget_s``
    seconds of trials; see the module docstring.  ``run(configuration, steps, cap)`` runs
    one trial, stopping it after ``cap`` seconds (None: no cap) as the runtime does with
    ``MODAK_MAX_SECONDS``; ``earlier``: earlier searches' trials stopped while compiling
    (:func:`compiled_earlier`); ``warmups``: candidates' predicted warm-up beyond stock's,
    which the first round's cut counts."""
    h = Halving(candidates, stock, job_steps=job_steps, budget_s=budget_s,
                first_steps=first_steps, eta=eta, loss_tolerance=loss_tolerance,
                max_rounds=max_rounds, budget_fraction=budget_fraction,
                trial_overhead_s=trial_overhead_s, s_per_step=s_per_step, min_gain=min_gain,
                walltime_s=walltime_s, scatter=scatter, epochs=epochs, earlier=earlier,
                warmups=warmups)
    while True:
        step = h.next_round()
        if step is None:
            return h.outcome()
        pool, steps = step
        done: list[Trial] = []
        for c in pool:  # (stock first)
            why = h.skip(c, done)
            done.append(Trial(c, 0, None, failed=why, skipped=True) if why
                        else run(c, steps, h.cap(c, done)))
        h.record(done)


def _estimate(trial: Optional[Trial], steps: int) -> float:
    if trial is None or trial.s_per_step is None or trial.steps <= 0:
        return 0.0
    # start-up, warm-up, and what the deploy spent around the job
    fixed = max(0.0, trial.wall_s - trial.s_per_step * trial.steps) + trial.path_s
    return fixed + trial.s_per_step * steps


def _settled(t: Trial, stock: Trial, job_steps: Optional[int]) -> bool:
    """Two left and a clear difference (over 20%): more steps will not change the order."""
    a, b = job_seconds(t, job_steps), job_seconds(stock, job_steps)
    return max(a, b) > 1.2 * min(a, b)
