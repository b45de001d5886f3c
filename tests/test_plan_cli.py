"""`modak plan` end to end, through the installed command."""
import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, dsl, run_modak

TF_XLA_GPU = {"job": {
    "job_options": {"job_name": "tf-xla", "wall_time_limit": "02:00:00", "core_count": 8,
                    "request_gpus": 1},
    "application": {"executable": "python3 train.py", "arguments": "--batch_size 96"},
    "target": {"job_scheduler_type": "torque", "name": "gpu-cluster"},
    "optimisation": {
        "enable_opt_build": True, "app_type": "ai_training",
        "opt_build": {"cpu_type": "x86", "acc_type": "nvidia"},
        "app_type-ai_training": {"config": {"ai_framework": "tensorflow"},
                                 "ai_framework-tensorflow": {"version": "2.1", "xla": True}}}}}


def plan(tmp_path, doc, *extra):
    req = tmp_path / "request.json"
    req.write_text(json.dumps(doc))
    out = tmp_path / "out"
    proc = run_modak("plan", str(req), "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_tensorflow_xla_gpu_on_torque(tmp_path):
    out, table = plan(tmp_path, TF_XLA_GPU)
    script = (out / "job.sh").read_text()
    assert "#PBS -l nodes=1:ppn=8:gpus=1\n" in script
    assert "#PBS -l walltime=02:00:00\n" in script
    assert "--env TF_XLA_FLAGS=--tf_xla_auto_jit=2 " in script
    plan_json = json.loads((out / "plan.json").read_text())
    image = plan_json["image"]
    assert image["variant"] == "tensorflow-2.1.0-gpu"
    assert 'apptainer exec --nv --cleanenv' in script
    assert f'"$HOME"/{image["reference"]} python3 -m modak_runtime -- train.py --batch_size 96' in script
    assert plan_json["scheduler"] == "pbs" and plan_json["runtime"] == "apptainer"
    # what the front-end runs comes with the plan: PBS's submit command and state map
    control = plan_json["job_control"]
    assert control["name"] == "pbs" and control["submit"]["argv"][0] == "qsub"
    assert control["states"]["Q"] == "PENDING" and control["cancel"] == ["qdel", "{job_id}"]
    assert "tensorflow-2.1.0-gpu" in table and "xla" in table
    assert (out / "apptainer.def").read_text().startswith("# Apptainer definition")
    assert "From: tensorflow/tensorflow:2.1.0-gpu-py3" in (out / "apptainer.def").read_text()


def test_same_request_on_slurm_gives_a_valid_sbatch_script(tmp_path):
    doc = json.loads(json.dumps(TF_XLA_GPU))
    doc["job"]["target"]["job_scheduler_type"] = "slurm"
    out, _ = plan(tmp_path, doc)
    script = (out / "job.sh").read_text()
    assert "#SBATCH --gres=gpu:1\n" in script and "#SBATCH --time=02:00:00\n" in script
    assert "#SBATCH --cpus-per-task=8\n" in script
    assert "#PBS" not in script
    assert "\nsrun apptainer exec --nv " in script
    assert subprocess.run(["bash", "-n", str(out / "job.sh")]).returncode == 0
    control = json.loads((out / "plan.json").read_text())["job_control"]
    assert control["name"] == "slurm" and control["submit"]["argv"][:2] == ["sbatch", "--parsable"]


def test_plan_json_explains_the_decision(tmp_path):
    out, _ = plan(tmp_path, dsl(**{
        "job.optimisation.app_type-ai_training.ai_framework-pytorch":
            {"version": "2.13", "compile": True}}))
    p = json.loads((out / "plan.json").read_text())
    assert p["decided_by"] == "prior"
    assert p["chosen"]["compiler"] == "torch.compile:default"
    ranks = [c["rank"] for c in p["candidates"]]
    assert ranks == list(range(1, len(ranks) + 1)) and len(ranks) > 1
    assert p["candidates"][0]["configuration"] == p["chosen"]
    for c in p["candidates"][1:]:
        assert c["reason"] and c["reason"] != "same as chosen"
    assert any("compiler" not in c["reason"] and "allocator" in c["reason"]
               for c in p["candidates"])
    img = p["image"]
    assert len(img["content_hash"]) == 64 and img["tag"] == img["content_hash"][:12]
    assert img["recipe_file"] in img["recipes"].values()
    assert (out / img["recipe_file"]).exists()
    assert p["job_script"] == "job.sh" and (out / "job.sh").stat().st_mode & 0o100


def test_plan_is_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = plan(tmp_path / "a", TF_XLA_GPU)
    b, _ = plan(tmp_path / "b", TF_XLA_GPU)
    for name in ("job.sh", "apptainer.def", "Containerfile", "Dockerfile.charliecloud"):
        assert (a / name).read_text() == (b / name).read_text()


def test_readme_example_commands(tmp_path):
    proc = run_modak("plan", "examples/mnist-cnn/blueprint.yaml", "--infra",
                     "examples/infra/hlrs-testbed.yaml", "--out", str(tmp_path / "mnist"))
    assert proc.returncode == 0, proc.stderr
    assert "#PBS -N mnist-cnn" in (tmp_path / "mnist/job.sh").read_text()
    proc = run_modak("plan", "examples/resnet50/request.json", "--out", str(tmp_path / "resnet"))
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "resnet/job.sh").read_text()
    assert "#PBS -e resnet50-training.err" in script and "#PBS -V" in script


