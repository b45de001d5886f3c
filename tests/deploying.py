"""What the deploy tests share: the quick request, a user's project outside this repository,
a deploy through the localhost inventory, and the plan of a request as JSON."""
import json
import os
import shutil
import subprocess

from conftest import ROOT

QUICK = ROOT / "tests/data/mnist-quick.yaml"


def copy_model(fitted_model, tmp_path):
    """The session's fitted model and its card, as a first plan would have fitted them,
    where the test's deploys look for them (MODAK_MODEL): a copy, which the runs refit."""
    for suffix in (".joblib", ".json"):
        shutil.copy(fitted_model.with_suffix(suffix), tmp_path / f"model{suffix}")


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def local_deploy(tmp_path, request, **extra):
    variables = {"modak_request": str(request), "modak_work_dir": str(tmp_path / "runs"),
                 "modak_plan_dir": str(tmp_path / "plans"),
                 "modak_results_dir": str(tmp_path / "results"), "modak_job_poll": 1, **extra}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, MODAK_RESULTS=str(tmp_path / "store.sqlite"),
               MODAK_MODEL=str(tmp_path / "model.joblib"))
    proc = subprocess.run(["ansible-playbook", "-i", "inventories/localhost",
                           "playbooks/deploy.yml", "-e", f"@{tmp_path / 'vars.json'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, env


USER_REQUEST = {"job": {
    "job_options": {"job_name": "user-lm", "wall_time_limit": "00:20:00"},
    "application": {"executable": "python3 train.py", "arguments": "--steps 12 --layers 1"},
    "target": {"job_scheduler_type": "none"},
    "optimisation": {"enable_opt_build": True, "app_type": "ai_training",
                     "app_type-ai_training": {
                         "config": {"ai_framework": "pytorch", "allow_reduced_precision": True},
                         "ai_framework-pytorch": {"version": "2.13", "compile": True}}}}}


def user_project(tmp_path, script="tiny_lm.py"):
    """A user's directory far from this repository: a request and the unmodified script."""
    proj = tmp_path / "someone" / "project"
    proj.mkdir(parents=True)
    (proj / "train.py").write_text((ROOT / "tests/user_scripts" / script).read_text())
    (proj / "notes.txt").write_text("not a Python module: not shipped by default\n")
    (proj / "request.json").write_text(json.dumps(USER_REQUEST))
    return proj / "request.json"


def plan_json(request, env_from, *extra):
    env = dict(os.environ, MODAK_RESULTS=env_from["MODAK_RESULTS"],
               MODAK_MODEL=env_from["MODAK_MODEL"])
    proc = subprocess.run(["modak", "plan", str(request), "--json", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
