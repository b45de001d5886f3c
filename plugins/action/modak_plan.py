# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_plan: calls modak_lib to plan and render."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import check_library

ARGS = dict(
    request=dict(type="path"),
    nodes=dict(type="dict"),
    infra=dict(type="path"),
    inputs=dict(type="raw"),
    node=dict(type="str"),
    target=dict(type="dict", default={}),
    out_dir=dict(type="path"),
    results_dir=dict(type="path"),
    run_id=dict(type="str"),
    new_run=dict(type="bool", default=False),
    ca_certs=dict(type="bool", default=False),
    model=dict(type="str", default="auto"),
    force=dict(type="dict"),
    extra_arguments=dict(type="list", elements="str", default=[]),
    max_steps=dict(type="int", default=0),
    max_seconds=dict(type="float", default=0.0),
    trial_round=dict(type="int", default=0),
    trial_search=dict(type="str", default=""),
    files=dict(type="list", elements="path", default=[]),
    files_dir=dict(type="path"),
    wheelhouse=dict(type="path"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGS, mutually_exclusive=[("request", "nodes")],
            required_one_of=[("request", "nodes")])
        check_library("modak_plan")
        try:
            from modak_lib.perf.predictor import load_predictor
            from modak_lib.perf.search import TRIAL_SEED
            from modak_lib.errors import ModakError
            from modak_lib.files import write_atomic
            from modak_lib.imports import image_wheels, plan_warning
            from modak_lib.models import Configuration
            from modak_lib.paths import user_dir
            from modak_lib.wheelhouse import default_dir as wheelhouse_dir
            from modak_lib.pipeline import make_plan, with_target
            from modak_lib.readers import read_infra, read_request
            from modak_lib.readers.appfiles import (application_files, files_digest,
                                                    runtime_files, tree_files, unsent_names,
                                                    unsent_warning)
            from modak_lib.readers.common import load_document
            from modak_lib.readers.tosca import request_from_nodes
            from modak_lib.runs import Pins, file_digest, request_key
        except ImportError as exc:
            raise AnsibleActionFail("modak_plan needs the modak library on the controller "
                                    "(pip install modak): %s" % exc)

        # plans, fetched results and the wheelhouse live in the user's MODAK directory
        # unless the play says otherwise (never inside the installed collection)
        if not args["out_dir"]:
            args["out_dir"] = str(user_dir("plans"))
        dirs = dict(plans=args["out_dir"],
                    results=args["results_dir"] or str(user_dir("results")),
                    wheelhouse=args["wheelhouse"] or str(wheelhouse_dir()))

        # the user's files (an edited script is another run), read before anything else
        try:
            request = self._request(args, read_infra, read_request, load_document,
                                    request_from_nodes, with_target)
            if args["files"]:
                app_files = tree_files(args["files"])
            else:
                app_files = application_files(request, base=args["files_dir"])
                unsent = unsent_warning(unsent_names(request, app_files,
                                                     base=args["files_dir"]))
                if unsent:  # (Ansible prints it; the deploy goes on: it may be the output)
                    result.setdefault("warnings", []).append(unsent)
            digest = files_digest(app_files)
        except ModakError as exc:
            raise AnsibleActionFail("MODAK plan failed:\n%s" % exc)
        shipped = [dict(src=src, dest=dest) for src, dest in app_files + runtime_files()]

        # the same request on the same target is the same run: reuse its plan (so that a
        # second deploy neither re-plans with a refitted model nor submits again); a trial's
        # time cap is not part of it: a resumed search reuses the trial it ran, whatever its
        # share of the budget is worked out to be now
        key = request_key({
            "request": file_digest(args["request"]), "nodes": args["nodes"],
            "infra": file_digest(args["infra"]), "inputs": args["inputs"], "node": args["node"],
            "target": args["target"], "run_id": args["run_id"], "ca_certs": args["ca_certs"],
            "force": args["force"], "extra": args["extra_arguments"], "files": digest,
            "max_steps": args["max_steps"], "trial_round": args["trial_round"],
            "trial_search": args["trial_search"],
        })
        pins = Pins(os.path.join(args["out_dir"], "requests"))
        pinned = None if args["new_run"] else pins.get(key)
        if pinned is not None:
            # (a plan pinned by MODAK 0.2 has no run_name yet: it is JOB_NAME-RUN_ID)
            pinned["plan"].setdefault("run_name", "%s-%s" % (pinned["job_name"],
                                                             pinned["run_id"]))
            # (nor the backends' data for the front-end: the same backends give it)
            plan = pinned["plan"]
            if "job_control" not in plan:
                from modak_lib.schedulers import SCHEDULERS, scheduler_name
                plan["job_control"] = SCHEDULERS[scheduler_name(
                    plan["scheduler"])].job_control()
            if "builder" not in plan["image"]:
                from modak_lib.runtimes import RUNTIMES
                plan["image"]["builder"] = RUNTIMES[plan["runtime"]].builder(
                    wheelhouse=plan["image"].get("wheelhouse", False))
            pinned.update(changed=False, app_files=shipped, dirs=dirs,
                          wheels=image_wheels(plan["runtime"], plan["image"],
                                              dirs["wheelhouse"]),
                          msg="reusing the plan of run %s (ask for a new run to plan "
                          "again)" % pinned["run_id"])
            result.update(pinned)
            return result

        try:
            # a trial: the runtime stops after so many steps, or so many seconds (its share
            # of the search's budget)
            caps = {}
            if args["max_steps"] > 0:
                caps["MODAK_MAX_STEPS"] = str(args["max_steps"])
            if args["max_seconds"] > 0:
                caps["MODAK_MAX_SECONDS"] = "%g" % args["max_seconds"]
            # (the search's round: stock's second trial, at its first trial's steps, is a
            # run of its own, not the first trial's found again)
            if args["trial_round"] > 0:
                caps["MODAK_SEARCH_ROUND"] = str(args["trial_round"])
            # (the search's: a later search's stock trial is a run of its own, beside its
            # candidates, not an earlier search's found again)
            if args["trial_search"] and caps:
                caps["MODAK_SEARCH"] = args["trial_search"]
            if caps:  # (trials start from the same weights and batches: their losses compare)
                caps["MODAK_SEED"] = str(TRIAL_SEED)
                request = request.model_copy(update={"environment": dict(
                    request.environment, **caps)})
            if args["extra_arguments"]:  # e.g. a script's own option for a short run
                app = request.application.model_copy(update={
                    "arguments": request.application.arguments + tuple(args["extra_arguments"])})
                request = request.model_copy(update={"application": app})
            force = Configuration.model_validate(args["force"]) if args["force"] else None
            predictor = load_predictor(args["model"])
            names = tuple(pair[1] for pair in app_files)
            plan = make_plan(request, predictor=predictor, run_id=args["run_id"],
                             ca_certs=args["ca_certs"], force=force, app_files=names,
                             app_digest=digest, new_run=args["new_run"])
            # what the job would lack, said once, before any image is built or trial run
            trial = args["max_steps"] > 0 or args["max_seconds"] > 0 or args["trial_round"] > 0
            lacking = None if trial else plan_warning(plan.plan, request, app_files,
                                                      dirs["wheelhouse"],
                                                      default=not args["wheelhouse"])
            if lacking:
                result.setdefault("warnings", []).append(lacking)
        except ModakError as exc:
            raise AnsibleActionFail("MODAK plan failed:\n%s" % exc)
        run_id = plan.plan.run_id

        out = os.path.join(args["out_dir"], run_id)
        changed = False
        # each file through its own temporary name and an atomic rename: two plays of the
        # same run at once (deploy and cancel) never read a half-written file
        for name, text in plan.files.items():
            path = os.path.join(out, name)
            old = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path) as f:
                    old = f.read()
            if old != text:
                changed = True
            if not self._play_context.check_mode:
                try:
                    write_atomic(out, name, text,
                                 0o755 if name == plan.plan.job_script else 0o644)
                except ModakError as exc:
                    raise AnsibleActionFail("MODAK plan failed: %s" % exc)
        chosen = plan.plan.candidates[0]
        summary = dict(
            plan_dir=out, run_id=run_id, files=sorted(plan.files), job_name=request.job.job_name,
            stdout=plan.plan.stdout, stderr=plan.plan.stderr, walltime=plan.plan.walltime_s,
            predicted_s=chosen.prediction.seconds if chosen.prediction else None,
            chosen=plan.plan.chosen.label(), decided_by=plan.plan.decided_by,
            msg="planned %s: %s (decided by %s)" % (run_id, plan.plan.chosen.label(),
                                                    plan.plan.decided_by))
        if not self._play_context.check_mode:
            pins.put(key, summary)
        planned = json.loads(plan.files["plan.json"])
        result.update(summary, changed=changed, plan=planned, app_files=shipped, dirs=dirs,
                      wheels=image_wheels(planned["runtime"], planned["image"],
                                          dirs["wheelhouse"]))
        return result

    @staticmethod
    def _request(args, read_infra, read_request, load_document, request_from_nodes,
                 with_target):
        inputs = args["inputs"]
        if isinstance(inputs, str):
            from pathlib import Path
            inputs = load_document(Path(inputs))
        if args["nodes"]:
            n = args["nodes"]
            base = read_infra(args["infra"]) if args["infra"] else None
            request = request_from_nodes(n["job"]["name"], n["job"]["properties"] or {},
                                         n["target"]["name"], n["target"]["properties"] or {},
                                         "TOSCA node %s" % n["job"]["name"], base)
        else:
            request = read_request(args["request"], infra=args["infra"], inputs=inputs or {},
                                   node=args["node"])
        return with_target(request, args["target"])
