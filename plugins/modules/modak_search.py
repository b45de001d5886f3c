#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_search
short_description: One step of MODAK's budgeted search over short trials
version_added: "0.2.0"
description:
  - Runs on the controller (an action plugin). Successive halving over the plan's candidates
    with stock always among them - each round runs short trials of the user's script through
    the job path (the playbook does), this step records their figures and says which
    candidates go on for twice as many steps (the better half, less those that already lost
    a round to stock by the rules below and so cannot be chosen), until one is left, the
    results are clear, the rounds run out or the next round would exceed the budget.
  - A candidate whose loss after its trial is worse than stock's beyond O(loss_tolerance)
    is rejected as changing the result (the losses the runtime sampled over the trial's
    second half, averaged, against stock's over the same steps; the last ones for a record
    without them; the tolerance a fraction of stock's loss or, where larger, of how far
    stock's trial lowered it); compile time is weighed against the job's steps
    (O(job_steps)); the choice is never slower than the stock trial as measured, in any
    round the two ran side by side, and faster by at least O(min_gain) in each of them
    and, on average over them, by more than O(scatter) over the square root of their number
    (else stock is kept).
  - Where the choice would rest on one round beside a single stock trial, and the budget
    has a stock trial left, one more round runs stock alone at its last trial's steps (its
    second trial, to confirm); the choice must beat the faster of stock's trials, since a
    single trial can run far slower than usual and make any candidate look faster.
  - The budget is O(budget_fraction) of the job's expected run time (its steps at stock's
    predicted speed, else its wall time); the first round is cut to the trials the budget
    affords at O(trial_overhead_s) each (else what earlier trials at the target took
    besides their training, as the results store O(store) kept them) plus their steps and
    a candidate's predicted warm-up beyond stock's (a compiler's; none where fewer than two
    fit, and stock is kept), and after it, for a job of known steps (O(job_steps) or the plan's
    C(steps), stated or measured by its last full run) or of stated epochs (the plan's
    C(epochs), whose steps are as many as an epoch made in stock's first trial), the budget
    is re-based on the job's time at stock's measured speed, once (a later round's stock
    trial does not move it, unless it ran 2x faster or more than the first, which was then
    disturbed - the budget is re-based on it, never below what was spent).
  - Each candidate's trial is capped at its share of what the budget has left (O(cap_for)
    asks for it just before the trial runs), so that a compilation longer than the budget
    ends its trial, not the budget; stock's trial in a round is not capped, its second trial
    (alone, after the last round) is capped at what the budget has left less the job path's
    time outside the runtime's clock in stock's trial before it. In the first round what is
    left is counted less as much again as stock's trial took and half a second (a capped
    trial ends a little past its cap), kept for stock's second trial. The cap runs on the
    runtime's clock, so a share is given less twice the job path's time outside that clock
    (scheduler, container, the record) as stock's trial in the round took it (its
    C(elapsed_s) less its C(measured.runtime_s)), since a trial stopped at its cap took up to
    2.1x stock's, ending its processes.
  - Where what the budget has left after stock's trial does not afford the round's
    candidates still to run the shortest cap each, the worst-ranked, with nothing
    measured from an earlier round, are not tried (returned as C(skip)), since a job
    measured that short is too short for trials to pay for themselves. The shortest cap
    is what stock's trial in the round took on the runtime's clock to measure a step time
    (the script's start-up, its warm-up and two steps; at least one second), plus twice
    the job path's time outside that clock, since a shorter share ends before any
    configuration measures one. Nor is a compiled candidate tried after a trial of the
    same compiler in the same image was stopped at its cap while compiling (its
    C(measured.runtime_s) past its C(measured.startup_s), no step time), unless its own cap
    is 1.5x that trial's C(measured.runtime_s); its share goes to the candidates after it.
  - Settings out of their range fail the task before anything starts, each named with the
    deploy's variable that sets it - O(budget_fraction) above 0 and at most 10,
    O(candidates) from 1 to 64, O(first_steps) at least 2, O(max_rounds) from 1 to 10,
    O(job_steps) and O(trial_overhead_s) not negative, O(loss_tolerance) from 0 to 10,
    O(min_gain) from 0 to below 1, O(scatter) from 0 to 5.
options:
  plan:
    description: The plan (modak_plan's C(plan) return value) whose candidates are searched.
    type: dict
    required: true
  state:
    description: The search's state file on the controller (created by the first step).
    type: path
    required: true
  record:
    description:
      - The trials of the round just run - each C(configuration) (as in the plan),
        C(measured) (modak_record's return value), C(status), C(error), C(not_applied)
        (modak_record's - a trial with a knob not applied measured another configuration
        and counts as failed, unless that knob was at stock's value, as where the script
        sets its own threads), C(elapsed_s) (the job's), C(path_s) (the trial's tasks'
        whole time, its job's included; optional), C(build_s) (of that, building its image,
        where the trial built it; spent once, not foreseen for later trials; optional) and
        C(run_id) (the trial's run, optional); C(status=skipped) for a trial not run
        (C(skip)).
    type: list
    elements: dict
    default: []
  cap_for:
    description:
      - Only say the time cap of the round's trial of this configuration (returned as
        C(cap)), or why it is not to run (C(skip)), given the round's trials run so far
        (O(done)); nothing is recorded.
    type: dict
  done:
    description: With O(cap_for), the round's trials run so far (as in O(record)).
    type: list
    elements: dict
    default: []
  candidates:
    description:
      - How many of the plan's top candidates to try besides stock when it proposes none
        (as the planner proposes them, at most two of them compiled ones never measured
        here, and those run after the others in each round).
    type: int
    default: 3
  budget_fraction:
    description: The trial budget as a fraction of the job's expected run time.
    type: float
    default: 0.1
  job_steps:
    description: Optimizer steps the job will run (0 - the plan's C(steps), which the request's
      application states or its last full run under the same arguments made; else the
      plan's C(epochs) times the steps an epoch made in stock's first trial; else as many as
      the plan's wall time holds at stock's speed as its first trial measures it; none of
      these - candidates are compared per step, their warm-up not counted).
    type: int
    default: 0
  first_steps:
    description: Steps of the first round's trials (each round doubles them).
    type: int
    default: 10
  trial_overhead_s:
    description:
    - What one trial costs besides its steps (start-up through the job path, warm-up), in
      seconds, before any trial of this search has measured it. With stock's predicted
      seconds per step, and each candidate's predicted warm-up beyond stock's, it estimates
      the first round, which is cut to the trials the budget affords (stock and the
      best-ranked candidates); where it affords fewer than two, no trial runs and stock is
      kept.
    - Unset, the median of what the latest five earlier trials at the plan's target (run as
      this search's will be, in a container or outside any; the workload's own where it has
      some there) took besides their training
      (their job's clock around the launch less the runtime's clock of their training), as
      the results store O(store) kept them; 10 where none was kept.
    type: float
  store:
    description: The results store whose earlier trials at the target measured what a trial
      costs there besides its training; default C($MODAK_RESULTS) or
      C(~/.local/share/modak/results.sqlite).
    type: path
  max_rounds:
    description:
      - Rounds at most, besides stock's second trial (one more round, of stock alone, where
        the choice rests on one round).
    type: int
    default: 3
  loss_tolerance:
    description: How much worse than stock's a trial's loss (its mean over the trial's
      second half) may be, as a fraction of stock's loss or, where that is larger, of how
      far stock's trial lowered its loss from the first one it sampled.
    type: float
    default: 0.05
  min_gain:
    description:
      - How much faster than stock a candidate must make the job (a fraction of stock's
        time for it) in every round the two ran side by side to be chosen - a smaller gain
        is within what two single trials scatter by, and stock is kept.
    type: float
    default: 0.03
  scatter:
    description:
      - How far a round's time ratio of a candidate to stock scatters from one round to the
        next (a standard deviation, in log time). Over the rounds the two ran side by side,
        a candidate's average gain must be more than this over the square root of their
        number; else stock is kept.
      - The default is what the shipped campaign measured on its machines (C(modak model
        eval) prints it for the data at hand); 0 takes any gain that clears O(min_gain).
    type: float
    default: 0.091
author:
  - MODAK developers (@modak)
"""

EXAMPLES = r"""
- name: Start the search (or record a round and say what is next)
  modak.modak.modak_search:
    plan: "{{ modak_plan.plan }}"
    state: "{{ modak_plan.plan_dir }}/search.json"
    record: "{{ modak_round_trials }}"
  register: modak_search
"""

RETURN = r"""
done:
  description: Whether the search has chosen.
  returned: always
  type: bool
trials:
  description: The configurations to try in the next round (empty when done).
  returned: always
  type: list
  elements: dict
steps:
  description: The next round's steps per trial.
  returned: when not done
  type: int
cap:
  description:
    - With O(cap_for) - the seconds after which the runtime stops that trial
      (C(MODAK_MAX_SECONDS)) - what the budget has left after the trials run so far (O(done)
      included; re-based on stock's first trial once it ran; in the first round, less a second
      stock trial's cost, kept to confirm the choice), shared equally among the round's
      candidates not yet run, less twice the job path's time outside the runtime's clock
      in stock's trial; for stock's second trial, what the budget has left less that time
      outside the clock once; null for stock's trial in a round, which is not capped, and
      where the budget is unbounded.
  returned: with cap_for
  type: float
skip:
  description:
    - With O(cap_for) - why that trial is not to run (what the budget has left does not
      afford it the shortest cap after the better-ranked, and it has nothing measured to
      keep; or an earlier trial of the round, in the same image, found one of its knobs at
      the same value not applicable to the script; or an earlier trial of its compiler, in
      the same image, was stopped at its cap while compiling, and its own cap is not 1.5x
      as long), empty where it runs. The playbook then
      records it in O(record) with C(status=skipped) and this as C(error.message).
  returned: with cap_for
  type: str
chosen:
  description: The chosen configuration.
  returned: when done
  type: dict
rounds:
  description: Rounds run so far.
  returned: always
  type: int
search_id:
  description:
    - The search's id, made when it starts and kept in its state (empty for a search an
      earlier MODAK started) - its trials' plans carry it (modak.modak.modak_plan's
      O(modak.modak.modak_plan#module:trial_search)), so that another search's trial of the
      same configuration and steps is not found again in place of one of this search's own.
  returned: without cap_for
  type: str
spent_s:
  description: Seconds the trials took so far.
  returned: always
  type: float
budget_s:
  description: The trial budget in seconds.
  returned: always
  type: float
budget:
  description: How the budget was set.
  returned: on the first step
  type: str
verdicts:
  description: Per candidate, why it was dropped, rejected or chosen.
  returned: always
  type: dict
report:
  description:
    - What a user reads of the finished search, a line each - the summary, how the budget
      was set and each candidate's verdict.
  returned: when done
  type: list
  elements: str
job_s:
  description:
    - The job's time with stock and with the choice, as the trials measured them (stock's
      the faster of its last trial and its second trial, where one ran to confirm).
  returned: when done
  type: dict
script_failed:
  description:
    - Where the script itself raised in stock's trial (the runtime's record names the
      exception, blames no knob, and it is not the time cap) - why, and the trial's run;
      a job of stock's configuration would fail the same way, and the deploy stops here.
      Empty otherwise.
  returned: when done
  type: str
"""
