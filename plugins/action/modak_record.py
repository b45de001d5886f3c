# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_record: figures of merit -> results store."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import check_library

ARGS = dict(
    output=dict(type="path", required=True),
    plan=dict(type="dict", required=True),
    store=dict(type="path"),
    source=dict(type="str", default="deploy", choices=["deploy", "autotune", "campaign"]),
    repeat=dict(type="int"),
    require=dict(type="bool", default=True),
    refit=dict(type="bool", default=False),
    started=dict(type="float"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGS)
        check_library("modak_record")
        try:
            from modak_lib.results import (NEW_RUN, RUN_AGAIN, RUN_AGAIN_WITHOUT_KNOB,
                                           ResultsStore, StoreError, job_elapsed, kept,
                                           parse_fom_lines, row_from_fom, script_failure)
            from modak_runtime.record import loss_figures
        except ImportError as exc:
            raise AnsibleActionFail("modak_record needs the modak library on the controller: %s"
                                    % exc)
        plan = args["plan"]
        try:
            with open(args["output"], errors="replace") as f:
                text = f.read()
            records = parse_fom_lines(text)
        except (IOError, OSError) as exc:
            raise AnsibleActionFail("cannot read the job output %s: %s" % (args["output"], exc))
        if not records:
            if args["require"]:
                raise AnsibleActionFail(
                    "the job printed no figure of merit (no {\"modak\": \"fom\"} line in %s): "
                    "the runtime (python3 -m modak_runtime) did not run, was killed before its "
                    "end, or its output could not be written (a full disk); nothing was "
                    "recorded. The run is kept as it is: to run the job again, add "
                    "%s" % (args["output"], NEW_RUN))
            result.update(changed=False, recorded=0, measured=None)
            return result
        target = plan["target"]
        acc = target.get("accelerators") or {}
        store = ResultsStore(args["store"])
        try:
            seen = store.raws_of_run(plan["run_id"])
            # the target's measured figures (its infrastructure file's, else its probe's):
            # what the performance model describes the target by
            from modak_lib.models import Target
            from modak_lib.perf.features import HOST_IMAGE
            from modak_lib.perf.probe import remember_job_probe, target_figures
            # (a job on a target whose figures were unknown measured them first)
            probed = remember_job_probe(Target(**target), text,
                                        (plan.get("image") or {}).get("reference") or "host")
            if probed:
                result["probed"] = probed
            figures = target_figures(Target(**target))
            # a run outside any container ran in the host's environment, not the image's
            image = HOST_IMAGE if plan.get("runtime") == "none" else plan["image"]["variant"]
            # (the job's clock is its one run's: a search's trial cost, besides its training)
            runs = [rec for rec in records if kept(rec)]
            job_s = job_elapsed(text, plan["run_id"]) if len(runs) == 1 else None
            # (and what the deploy spent around it, from when its tasks started: the rest of
            # a trial's cost there)
            path_s = (round(max(0.0, time.time() - args["started"] - job_s), 3)
                      if job_s is not None and args["started"] else None)
            rows = [row_from_fom(rec, source=args["source"], run_id=plan["run_id"],
                                 repeat=args["repeat"],
                                 image=image, target=target["name"],
                                 accelerator=acc.get("model") or acc.get("vendor"),
                                 microarchitecture=target.get("microarchitecture"),
                                 cores=target.get("cores_per_node"), probe=figures,
                                 job_s=job_s, path_s=path_s)
                    for rec in runs]
            new = [r for r in rows if r["raw"] not in seen]
            if not self._play_context.check_mode:
                store.append(new)
        except StoreError as exc:
            raise AnsibleActionFail(str(exc))
        refit, refitted = None, False
        if args["refit"] and new and not self._play_context.check_mode:
            try:  # the closed loop: the next plan learns from this run
                from modak_lib.perf.fit import ModelError, refit_after_run
                outcome = refit_after_run(store)
                refitted = outcome.refitted
                refit = outcome.model_id if refitted else outcome.note
            except ImportError:
                refit = "skipped: scikit-learn is not installed"
            except ModelError as exc:
                refit = "skipped: %s" % exc
        last = records[-1]
        failure = script_failure(last.get("error"), plan.get("runtime"))
        pred = (plan["candidates"][0].get("prediction") or {}) if plan.get("candidates") else {}
        result.update(changed=bool(new), recorded=len(new), store=str(store.path), refit=refit,
                      refitted=refitted,
                      status=last.get("status"), error=last.get("error"),
                      script_failed=failure,
                      run_again=RUN_AGAIN if failure else RUN_AGAIN_WITHOUT_KNOB
                      if (last.get("error") or {}).get("knob") else None,
                      applied=last.get("applied") or {},
                      not_applied=last.get("not_applied") or {},
                      effect=last.get("effect") or {},
                      fingerprint=(last.get("fingerprint") or {}).get("id"),
                      measured=measured(last, loss_figures),
                      predicted_s_per_step=pred.get("seconds"))
        return result


def measured(record, loss_figures):
    """The module's ``measured``: a run's speed, losses and clock from its record, or None
    where it measured no step time; except a trial stopped at its time cap, whose clock
    (without a step time) tells the search how long its compilation ran at least."""
    m = record.get("metrics") or {}
    if not m.get("s_per_step") and record.get("status") != "capped":
        return None
    return {"steps_per_s": m.get("steps_per_s"), "s_per_step": m.get("s_per_step"),
            "samples_per_s": m.get("samples_per_s"),
            "warmup_s": m.get("warmup_s"), "steps": m.get("steps"),
            "final_loss": m.get("final_loss"),
            # (an image's runtime before them: from its losses)
            **loss_figures(m),
            "startup_s": m.get("startup_s"), "runtime_s": m.get("wall_s"),
            # (the sampled [step, loss] pairs: a longer trial's losses after a shorter one's
            # steps, which the search compares them at)
            "losses": m.get("losses") or [],
            # (a job stated in epochs is as long as stock's trial measured an epoch)
            "steps_per_epoch": m.get("steps_per_epoch")}
