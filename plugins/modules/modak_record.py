#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_record
short_description: Record a job's figures of merit in MODAK's results store
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin). Reads the figure-of-merit records (JSON objects
    with C(modak) set to C(fom), schema 2) that MODAK's runtime printed into the job's (fetched)
    output and appends them to the results store that the performance model reads, once per run.
  - Each row names where the run ran, the target and the plan's image, or C(host) when the plan
    runs no container (the job ran in the host's environment, not the image's).
  - A record of a failed run is stored too (with the knob it failed under), so that the planner
    does not offer that configuration for that workload on that target and image again.
  - Where the job made one run, its row keeps the job's clock around the launch (C(job_s), the
    C(elapsed_s) of the job line the job script prints last), from which a later search at that
    target estimates what a trial costs besides its training (modak.modak.modak_search); and,
    given O(started), what the deploy spent around the job up to its record (C(path_s)).
  - A job that printed no figure of merit is a failed run (unless O(require=false)).
options:
  output:
    description: The job's output file on the controller.
    type: path
    required: true
  plan:
    description: The plan (modak_plan's C(plan) return value).
    type: dict
    required: true
  store:
    description: The results store; default C($MODAK_RESULTS) or C(~/.local/share/modak/results.sqlite).
    type: path
  source:
    description: What produced the measurement.
    type: str
    choices: [deploy, autotune, campaign]
    default: deploy
  started:
    description:
      - When the tasks that ran this job started (seconds since the epoch, on the controller;
        a search's trial from its first task). Where given and the job's row keeps its clock
        (C(job_s)), the row also keeps what the deploy spent around the job up to its
        record (C(path_s)), which a later search at the target counts in a trial's cost.
    type: float
  repeat:
    description:
      - The round of a series of interleaved runs this run was in (a search's round, from 1).
      - The performance model compares the runs of one round with one another; an C(autotune)
        run with it belongs to its search round, not only to the minutes it ran in, so a
        later plan compares the search's candidates with stock round by round, as the search
        did.
    type: int
  require:
    description: Fail when the output holds no figure of merit.
    type: bool
    default: true
  refit:
    description:
      - After recording new figures, refit the performance model (the quick estimators, the
        linear models, split gradient boosting and extra trees, on the shipped datasets and
        the results store; the best on held-out workload families is kept) and save it where
        C(modak plan) finds it (C($MODAK_MODEL) or C(~/.local/share/modak/model.joblib)).
      - A saved model of another estimator (a full C(modak model fit)), or one fitted on more
        measurements than the shipped datasets and the store hold, is kept, not replaced; it
        reads the new figures from the results store when it plans.
    type: bool
    default: false
author:
  - MODAK developers (@modak)
notes:
  - Supports check mode (nothing is written).
"""

EXAMPLES = r"""
- name: Record the run's measurements
  modak.modak.modak_record:
    output: build/results/r1a2b3c4/mnist-cnn.out
    plan: "{{ modak_plan.plan }}"
"""

RETURN = r"""
recorded:
  description: Rows added to the store (0 when this run was recorded before, or measured nothing).
  returned: always
  type: int
store:
  description: The results store's path.
  returned: when figures were found
  type: str
measured:
  description:
    - The last record's speed (steps_per_s, s_per_step, samples_per_s, warmup_s, steps,
      final_loss; end_loss, the mean of the losses sampled over the second half of its
      steps, which the search compares with stock's; start_loss, the first loss sampled
      (how far stock's trial lowered its loss sets the scale of that comparison);
      startup_s, the runtime's clock until training began; and runtime_s, the runtime's
      clock until the run ended, the record's wall_s; losses, the [step, loss] pairs the
      runtime sampled, from which the search reads a longer trial's losses after a shorter
      one's steps; steps_per_epoch, the optimizer steps an epoch of the script makes as the
      runtime measured them, null where it could not, which set the length of a job stated
      in epochs). Null when it measured no step
      time, except for a trial stopped at its time cap before it measured one (status
      capped; stored only where it was compiled, as how long its compilation ran at
      least, never as a measurement), whose s_per_step is null and whose steps, startup_s and
      runtime_s say how far it got (the search judges by them whether another trial of the
      same compiler can finish compiling within its cap).
  returned: always
  type: dict
status:
  description: The last record's status (ok, capped, failed).
  returned: when figures were found
  type: str
error:
  description:
    - Why the run failed (type, message, and the knob it is blamed on, if any); for a
      trial stopped at its time cap before it measured a step time, type V(TimeCap).
  returned: when figures were found
  type: dict
script_failed:
  description:
    - The exception the script itself failed with, its type and message (cut at 300
      characters), and where a module it could not import belongs (C(application.pip_packages)
      for a container's image, the job's own Python where no container runs it,
      C(application.files) for the user's own), as the deploy's failure line says it. Null
      where the run did not fail in the script (no error, or one blamed on a knob).
  returned: when figures were found
  type: str
run_again:
  description:
    - For a run whose script failed (RV(script_failed)), that a deploy of the same request
      finds it as it ended, and how to run it anew once the cause is fixed outside the
      request's files; for a run that failed under a knob, how to plan it again without
      that configuration. The deploy's failure line says it. Null otherwise.
  returned: when figures were found
  type: str
applied:
  description: The knobs the runtime applied, and how.
  returned: when figures were found
  type: dict
not_applied:
  description: The knobs the runtime could not apply to this script, and why.
  returned: when figures were found
  type: dict
effect:
  description: What was in effect (matmul dtype, compiled, threads, allocator loaded, ...).
  returned: when figures were found
  type: dict
fingerprint:
  description: The workload's fingerprint id.
  returned: when figures were found
  type: str
probed:
  description:
    - The target's figures (gflops_fp32, gflops_bf16, bandwidth_gbs; on a GPU also op_us, the
      time of one small operation) that the job measured
      first, because they were not known; they are remembered for the target and its image
      and describe it to the performance model from then on.
  returned: when the job probed its target
  type: dict
refit:
  description: The id of the refitted model, or why the refit was skipped or the saved model
    kept.
  returned: when figures were found
  type: str
refitted:
  description: Whether the model was fitted again on this run (C(refit) is then its id).
  returned: when figures were found
  type: bool
predicted_s_per_step:
  description: What the plan predicted for the chosen configuration, if a model predicted.
  returned: when figures were found
  type: float
"""
