#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: modak_plan
short_description: Plan a training job and render its recipes and job script
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin). Reads a TOSCA blueprint or a MODAK DSL
    document, asks MODAK's planner for the configuration, and writes C(plan.json), the job
    script and the container recipes into O(out_dir)/RUN_ID.
  - Needs the C(modak) Python package of the collection's own version on the controller
    (C(pip install modak==VERSION)); a different version is an error saying so.
  - The same request for the same target is the same run - its plan is reused (the run is
    never submitted twice) until O(new_run) asks for a new one, which plans again with
    everything measured since.
  - Warns, before any image is built or trial run, of what the job would lack - modules of
    the user's that its files import from beside the script but the run directory does not
    receive; and, for an image that installs its Python packages from a wheelhouse, the
    imports (outside a C(try) that catches C(ImportError)) and the recipe's distributions
    that no wheel in O(wheelhouse) provides, with the command that downloads them. What an
    image installed from a package index, or the front-end's own Python, provides is not
    known on the controller and not checked. A trial's plan (O(max_steps)) says none of it.
options:
  request:
    description: The TOSCA blueprint or MODAK DSL document. One of O(request) and O(nodes).
    type: path
  nodes:
    description:
      - The properties of an AITrainingJob node and its HPCTarget host, as an orchestrator
        (xOpera) evaluated them; keys C(job) and C(target), each with C(name) and C(properties).
    type: dict
  infra:
    description: An infrastructure file describing the target's hardware.
    type: path
  inputs:
    description: TOSCA inputs, as a mapping or the path of a YAML/JSON file.
    type: raw
  node:
    description: The AITrainingJob node, when a blueprint has several.
    type: str
  target:
    description:
      - Target fields that replace the request's (for example the inventory's C(scheduler),
        C(container_runtime), C(frontend)), validated like an infrastructure file.
    type: dict
    default: {}
  out_dir:
    description:
      - Directory on the controller; the plan goes into a folder named by the run id.
      - Default - C(plans/) in the user's MODAK directory (C($MODAK_HOME), else
        C($XDG_DATA_HOME/modak), else C(~/.local/share/modak)).
    type: path
  results_dir:
    description:
      - Where the play fetches job outputs to (returned in RV(dirs), one folder per run).
      - Default - C(results/) in the user's MODAK directory.
    type: path
  run_id:
    description:
      - The run id; default a hash of the job script MODAK renders (anything that changes the
        script, such as another image or choice, is another run).
      - The plan of a request is pinned, so that the same request for the same target is one
        run even after the model was refitted.
    type: str
  new_run:
    description: Append a timestamp to the run id, so that the job is submitted again.
    type: bool
    default: false
  ca_certs:
    description: Recipes copy C(certs/) from the build context into the image.
    type: bool
    default: false
  force:
    description:
      - Choose this candidate configuration (C(image), C(compiler), C(threads), C(allocator),
        C(precision)), for an autotuning trial of it; it must be one of the request's candidates.
    type: dict
  max_steps:
    description:
      - A trial - the runtime stops the script after this many optimizer steps
        (C(MODAK_MAX_STEPS)); V(0) runs it to its end.
      - A trial (this, O(max_seconds) or O(trial_round) set) also has its random number
        generators seeded alike (C(MODAK_SEED)), so that trials of different
        configurations start from the same weights and batches and their losses compare.
    type: int
    default: 0
  max_seconds:
    description:
      - A trial - the runtime stops the script after this many seconds from its start
        (C(MODAK_MAX_SECONDS)), even inside a step (a compilation); V(0) sets no time cap.
        The budgeted search sets it to the trial's share of its budget.
    type: float
    default: 0
  trial_round:
    description:
      - A trial - the budgeted search's round it runs in, exported to the job as
        C(MODAK_SEARCH_ROUND); V(0) - not a trial of the search.
      - Part of the run's identity, as O(max_steps) is - a configuration tried again in a
        later round at the same steps (stock's second trial, run to confirm a choice) is a
        run of its own; a resumed search finds each round's trial again.
    type: int
    default: 0
  trial_search:
    description:
      - A trial - the budgeted search it is part of (the deploy gives modak.modak.modak_search's
        C(search_id)), exported to the job as C(MODAK_SEARCH) and part of the run's identity -
        a later search's trial of a configuration is a run of its own, measured beside that
        search's other trials, not an earlier search's found again; a resumed search finds its
        own trials again. Ignored for a plan that is not a trial.
    type: str
    default: ""
  extra_arguments:
    description: Arguments appended to the application's (a script's own option for a short run).
    type: list
    elements: str
    default: []
  files:
    description:
      - Controller paths (files or directories) the run directory receives instead of the
        request's own files; each keeps its name there.
      - Default - the request's C(application.files) and its script, else the script's
        directory (relative to the request file), see C(modak_lib/readers/appfiles.py).
    type: list
    elements: path
    default: []
  files_dir:
    description:
      - The directory the application's files are relative to when the request came from
        orchestrator nodes (O(nodes)), not from a file (e.g. the root of a CSAR).
    type: path
  wheelhouse:
    description:
      - The directory of wheels that an offline image build installs from (the play's
        C(modak_wheelhouse)); the default is C(wheelhouse/) in the user's MODAK directory.
    type: path
  model:
    description:
      - The performance model - V(auto) (the saved one, fitted on first use), V(none) (the
        rule-based prior), or the path of a model file.
    type: str
    default: auto
author:
  - MODAK developers (@modak)
notes:
  - Supports check mode (nothing is written).
"""

EXAMPLES = r"""
- name: Plan the MNIST-CNN example for the inventory's front-end
  modak.modak.modak_plan:
    request: examples/mnist-cnn/blueprint.yaml
    infra: examples/infra/local-frontend.yaml
    target:
      scheduler: slurm
      container_runtime: podman
  register: modak_plan
"""

RETURN = r"""
plan:
  description: The plan (the content of plan.json).
  returned: success
  type: dict
plan_dir:
  description: The folder on the controller holding plan.json, the job script and recipes.
  returned: success
  type: str
run_id:
  description: The run id.
  returned: success
  type: str
files:
  description: The names of the files written.
  returned: success
  type: list
  elements: str
stdout:
  description: The job's standard output file name.
  returned: success
  type: str
stderr:
  description: The job's standard error file name, when separate.
  returned: success
  type: str
walltime:
  description: The job's wall-time limit in seconds, if any.
  returned: success
  type: int
predicted_s:
  description: The predicted seconds per step of the chosen configuration, when a model predicted.
  returned: success
  type: float
chosen:
  description: The chosen configuration, as one line.
  returned: success
  type: str
decided_by:
  description: What decided (prior, model, autotune).
  returned: success
  type: str
dirs:
  description:
    - The controller directories of this play - C(plans), C(results) (job outputs are
      fetched to RESULTS/RUN_ID) and C(wheelhouse) (wheels copied into offline image builds).
  returned: success
  type: dict
wheels:
  description:
    - The wheels of the wheelhouse (file names in C(dirs.wheelhouse)) that the image installs -
      its own distributions and the request's C(pip_packages), with what they require - which
      are all an image's build is given of a wheelhouse that serves several images.
    - C(null) where that is not known for sure (an image that installs no wheels, a wheelhouse
      without wheels or with a wheel that cannot be read, a distribution without a wheel) -
      the build is given the whole wheelhouse.
  returned: success
  type: list
  elements: str
app_files:
  description:
    - What the run directory receives - the user's files and the runtime (C(modak_runtime/)),
      each as C(src) (controller path) and C(dest) (path in the run directory).
  returned: success
  type: list
  elements: dict
"""
