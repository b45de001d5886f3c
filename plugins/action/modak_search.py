# -*- coding: utf-8 -*-
# Copyright: MODAK developers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of modak.modak.modak_search: one step of MODAK's budgeted trial search.

The search itself is ``modak_lib.perf.search.Halving``; this plugin keeps its state in a
file between the rounds that the playbook runs through the job path, records each round's
trials into it and says what to run next, or what it chose.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import uuid

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.modak.modak.plugins.plugin_utils.modak_library import check_library

# how the budget of a job of known steps is kept: on stock's measured job time
REBASED = "; re-based on stock's first trial"
# what a trial costs besides its steps where no trial at the target has measured it
DEFAULT_OVERHEAD_S = 10.0
DEFAULT_JOB_S = 3600.0  # a job that states neither its steps nor its wall time


# the search's settings' ranges: argument -> (the deploy's variable, check, what it must be)
SETTINGS = {
    "budget_fraction": ("modak_autotune_budget", lambda v: 0 < v <= 10,
                        "more than 0 and at most 10 (a fraction of the job's expected time)"),
    "candidates": ("modak_autotune_k", lambda v: 1 <= v <= 64, "from 1 to 64"),
    "first_steps": ("modak_autotune_steps", lambda v: v >= 2,
                    "at least 2 (a step time needs two steps)"),
    "max_rounds": ("modak_autotune_rounds", lambda v: 1 <= v <= 10, "from 1 to 10"),
    "job_steps": ("modak_job_steps", lambda v: v >= 0, "0 (unknown) or more"),
    "trial_overhead_s": ("modak_autotune_trial_overhead", lambda v: v >= 0, "0 or more"),
    "loss_tolerance": ("modak_autotune_loss_tolerance", lambda v: 0 <= v <= 10, "from 0 to 10"),
    "min_gain": ("modak_autotune_min_gain", lambda v: 0 <= v < 1, "from 0 to below 1"),
    "scatter": ("modak_autotune_scatter", lambda v: 0 <= v <= 5, "from 0 to 5"),
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        check_library("modak_search")
        from modak_lib.files import write_atomic
        from modak_lib.models import Configuration
        from modak_lib.perf.search import MIN_GAIN, TRIAL_SCATTER, Halving, Trial, job_seconds

        spec = dict(plan=dict(type="dict", required=True), state=dict(type="path", required=True),
                    record=dict(type="list", elements="dict", default=[]),
                    cap_for=dict(type="dict"),
                    done=dict(type="list", elements="dict", default=[]),
                    candidates=dict(type="int", default=3),
                    budget_fraction=dict(type="float", default=0.1),
                    job_steps=dict(type="int", default=0),
                    first_steps=dict(type="int", default=10),
                    trial_overhead_s=dict(type="float"), store=dict(type="path"),
                    max_rounds=dict(type="int", default=3),
                    loss_tolerance=dict(type="float", default=0.05),
                    min_gain=dict(type="float", default=MIN_GAIN),
                    scatter=dict(type="float", default=TRIAL_SCATTER))
        dummy, args = self.validate_argument_spec(spec)
        bad = ["%s (the deploy's %s) must be %s, not %r" % (name, var, want, args[name])
               for name, (var, ok, want) in SETTINGS.items()
               if args[name] is not None and not ok(args[name])]
        if bad:  # (Jinja's float filter reads "abc" as 0.0: a budget of nothing)
            raise AnsibleActionFail("modak_search: " + "; ".join(bad))
        plan, path = args["plan"], args["state"]
        if args["cap_for"] is not None:  # the time cap of the round's next trial
            if not os.path.exists(path):
                raise AnsibleActionFail("%s: no search to cap a trial of (start it first)" % path)
            with open(path) as f:
                halving = Halving.from_state(json.load(f))
            this = Configuration(**args["cap_for"])
            done = [self._trial(r, Trial, Configuration, halving.stock)
                    for r in args["done"]]
            cap, skip = halving.cap(this, done), halving.skip(this, done)
            result.update(changed=False, cap=cap, skip=skip or "",
                          msg=skip or ("no time cap (stock's trial)" if cap is None
                                       else "time cap %.1f s" % cap))
            return result
        if os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            halving, how = Halving.from_state(state), state.get("budget_how")
            # (a search started by an earlier MODAK has none: its trials are found as before)
            search_id = state.get("search_id", "")
        else:
            halving, how = self._start(plan, args, Configuration)
            result["budget"] = how
            # this search's, kept in its state: part of its trials' runs (modak_plan's
            # trial_search), so that another search's trial of the same configuration and
            # steps is not found again in place of one of this search's own
            search_id = uuid.uuid4().hex[:12]
        if args["record"]:
            halving.record([self._trial(r, Trial, Configuration, halving.stock)
                            for r in args["record"]])
        step = halving.next_round()
        write_atomic(os.path.dirname(path) or ".", os.path.basename(path),
                     json.dumps(dict(halving.state(), budget_how=how, search_id=search_id)))
        out = halving.out
        result.update(changed=bool(args["record"]), done=step is None, rounds=out.rounds,
                      search_id=search_id,
                      spent_s=round(out.spent_s, 1), budget_s=round(out.budget_s, 1),
                      verdicts=out.verdicts)
        if step is None:
            stock = halving.stock_trial()
            chosen = halving.last.get(out.chosen)
            result.update(chosen=out.chosen.model_dump(mode="json"), msg=out.summary(),
                          report=self.report(out, how),
                          trials=[], job_s={"stock": _s(stock, halving, job_seconds),
                                            "chosen": _s(chosen, halving, job_seconds)},
                          script_failed=self._broken(halving, args["record"],
                                                     plan.get("runtime")))
        else:
            result.update(trials=[c.model_dump(mode="json") for c in step[0]], steps=step[1],
                          msg="round %d: %d trial(s) of %d steps%s" % (
                              out.rounds + 1, len(step[0]), step[1],
                              " (stock's second trial, to confirm the choice)"
                              if halving.confirming else ""))
        return result

    @staticmethod
    def _broken(halving, records, runtime=None):
        """Where the script itself failed in stock's trial: what to tell the user instead of
        submitting a job that would fail the same way ("" otherwise)."""
        why = halving.stock_broken()
        if why is None:
            return ""
        rec = next((r for r in records if r.get("run_id")
                    and halving.stock.model_validate(r["configuration"]) == halving.stock),
                   {})
        where = ("the trial's output is that of run %s" % rec["run_id"] if rec
                 else "the trial's output says more")
        from modak_lib.results import RUN_AGAIN, missing_here, missing_module, missing_module_hint
        hint = ("; " + missing_here((rec.get("error") or {}).get("missing"), why)
                + missing_module_hint(runtime)) if missing_module(why) else ""
        return ("the script failed in stock's trial (%s): a job would fail the same way, so "
                "none was submitted; %s%s; %s" % (why, where, hint, RUN_AGAIN))

    @staticmethod
    def report(out, how):
        """What a user reads of a finished search: the summary, how the budget was set, and
        each candidate's verdict (why it was chosen, dropped, rejected or not tried)."""
        if how and not out.trials:  # (no stock trial ran to re-base the budget on)
            how = how.replace(REBASED, "")
        stock = [t for t in out.trials if t.configuration == out.stock and t.s_per_step]
        later = [t for t in stock if t.round == out.rebased_on]
        if how and later:  # (stock's first trial was disturbed: Halving._budget)
            how += ("; re-based again on stock's trial in round %d, %.3g s a step: the first, "
                    "%.3g s a step, %.1fx that, was disturbed"
                    % (later[0].round, later[0].s_per_step, stock[0].s_per_step,
                       stock[0].s_per_step / later[0].s_per_step))
        return ([out.summary()] + (["budget " + how] if how else [])
                + ["%s: %s" % kv for kv in sorted(out.verdicts.items())])

    @staticmethod
    def _start(plan, args, Configuration):
        """A new search: the plan's proposed trials (else its top candidates, as
        ``search.first_round`` takes them) and stock; the job's steps and the budget from
        what the plan knows."""
        from modak_lib.perf.search import Halving, compiled_earlier, first_round
        from modak_lib.planner import stock_configuration

        ranked = [Configuration(**c["configuration"]) for c in plan["candidates"]]
        scores = dict((c["configuration"]["image"], c["score"]) for c in plan["candidates"])
        stock = stock_configuration(ranked, scores, max(c.threads for c in ranked))
        trials = [Configuration(**c) for c in plan.get("autotune") or []] or first_round(
            [(c, bool((p.get("prediction") or {}).get("measured")))
             for c, p in zip(ranked, plan["candidates"])], args["candidates"], stock)
        if stock is None:
            from modak_lib.results import NEW_RUN
            raise AnsibleActionFail("the plan has no stock candidate (no compiler, all "
                                    "cores, glibc, fp32) to compare trials with (%s plans "
                                    "the request again)" % NEW_RUN)
        pred = next((c.get("prediction") for c in plan["candidates"]
                     if Configuration(**c["configuration"]) == stock), None) or {}
        per_step = pred.get("seconds")
        wall = plan.get("walltime_s")
        stated = args["job_steps"] or plan.get("steps") or None  # the variable, else the plan's
        # only a job of stated steps, or of stated epochs (as many steps as an epoch makes
        # in stock's first trial, whatever the plan took from an earlier run), has a length
        # that stock's trial measures better than the plan predicted; otherwise its length
        # is its wall time, and its steps as many as that holds at stock's speed as its
        # first trial measures it (search.wall_steps)
        epochs = None if args["job_steps"] else plan.get("epochs")
        rebase = args["budget_fraction"] if stated or epochs else None
        if stated:
            expected = stated * per_step if per_step else (wall or DEFAULT_JOB_S)
            length = "%d steps%s" % (stated, " at stock's predicted %.3g s/step" % per_step
                                     if per_step else ", stock's speed unknown: the wall time")
            if epochs:
                length += ("; %d epochs, as many steps as an epoch makes in stock's first "
                           "trial" % epochs)
        else:
            expected = wall or DEFAULT_JOB_S
            length = ("its wall time: it states no steps; as many as that holds at stock's "
                      "speed, as its first trial measures it" if wall else
                      "no steps and no wall time stated: an hour")
            if epochs:
                length = ("%d epochs, as many steps as an epoch makes in stock's first trial; "
                          "till then %s" % (epochs, length))
        # (a compilation an earlier search's trial here was stopped in: its share must be
        # longer this time)
        earlier = [t for t in (compiled_earlier(c, (p.get("prediction") or {}).get("compiling_s"))
                               for c, p in zip(ranked, plan["candidates"])) if t is not None]
        budget = args["budget_fraction"] * expected
        overhead, said = ActionModule._overhead(plan, args)
        how = ("%.0f s: %.0f%% of the job's expected %.0f s (%s)" % (
            budget, 100 * args["budget_fraction"], expected, length)
            + (REBASED if rebase else "") + ("; " + said if said else ""))
        # (a compiler's warm-up, which its first trial pays besides stock's)
        warm = dict((c, (p.get("prediction") or {}).get("warmup_s") or 0.0)
                    for c, p in zip(ranked, plan["candidates"]))
        warmups = dict((c, w - warm.get(stock, 0.0)) for c, w in warm.items())
        return Halving(trials, stock, job_steps=stated, budget_s=budget,
                       first_steps=args["first_steps"], max_rounds=args["max_rounds"],
                       loss_tolerance=args["loss_tolerance"], budget_fraction=rebase,
                       trial_overhead_s=overhead, s_per_step=per_step,
                       min_gain=args["min_gain"], walltime_s=wall,
                       scatter=args["scatter"], epochs=epochs, earlier=earlier,
                       warmups=warmups), how

    @staticmethod
    def _overhead(plan, args):
        """What a trial costs besides its steps before any of this search's has run, and
        how it was known ("" where set): as set, else as the latest earlier trials at the
        plan's target took it (``search.measured_overhead``), else DEFAULT_OVERHEAD_S."""
        from modak_lib.perf.search import OVERHEAD_TRIALS, measured_overhead
        from modak_lib.results import ResultsStore, StoreError

        if args["trial_overhead_s"] is not None:
            return args["trial_overhead_s"], ""
        target = (plan.get("target") or {}).get("name")
        try:
            rows = ResultsStore(args.get("store")).trial_clocks(target) if target else []
        except StoreError:
            rows = []
        workload = (plan.get("environment") or {}).get("MODAK_WORKLOAD")
        seen = measured_overhead(rows, plan.get("runtime") != "none", workload)
        if seen is None:
            return DEFAULT_OVERHEAD_S, ("a trial's start-up, tasks and job path %.0f s, "
                                        "assumed: no trial here has measured it yet"
                                        % DEFAULT_OVERHEAD_S)
        return seen[0], ("a trial's start-up, tasks and job path %.1f s, as the latest %d earlier "
                         "trials %shere took it (the median, of at most %d)"
                         % (seen[0], seen[1], "of this workload " if seen[2] else "",
                            OVERHEAD_TRIALS))

    @staticmethod
    def _trial(rec, Trial, Configuration, stock):
        """A trial from what the trial's tasks kept: its configuration, modak_record's
        measured figures and status, the job's elapsed time, the trial's tasks' own time
        (``path_s``: planning, staging, waiting and recording included; ``stock``: the
        search's stock configuration, which a knob the script overrides is judged
        against)."""
        from modak_lib.perf.search import departures, script_error, time_capped

        config = Configuration(**rec["configuration"])
        m = rec.get("measured") or {}
        # (what the deploy spent around the trial's job: its tasks' time less the job's and
        # less its image's build, kept apart: once per recipe, not each trial's)
        build = float(rec.get("build_s") or 0.0)
        path = max(0.0, float(rec.get("path_s") or 0.0) - float(rec.get("elapsed_s") or 0.0)
                   - build)
        # (stock's image, which its trial built: the job needs it, whichever of the
        # runtime's knobs the search chooses; not a trial's cost: search.Trial)
        shared = build if config.image == stock.image else 0.0
        build -= shared
        refused = departures(rec.get("not_applied") or {}, config, stock)
        failed = None
        if rec.get("status") == "skipped":  # (not run: Halving.skip said why)
            return Trial(config, 0, None,
                         failed=(rec.get("error") or {}).get("message") or "not tried",
                         skipped=True, path_s=path, build_s=build,
                         shared_build_s=shared)
        if rec.get("status") == "failed" or not m.get("s_per_step"):
            failed = ((rec.get("error") or {}).get("message") or rec.get("status")
                      or "no figures")
        elif refused:  # it measured another configuration than its own
            failed = "not applied: " + "; ".join("%s (%s)" % kv
                                                 for kv in sorted(refused.items()))
        return Trial(config, int(m.get("steps") or 0),
                     m.get("s_per_step") if not failed else None,
                     float(m.get("warmup_s") or 0.0), float(rec.get("elapsed_s") or 0.0),
                     m.get("final_loss"), failed,
                     capped=time_capped(failed, rec.get("error")),
                     startup_s=float(m.get("startup_s") or 0.0),
                     runtime_s=float(m.get("runtime_s") or 0.0), end_loss=m.get("end_loss"),
                     start_loss=m.get("start_loss"), refused=refused,
                     script_error=script_error(failed, rec.get("error")),
                     losses=m.get("losses") or (),
                     steps_per_epoch=m.get("steps_per_epoch"), path_s=path, build_s=build,
                     shared_build_s=shared)


def _s(trial, halving, job_seconds):
    return round(job_seconds(trial, halving.job_steps), 1) if trial is not None else None
