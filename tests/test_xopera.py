"""TOSCA blueprints deployed with xOpera against the real front-end (scripts/opera)."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from modak_lib.results import ResultsStore

pytestmark = pytest.mark.slow
EXAMPLES = ROOT / "tosca/examples"
OPERA = ROOT / "scripts/opera"


@pytest.fixture
def opera(tmp_path, frontend):
    env = dict(os.environ, MODAK_OPERA_STATE=str(tmp_path / "opera"),
               MODAK_STATE_DIR=str(tmp_path / "state"),
               MODAK_RESULTS=str(tmp_path / "results.sqlite"),
               MODAK_MODEL=str(tmp_path / "model.joblib"))

    def run(*args, check=True):
        proc = subprocess.run([str(OPERA), *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=1800)
        if check:
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
        return proc

    run.tmp = tmp_path
    return run


@pytest.mark.parametrize("name", ["mnist-cnn-slurm.yaml", "mnist-cnn-pbs.yaml",
                                  "resnet50-gpu-pbs.yaml"])
def test_opera_validates_the_examples(opera, name):
    inputs = ["-i", str(EXAMPLES / "inputs-local.yaml")] if name.startswith("mnist") else []
    proc = opera("validate", *inputs, str(EXAMPLES / name))
    assert "Done." in proc.stdout


def test_deploy_outputs_undeploy(opera, tmp_path):
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text(yaml.safe_dump({"frontend_host": "127.0.0.1", "frontend_port": 2222,
                                      "arguments": ["--model", "mnist-cnn", "--steps", "12"]}))
    opera("deploy", "-i", str(inputs), str(EXAMPLES / "mnist-cnn-slurm.yaml"))
    text = opera("outputs", "-f", "json").stdout
    out = json.loads(text[text.index("{"):])
    values = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in out.items()}
    assert values["job_state"] == "COMPLETED"
    assert float(values["measured_seconds_per_step"]) > 0
    assert "pytorch-2.13.0-cpu" in values["chosen_configuration"]
    assert values["decided_by"] in ("prior", "model")
    run_dir = Path("/home/hpcuser/modak-runs") / f"mnist-cnn-{values['run_id']}"
    assert run_dir.is_dir()
    assert ResultsStore(tmp_path / "results.sqlite").count() == 1

    opera("undeploy")
    assert not run_dir.exists()  # the job's work directory is gone
    assert ResultsStore(tmp_path / "results.sqlite").count() == 1  # the results stay


def test_blueprint_errors_come_from_modak_before_anything_runs(opera, tmp_path):
    bad = (EXAMPLES / "mnist-cnn-slurm.yaml").read_text().replace(
        "compilers: [torch.compile]", "compilers: [tvm]")
    path = EXAMPLES / f"_bad-{tmp_path.name}.yaml"  # under tosca/: xOpera's CSAR root
    path.write_text(bad)
    try:
        proc = opera("deploy", "-i", str(EXAMPLES / "inputs-local.yaml"), str(path), check=False)
    finally:
        path.unlink()
    assert proc.returncode == 2
    assert ("topology_template.node_templates.train.properties.optimisation.compilers[0]"
            in proc.stderr)
    assert not (tmp_path / "opera" / "state").exists()  # xOpera never started


def test_an_opera_deploy_asks_for_a_new_run_through_its_environment(tmp_path, fitted_model):
    """What ``-e modak_new_run=true`` is to the playbook, ``MODAK_NEW_RUN=1`` is to an
    ``opera deploy``: its create operation plans the same blueprint as a new run, and the
    operations after it (configure, start: the same role, without it) find that run, as
    does a later create without it.  Run here as xOpera runs the operation's playbook,
    with the node's properties as variables, on this host."""
    from deploying import copy_model, ok
    copy_model(fitted_model, tmp_path)
    variables = {
        "job_properties": {
            "application": {"framework": "pytorch", "framework_version": "2.13",
                            "model": "mnist-cnn", "script": "workloads/train.py",
                            "arguments": ["--model", "mnist-cnn", "--steps", "5"],
                            "batch_size": 128},
            "job_options": {"job_name": "mnist-cnn", "wall_time_limit": "00:10:00"},
            "optimisation": {}, "environment": {}},
        "target_properties": {"scheduler": "local", "container_runtime": "none",
                              "frontend": {"host": "127.0.0.1",
                                           "work_dir": str(tmp_path / "runs")}}}
    (tmp_path / "vars.json").write_text(json.dumps(variables))

    def create(new_run):
        env = dict(os.environ, MODAK_STATE_DIR=str(tmp_path / "state"), MODAK_CSAR_ROOT=str(ROOT),
                   MODAK_RESULTS=str(tmp_path / "results.sqlite"),
                   MODAK_MODEL=str(tmp_path / "model.joblib"), ANSIBLE_SHOW_CUSTOM_STATS="true",
                   MODAK_NEW_RUN=new_run)
        proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local",
                               "tosca/playbooks/job-create.yml", "-e",
                               f"@{tmp_path / 'vars.json'}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        ok(proc)
        return json.loads(proc.stdout.split("RUN: ", 1)[1].split("\n", 1)[0])["run_id"]

    first = create("")
    assert create("0") == first  # (the same blueprint: the same run)
    again = create("1")
    assert again != first and again.startswith(first + "-")
    assert create("") == again
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        f"mnist-cnn-{first}", f"mnist-cnn-{again}"]