def test_local_embedded_default(tmp_path):
    proc = run_modak("plan", "examples/mnist-cnn/blueprint.yaml", "--infra",
                     "examples/infra/local.yaml", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "plan.json").read_text())
    assert p["scheduler"] == "local" and p["runtime"] == "none"
    assert p["job_control"] == {"name": "local", "local": True}


@pytest.mark.parametrize("changes, message", [
    ({"job.job_options.core_count": 400}, "exceed the target's cores_per_node"),
    ({"job.optimisation.app_type-ai_training.ai_framework-pytorch": {"version": "9.9"}},
     "no image variant for pytorch 9.9"),
])
def test_plan_time_errors(tmp_path, changes, message):
    req = tmp_path / "r.json"
    req.write_text(json.dumps(dsl(**changes)))
    proc = run_modak("plan", str(req), "--infra", str(ROOT / "examples/infra/hlrs-testbed.yaml"))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_more_nodes_than_the_target_has_stop_the_plan(tmp_path):
    """A target that says how many nodes a job may use refuses a request for more, naming
    the field; a target without a scheduler is one host; one that does not say is not
    checked (a batch scheduler holding such a job for good is modak_job's to cancel)."""
    req, alone = tmp_path / "r.json", tmp_path / "alone.json"
    eight = {"job.job_options.node_count": 8, "job.job_options.core_count": 320}
    req.write_text(json.dumps(dsl(**eight)))
    alone.write_text(json.dumps(dsl(**eight, **{"job.target.job_scheduler_type": "none"})))
    testbed = (ROOT / "examples/infra/hlrs-testbed.yaml").read_text()
    assert "\nnodes:" not in testbed
    four = tmp_path / "four-nodes.yaml"
    four.write_text(testbed + "nodes: 4\n")
    local = tmp_path / "local.yaml"
    local.write_text("scheduler: local\ncores_per_node: 40\n")
    for request, infra, rc, said in (
            (req, four, 2, "job.node_count: 8 nodes exceed the target's nodes 4"),
            (alone, local, 2, "job.node_count: 8 nodes asked for, but a target without a "
                              "scheduler is one host"),
            (req, ROOT / "examples/infra/hlrs-testbed.yaml", 0, "")):
        proc = run_modak("plan", str(request), "--infra", str(infra))
        assert proc.returncode == rc, proc.stderr
        assert proc.stderr.strip().endswith(said) and "Traceback" not in proc.stderr


