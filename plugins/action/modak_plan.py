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

ARGS = dict(
    request=dict(type="path", required=True),
    infra=dict(type="path"),
    inputs=dict(type="raw"),
    node=dict(type="str"),
    target=dict(type="dict", default={}),
    out_dir=dict(type="path", required=True),
    run_id=dict(type="str"),
    new_run=dict(type="bool", default=False),
    ca_certs=dict(type="bool", default=False),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGS)
        try:
            import time

            from modak_lib.errors import ModakError
            from modak_lib.pipeline import make_plan, with_target
            from modak_lib.readers import read_request
            from modak_lib.readers.common import load_document
        except ImportError as exc:
            raise AnsibleActionFail("modak_plan needs the modak library on the controller "
                                    "(pip install modak): %s" % exc)
        inputs = args["inputs"]
        try:
            if isinstance(inputs, str):
                from pathlib import Path
                inputs = load_document(Path(inputs))
            request = read_request(args["request"], infra=args["infra"], inputs=inputs or {},
                                   node=args["node"])
            request = with_target(request, args["target"])
            plan = make_plan(request, run_id=args["run_id"], ca_certs=args["ca_certs"])
            if args["new_run"]:  # the same plan under a new run id
                run_id = "%s-%s" % (plan.plan.run_id, time.strftime("%Y%m%dT%H%M%S"))
                plan = make_plan(request, run_id=run_id, ca_certs=args["ca_certs"])
            run_id = plan.plan.run_id
        except ModakError as exc:
            raise AnsibleActionFail("MODAK plan failed:\n%s" % exc)

        out = os.path.join(args["out_dir"], run_id)
        if not os.path.isdir(out):
            os.makedirs(out)
        changed = False
        for name, text in plan.files.items():
            path = os.path.join(out, name)
            old = None
            if os.path.exists(path):
                with open(path) as f:
                    old = f.read()
            if old != text and not self._play_context.check_mode:
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.rename(path + ".tmp", path)
                changed = True
            elif old != text:
                changed = True
        os.chmod(os.path.join(out, plan.plan.job_script), 0o755)
        data = json.loads(plan.files["plan.json"])
        chosen = plan.plan.candidates[0]
        result.update(
            changed=changed, plan=data, plan_dir=out, run_id=run_id,
            files=sorted(plan.files), job_name=request.job.job_name,
            stdout=plan.decision.resources.stdout, stderr=plan.decision.resources.stderr,
            walltime=plan.decision.resources.walltime_s,
            predicted_s=chosen.prediction.seconds if chosen.prediction else None,
            msg="planned %s: %s (decided by %s)" % (run_id, plan.plan.chosen.label(),
                                                    plan.plan.decided_by))
        return result