def test_modak_opera_deploys_a_users_own_script_from_anywhere(opera, tmp_path):
    """`modak opera` deploys a blueprint outside this checkout (here one that `modak init
    --script` wrote around a user's script, with its hardware from an infrastructure
    file): xOpera runs the operations of the installed collection on the CSAR MODAK wrote,
    and the run's outputs and undeploy find that deployment by its file."""
    proj = tmp_path / "someone" / "tiny-lm"
    proj.mkdir(parents=True)
    (proj / "train.py").write_text((ROOT / "tests/user_scripts/tiny_lm.py").read_text())
    env = dict(os.environ, MODAK_HOME=str(tmp_path / "home"),
               MODAK_RESULTS=str(tmp_path / "results.sqlite"),
               MODAK_MODEL=str(tmp_path / "model.joblib"),
               ANSIBLE_COLLECTIONS_PATH=str(ROOT / "build/collections"),
               OPERA_SSH_USER="hpcuser",
               OPERA_SSH_IDENTITY_FILE="/var/tmp/modak-frontend/id_ed25519",
               MODAK_KNOWN_HOSTS="/var/tmp/modak-frontend/known_hosts")
    opera("validate", "-i", str(EXAMPLES / "inputs-local.yaml"),
          str(EXAMPLES / "mnist-cnn-slurm.yaml"))  # (scripts/opera installs xOpera)

    def modak(*args):
        proc = subprocess.run(["modak", *args], cwd=proj, env=env, capture_output=True,
                              text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
        return proc.stdout

    modak("init", "--script", "train.py")
    bp = yaml.safe_load((proj / "blueprint.yaml").read_text())
    bp["topology_template"]["inputs"]["steps"]["default"] = "12"
    opt = bp["topology_template"]["node_templates"]["tiny-lm"]["properties"]["optimisation"]
    opt["enable_autotuning"] = False  # (xOpera's operations deploy the plan's choice)
    (proj / "blueprint.yaml").write_text(yaml.safe_dump(bp))
    infra = str(ROOT / "examples/infra/local-frontend.yaml")
    modak("opera", "deploy", "blueprint.yaml", "--infra", infra)
    text = modak("opera", "outputs", "blueprint.yaml", "--format", "json")
    out = json.loads(text[text.index("{"):])
    values = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in out.items()}
    assert values["job_state"] == "COMPLETED", values
    assert float(values["measured_seconds_per_step"]) > 0
    run_dir = Path("/home/hpcuser/modak-runs") / f"tiny-lm-{values['run_id']}"
    assert (run_dir / "train.py").read_text() == (proj / "train.py").read_text()
    (row,) = ResultsStore(tmp_path / "results.sqlite").rows()
    assert row["steps"] == 12 and row["workload"] == "tiny-lm"
    assert Path(values["results_dir"]).parent == tmp_path / "home" / "results"
    modak("opera", "undeploy", "blueprint.yaml")
    assert not run_dir.exists()