def test_a_job_name_pbs_refuses_stops_the_plan_and_slurm_takes_it(tmp_path):
    """MODAK's pattern takes a job name that starts with a digit; PBS's qsub does not: the
    PBS plan says so, naming the file and the field, before anything is submitted."""
    req, slurm = tmp_path / "r.json", tmp_path / "slurm.json"
    req.write_text(json.dumps(dsl(**{"job.job_options.job_name": "1train",
                                     "job.target.job_scheduler_type": "torque"})))
    slurm.write_text(json.dumps(dsl(**{"job.job_options.job_name": "1train"})))
    proc = run_modak("plan", str(req), "--infra", str(ROOT / "examples/infra/hlrs-testbed.yaml"),
                     "--out", str(tmp_path / "pbs"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"modak: error: {req}: job.job_name: '1train': a PBS job's name starts with a letter "
        "(qsub refuses it)")
    assert not (tmp_path / "pbs").exists()
    proc = run_modak("plan", str(slurm), "--infra",
                     str(ROOT / "examples/infra/hlrs-testbed.yaml"), "--out", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --job-name=1train" in (tmp_path / "s/job.sh").read_text()


def test_a_blueprint_outside_the_repository_imports_the_installed_types(tmp_path):
    """A user's project anywhere: the types copied from `modak tosca-types`, the script beside
    the blueprint; the plan lists what the run directory receives (the script, its modules)."""
    types = subprocess.run(["modak", "tosca-types"], capture_output=True, text=True, check=True)
    path = Path(types.stdout.strip())
    assert path.is_file() and "modak.nodes.AITrainingJob" in path.read_text()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "modak-types.yaml").write_text(path.read_text())
    (proj / "train.py").write_text("import helpers\n")
    (proj / "helpers.py").write_text("")
    (proj / "data.bin").write_bytes(b"\0" * 10)
    (proj / "bp.yaml").write_text("""tosca_definitions_version: tosca_simple_yaml_1_3
imports: [modak-types.yaml]
topology_template:
  node_templates:
    target: {type: modak.nodes.HPCTarget, properties: {scheduler: local}}
    job:
      type: modak.nodes.AITrainingJob
      properties:
        application: {framework: pytorch, script: train.py, arguments: ["--steps", "5"]}
      requirements: [{host: target}]
""")
    out = tmp_path / "out"
    proc = subprocess.run(["modak", "plan", str(proj / "bp.yaml"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["app_files"] == ["helpers.py", "train.py"]  # not the data, not the blueprint
    assert "python3 -m modak_runtime -- train.py --steps 5" in (out / "job.sh").read_text()


# ---------------------------------------------------------------------------
# the command line as people read it (in-process: main() is what the script calls)
def _main(capsys, *argv):
    from modak_lib.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_wheelhouse_downloads_wheels_for_the_images_python(tmp_path, capsys, monkeypatch):
    """`modak wheelhouse` fetches what an offline build installs, as wheels for the image's
    Python and platform (cp311 manylinux), not this host's; by default the packages of the
    catalogue's first wheelhouse image; an image it does not know is a usage error."""
    from modak_lib.wheelhouse import download_command, variant
    pytorch = variant()
    assert pytorch.id == "pytorch-2.13.0-cpu" and "torch==2.13.0" in pytorch.pip
    argv = download_command(tmp_path, ["numpy"], "x86_64")
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_28_x86_64" in argv and argv[-3:] == ["-d", str(tmp_path), "numpy"]
    # (a small image of the catalogue's, so that the test downloads little)
    monkeypatch.setattr("modak_lib.wheelhouse.variant", lambda image=None: pytorch.model_copy(
        update={"pip": ("markupsafe",)}))
    code, out, _ = _main(capsys, "wheelhouse", "--dir", str(tmp_path / "w"), "markupsafe",
                         "six")  # (more packages besides the image's, once each)
    assert code == 0 and f"wheelhouse {tmp_path / 'w'}: 2 wheels" in out, out
    wheels = sorted(w.name for w in (tmp_path / "w").glob("*.whl"))
    assert "-cp311-" in wheels[0] and "manylinux" in wheels[0] and wheels[1].startswith(
        "six-"), wheels
    monkeypatch.undo()
    code, _, err = _main(capsys, "wheelhouse", "--image", "nope")
    assert code == 2 and "--image nope: not an image of the catalogue" in err \
        and "pytorch-2.13.0-cpu" in err


def test_a_place_to_write_that_cannot_be_made_is_a_one_line_error(tmp_path, capsys):
    """``--out`` under a file, ``modak init`` into a file, a model file under a file: one
    line naming the path and why, exit status 2 (they were tracebacks)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, _, _ = _main(capsys, "init", str(tmp_path / "job"))
    assert code == 0
    bp, infra = tmp_path / "job" / "blueprint.yaml", tmp_path / "job" / "infra-local.yaml"
    for args, said in (
            (["plan", str(bp), "--infra", str(infra), "--model", "none", "--out",
              str(a_file / "out")], f"{a_file / 'out'}: cannot create it as a directory"),
            (["plan", str(bp), "--infra", str(infra), "--model", "none", "--out",
              str(a_file)], f"{a_file}: is not a directory"),
            (["init", str(a_file / "job")], f"{a_file / 'job'}: cannot create it as a directory"),
            (["model", "fit", "--model-file", str(a_file / "m.joblib")],
             f"{a_file}: is not a directory")):
        code, out, err = _main(capsys, *args)
        assert code == 2 and len(err.splitlines()) == 1, (args, err)
        assert err.startswith(f"modak: error: {said}"), (args, err)


def test_init_writes_a_starting_point_that_plans_and_never_overwrites(tmp_path, capsys):
    code, out, _ = _main(capsys, "init", str(tmp_path / "job"))
    assert code == 0 and "ansible-playbook modak.modak.deploy -i" in out
    job = tmp_path / "job"
    names = sorted(p.name for p in job.iterdir())
    assert names == ["blueprint.yaml", "infra-local.yaml", "inventory.yml", "modak-types.yaml",
                     "train.py"]
    assert "imports:\n  - modak-types.yaml" in (job / "blueprint.yaml").read_text()
    (job / "train.py").write_text("# the user's edits\n")
    code, _, err = _main(capsys, "init", str(job))
    assert code == 2 and "exist(s); nothing was written (--force replaces them)" in err
    assert (job / "train.py").read_text() == "# the user's edits\n"
    code, out, _ = _main(capsys, "--quiet", "plan", str(job / "blueprint.yaml"), "--infra",
                         str(job / "infra-local.yaml"), "--model", "none")
    assert code == 0 and out.strip().endswith("(decided by prior)") and len(out.splitlines()) == 1
    # what the model cannot settle (here: no model at all) the deploy settles by trials
    # first: the starting blueprint enables autotuning, stock among the candidates
    code, out, _ = _main(capsys, "plan", str(job / "blueprint.yaml"), "--infra",
                         str(job / "infra-local.yaml"), "--model", "none", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["search"] is True and len(plan["autotune"]) >= 2
    from modak_lib.models import Configuration
    from modak_lib.planner import stock_configuration
    offered = [Configuration(**c["configuration"]) for c in plan["candidates"]]
    stock = stock_configuration(offered, {c["configuration"]["image"]: c["score"]
                                          for c in plan["candidates"]},
                                max(c.threads for c in offered))
    assert stock is not None
    assert [Configuration(**c) for c in plan["autotune"]].count(stock) == 1
    code, out, _ = _main(capsys, "init", "--json", "--force", str(job))
    assert code == 0 and len(json.loads(out)["written"]) == 5


def test_plan_out_refuses_to_write_through_a_symbolic_link(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "job.sh").symlink_to(victim)
    code, _, err = _main(capsys, "plan", str(ROOT / "examples/mnist-cnn/blueprint.yaml"),
                         "--infra", str(ROOT / "examples/infra/local.yaml"), "--model", "none",
                         "--out", str(out))
    assert code == 2 and "is a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == "precious\n" and not victim.stat().st_mode & 0o111
    assert not list(out.glob(".*.tmp"))  # no temporary file left behind


def test_the_plan_table_fits_100_columns_even_with_long_compiler_modes(tmp_path, capsys):
    doc = dsl(**{"job.optimisation.app_type-ai_training.ai_framework-pytorch.compile":
                 ["max-autotune-no-cudagraphs", "reduce-overhead"]})
    req = tmp_path / "r.json"
    req.write_text(json.dumps(doc))
    code, out, _ = _main(capsys, "-v", "plan", str(req), "--model", "none")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 100, out
    code, out, _ = _main(capsys, "plan", str(req), "--model", "none", "--json")
    assert any(c["configuration"]["compiler"] == "torch.compile:max-autotune-no-cudagraphs"
               for c in json.loads(out)["candidates"])


def test_json_from_every_command_that_prints_data(capsys):
    code, out, _ = _main(capsys, "tosca-types", "--json")
    assert code == 0 and Path(json.loads(out)["path"]).name == "modak-types.yaml"
    code, out, _ = _main(capsys, "model", "eval", "--json", "--estimator", "linear",
                         "--compare", "linear,gbr-split")
    assert code == 0
    data = json.loads(out)
    assert {"per_family", "per_target", "overall", "decisions", "estimators"} <= set(data)
    assert set(data["estimators"]) == {"linear", "gbr-split"}
    # the shipped transfer campaign is read: families beyond the reference ones
    assert {"mobile-cnn", "gru", "transformer-lm"} <= {w["workload"] for w in data["per_family"]}
    assert data["estimators"]["gbr-split"]["lowo"] < data["estimators"]["linear"]["lowo"]
    assert all(0 <= w["mape_loco"] < 10 for w in data["per_family"])
    # a held-out family's error is partly its level: with each cell's level given, less
    lowo = data["overall"]["lowo"]
    assert 0 < lowo["mape_level_given"] < lowo["mape"]
    # against the best configuration keeping fp32 (what the model alone may choose), never
    # more regret than against the best of all, and less where bf16 was the fastest
    assert 0 <= lowo["median_regret_fp32"] <= lowo["median_regret"]
    decided = [d for d in data["decisions"] if "regret_fp32_lowo" in d]
    assert all(d["regret_fp32_lowo"] <= d["regret_lowo"] + 1e-12 for d in decided)
    assert any(d["regret_fp32_lowo"] < d["regret_lowo"] for d in decided
               if "bf16" in d["best"])
    # told each cell's stock time, a configuration held out (its family in the data) is
    # predicted from ratios learned on its own family: closer than a family held out
    loco = data["overall"]["loco"]
    assert 0 < loco["mape_after_stock"] < lowo["mape_after_stock"]
    assert 0 < loco["mape_level_given"] < lowo["mape_level_given"]
    # how far a round's ratio to stock scatters: the figure the budgeted search's margin
    # over n rounds is built on (search.TRIAL_SCATTER), as the shipped data show it
    from modak_lib.perf.search import TRIAL_SCATTER
    sc = data["round_scatter"]
    assert sc["configurations"] > 300 and abs(sc["scatter"] - TRIAL_SCATTER) < 0.005
    # the shipped campaign measured its CPU targets on two machines each: their scatter
    rep = data["reproducibility"]
    assert rep["configurations"] > 50 and rep["targets"] >= 3 and 0 < rep["mape"] < 0.5
    # and each machine's own speed, as a factor on time around its target's median machine
    factors = [m["factor"] for m in data["machines"]
               if m["target"] == "x86_64_v4/2 cores" and m["factor"] is not None]
    assert len(factors) >= 2 and min(factors) < 1 < max(factors)


def test_the_same_request_planned_again_into_its_folder_is_the_same_run(tmp_path, capsys):
    from modak_lib.cli import main
    req = tmp_path / "request.json"
    req.write_text(json.dumps(dsl()))
    out = tmp_path / "out"

    def plan_json(*extra):
        assert main(["plan", str(req), "--out", str(out), "--json", "--model", "none",
                     *extra]) == 0
        return json.loads(capsys.readouterr().out)

    first = plan_json()
    (out / "job.sh").write_text("edited by hand\n")  # a reused plan is not rendered again
    again = plan_json()
    assert again["run_id"] == first["run_id"] and again == first
    assert (out / "job.sh").read_text() == "edited by hand\n"
    assert main(["plan", str(req), "--out", str(out), "--model", "none"]) == 0
    assert f"the plan of run {first['run_id']}, pinned in" in capsys.readouterr().out

    new = plan_json("--new-run")  # asked for: planned again, a new run id
    assert new["run_id"].startswith(first["run_id"] + "-") and new["run_id"] != first["run_id"]
    assert (out / "job.sh").read_text().count(new["run_id"]) == 1
    assert plan_json()["run_id"] == new["run_id"]  # the new run is the pinned one now

    req.write_text(json.dumps(dsl(**{"job.job_options.job_name": "other"})))  # another request
    other = plan_json()
    assert other["run_id"] not in (first["run_id"], new["run_id"])
    req.write_text(json.dumps(dsl()))  # back: its pinned plan was overwritten, plan again
    assert plan_json()["run_id"] == first["run_id"]


def test_pins_ignore_a_plan_folder_that_now_holds_another_run(tmp_path):
    from modak_lib.runs import Pins, new_run_id, request_key
    pins = Pins(tmp_path / "requests")
    key = request_key({"request": "abc", "inputs": {"steps": 3}})
    assert key != request_key({"request": "abc", "inputs": {"steps": 4}})
    assert pins.get(key) is None
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text(json.dumps({"run_id": "r1"}))
    pins.put(key, {"plan_dir": str(tmp_path / "plan"), "run_id": "r1", "plan": {"x": 1}})
    assert pins.get(key)["plan"] == {"run_id": "r1"}
    (tmp_path / "plan" / "plan.json").write_text(json.dumps({"run_id": "r2"}))
    assert pins.get(key) is None
    (tmp_path / "plan" / "plan.json").unlink()
    assert pins.get(key) is None
    with pytest.raises(ValueError):
        pins.put(key, {"run_id": "r1"})
    assert new_run_id("r1", now=0).startswith("r1-19")


def test_configurations_withheld_for_one_reason_are_said_once_in_the_table():
    """A knob the script does not take withholds every configuration with it: the table
    says so once, with how many; plan.json keeps each; a lone one keeps its own line."""
    from modak_lib.report import grouped_notes
    why = ("compiler=torch.compile:default was not applied to this script here: "
           "torch.compile traced no graph of it")
    labels = [f"pytorch-2.13.0-cpu compiler=torch.compile:default threads={t} alloc={a} "
              f"prec={p}" for t in (1, 2) for a in ("glibc", "tcmalloc") for p in ("fp32", "bf16")]
    failed = ("pytorch-2.13.0-cpu compiler=off threads=2 alloc=jemalloc prec=fp32: failed when "
              "run here (r1, under the knob allocator)")
    notes = ["ranked by the time of a 300-step job",
             *(f"not offered: {label}: {why}" for label in labels[:3]),
             f"not offered: {failed}",
             *(f"not offered: {label}: {why}" for label in labels[3:])]
    assert grouped_notes(notes) == [
        "ranked by the time of a 300-step job",
        f"not offered: 8 configurations (each named in plan.json): {why}",
        f"not offered: {failed}"]
    assert grouped_notes(notes[:2] + notes[4:5]) == notes[:2] + notes[4:5]  # one each: as is
