"""Hostile input: every value is rejected with a clear error, or rendered inert.

"Inert" is checked by running the rendered job script in a scratch directory,
with recording stubs in place of python3/srun/podman: the stub must receive the
value verbatim as one argument (or one environment value), and no file other
than the expected ones may appear.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import plan_of, request

from modak_lib.errors import InputError
from modak_lib.readers.dsl import read_dsl
from modak_lib.report import plan_table

HOSTILE = [
    "x\ntouch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "../../pwned",
    "a; touch pwned",
    "a && touch pwned",
    "a | tee pwned",
    "> pwned",
    "$HOME",
    "${IFS}touch${IFS}pwned",
    "'; touch pwned; '",
    '"; touch pwned; "',
    "-rf",
    "*",
    "~root",
    "a b",
    "\\",
    "{{ 7*7 }}",
    "{% raw %}x",
    "x\rtouch pwned",
    "--wrap='touch pwned'",
    "$'\\x74ouch' pwned",
    "ａ",  # fullwidth: not ASCII
    "!!",
]
assert len(HOSTILE) >= 20

STUB = """#!{python}
import json, os, sys
with open(os.path.join(os.environ["MODAK_RECORD_DIR"], "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": {{k: v for k, v in os.environ.items() if k.startswith("HOSTILE")}}}}) + "\\n")
"""
PASSTHROUGH = """#!/bin/bash
exec "$@"
"""


def run_script(text: str, tmp_path: Path) -> tuple[list[dict], set[str]]:
    stubs, work, record = tmp_path / "stubs", tmp_path / "work", tmp_path / "record"
    for d in (stubs, work, record):
        d.mkdir()
    for prog in ("python3", "podman", "apptainer", "ch-run", "mpirun"):
        (stubs / prog).write_text(STUB.format(python=sys.executable))
        (stubs / prog).chmod(0o755)
    (stubs / "srun").write_text(PASSTHROUGH)
    (stubs / "srun").chmod(0o755)
    (work / "job.sh").write_text(text)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(work), "MODAK_RECORD_DIR": str(record)}
    proc = subprocess.run(["bash", "job.sh"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(line) for line in (record / "calls.jsonl").read_text().splitlines()]
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    # a target whose figures are unknown is probed first: fixed words, no user value
    probes = [c for c in calls if "modak_runtime.probe" in c["argv"]]
    for c in probes:
        assert c["argv"][-4:] == ["-m", "modak_runtime.probe", "--seconds", "6"], c
    return [c for c in calls if c not in probes], left


def expected_files(tmp_path):
    return {"stubs", "work", "record", "work/job.sh", "record/calls.jsonl"} | {
        f"stubs/{p}" for p in ("python3", "podman", "apptainer", "ch-run", "mpirun", "srun")}


# ---------------------------------------------------------------------------
# fields that reach the script unquoted must reject every hostile value
PATTERN_FIELDS = [
    ("job", "job_name"), ("job", "partition"), ("job", "queue"), ("job", "account"),
    ("job", "standard_output_file"), ("job", "email_address"), ("job", "request_specific_nodes"),
    ("application", "script"), ("application", "executable"), ("application", "model"),
    ("application", "dataset"), ("target", "image_dir"),
]


@pytest.mark.parametrize("section, field", PATTERN_FIELDS, ids=lambda x: str(x))
@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_pattern_fields_reject_hostile_values(section, field, value):
    with pytest.raises((InputError, ValueError)) as exc:
        request(**{section: {field: value}})
    assert field in str(exc.value)


def test_environment_names_are_validated():
    for name in ("A B", "$(x)", "1X", "X-Y", "X\nY"):
        with pytest.raises(ValueError):
            request(environment={name: "v"})


# ---------------------------------------------------------------------------
# free text (arguments, environment values) is quoted: it arrives verbatim
INERT = [v for v in HOSTILE]


@pytest.mark.parametrize("value", INERT, ids=range(len(INERT)))
def test_arguments_and_env_values_arrive_verbatim_without_a_container(value, tmp_path):
    req = request(application={"arguments": ["--name", value]},
                  environment={"HOSTILE_VALUE": value})
    text = plan_of(req).files["job.sh"]
    calls, left = run_script(text, tmp_path)
    assert left == expected_files(tmp_path), "an unexpected file appeared"
    (call,) = calls
    assert call["prog"] == "python3"
    # the runtime starts the unmodified script: user words only after its "--"
    assert call["argv"] == ["-m", "modak_runtime", "--", "train.py", "--name", value]
    assert call["env"] == {"HOSTILE_VALUE": value}
    assert "49" not in json.dumps(call) or "49" in value


@pytest.mark.parametrize("value", INERT, ids=range(len(INERT)))
@pytest.mark.parametrize("runtime", ["podman", "apptainer", "charliecloud"])
def test_values_arrive_verbatim_at_the_container_runtime(value, runtime, tmp_path):
    req = request(scheduler="slurm", runtime=runtime,
                  application={"arguments": [value]}, environment={"HOSTILE_VALUE": value})
    text = plan_of(req).files["job.sh"]
    calls, left = run_script(text, tmp_path)
    assert left == expected_files(tmp_path)
    (call,) = calls
    argv = call["argv"]
    assert argv[-1] == value and argv[-2] == "train.py"
    flag = {"podman": "--env", "apptainer": "--env", "charliecloud": None}[runtime]
    if flag:
        assert f"HOSTILE_VALUE={value}" == argv[argv.index(f"HOSTILE_VALUE={value}")]
        assert argv[argv.index(f"HOSTILE_VALUE={value}") - 1] == flag
    else:
        assert f"--set-env=HOSTILE_VALUE={value}" in argv


def test_dsl_arguments_string_is_split_then_quoted(tmp_path):
    doc = {"job": {"application": {"executable": "python3 train.py",
                                   "arguments": "--out '$(touch pwned)' --tag `id` \"a b\""},
                   "target": {"job_scheduler_type": "none"},
                   "optimisation": {"app_type": "ai_training", "app_type-ai_training": {
                       "config": {"ai_framework": "pytorch"},
                       "ai_framework-pytorch": {"version": "2.13"}}}}}
    req = read_dsl(doc, "r.json")
    calls, left = run_script(plan_of(req).files["job.sh"], tmp_path)
    assert left == expected_files(tmp_path)
    assert calls[0]["argv"] == ["-m", "modak_runtime", "--", "train.py", "--out", "$(touch pwned)",
                                "--tag", "`id`", "a b"]


def test_nul_is_rejected_even_in_free_text():
    with pytest.raises(ValueError):
        request(application={"arguments": ["a\x00b"]})


def test_recipe_values_are_validated():
    for bad in ("torch; touch pwned", "torch==2.13.0 && x", "$(x)", "-e git+x"):
        with pytest.raises(ValueError):
            request(application={"pip_packages": [bad]})


def test_a_value_with_commas_reaches_apptainer_whole(tmp_path):
    """Apptainer's --env splits on commas: such a value goes as APPTAINERENV_NAME instead, so
    ',SECOND=x' cannot set a second variable inside the container."""
    value = "a,SECOND=injected,b"
    req = request(scheduler="slurm", runtime="apptainer", environment={"HOSTILE_VALUE": value})
    text = plan_of(req).files["job.sh"]
    assert f"--env HOSTILE_VALUE=" not in text and "SECOND" not in text.split("apptainer exec")[1]
    calls, _ = run_script(text, tmp_path)
    (call,) = calls
    assert not any("SECOND" in a for a in call["argv"])
    assert "export APPTAINERENV_HOSTILE_VALUE=a,SECOND=injected,b\n" in text


@pytest.mark.parametrize("path, why", [
    ("/", "system or work directory"), ("/etc/shadow", "system or work directory"),
    ("/usr/share/data", "system or work directory"), ("/proc/self/root", "system or work"),
    ("/work/train", "system or work directory"), ("//etc", "system or work directory"),
    ("data/train", "must be absolute"), ("./data", "must be absolute"),
    ("/home/someone/.ssh", "credentials"), ("/scratch/u/.gnupg/keys", "credentials"),
    ("/scratch/a:/etc", "must match"), ("/scratch/x,ro", "must match"),
    ("/opt", "hide the image's own /opt/venv"), ("/opt/venv", "hide the image's own"),
    ("/opt/./venv/lib", "hide the image's own /opt/venv"),
])
def test_a_dataset_is_data_outside_the_containers_own_directories(path, why):
    """A dataset is bound into the container at its own path: never over the container's
    system or its work directory, never credentials, never a path with a bind's separators."""
    with pytest.raises(ValueError) as exc:
        request(application={"dataset": path})
    assert "application.dataset" in str(exc.value) and why in str(exc.value)
    doc = {"job": {"application": {"executable": "python3 train.py"},
                   "target": {"job_scheduler_type": "none"},
                   "optimisation": {"app_type": "ai_training", "app_type-ai_training": {
                       "config": {"ai_framework": "pytorch"}, "data": {"location": path},
                       "ai_framework-pytorch": {"version": "2.13"}}}}}
    with pytest.raises(InputError) as exc:
        read_dsl(doc, "r.json")
    assert "job.optimisation.app_type-ai_training.data.location" in str(exc.value)


@pytest.mark.parametrize("path, kept", [
    ("/opt/datasets/imagenet", "/opt/datasets/imagenet"), ("/opt/venvdata", "/opt/venvdata"),
    ("/optical/./runs/", "/optical/runs"), ("/scratch//u/d", "/scratch/u/d"),
    ("/var/tmp/data", "/var/tmp/data"),
])
def test_a_dataset_beside_the_images_own_directories_is_kept(path, kept):
    """Beside what the container itself holds (not over it, nor above it), a dataset is kept,
    normalised."""
    assert request(application={"dataset": path}).application.dataset == kept


def test_a_dataset_is_bound_read_only_at_its_own_path_and_checked_on_the_node(tmp_path):
    """The script's own arguments name the data where the cluster has it: the container gets
    it at that path, read-only, and MODAK_DATASET names it; a node without it stops the job
    before anything starts. A path longer than the plan table's line is printed whole."""
    data = tmp_path / "scratch" / ("imagenet-" + "x" * 90)
    data.mkdir(parents=True)
    binds = {"podman": "--volume", "apptainer": "--bind"}
    for runtime, flag in binds.items():
        req = request(scheduler="slurm", runtime=runtime,
                      application={"dataset": str(data), "arguments": ["--data", f"{data}/t"]})
        (tmp_path / runtime).mkdir()
        result = plan_of(req)
        assert f" data {data} (read-only, at that path) " in " ".join(
            plan_table(result.plan).split())
        calls, _ = run_script(result.files["job.sh"], tmp_path / runtime)
        (call,) = [c for c in calls if c["prog"] == runtime]
        argv = call["argv"]
        assert argv[argv.index(f"{data}:{data}:ro") - 1] == flag
        assert argv[-2:] == ["--data", f"{data}/t"]
        assert f"MODAK_DATASET={data}" in argv
    # the node lacks it: the job says so and launches nothing
    gone = tmp_path / "scratch" / "gone"
    req = request(scheduler="slurm", runtime="podman", application={"dataset": str(gone)})
    work = tmp_path / "node"
    work.mkdir()
    (work / "job.sh").write_text(plan_of(req).files["job.sh"])
    proc = subprocess.run(["bash", "job.sh"], cwd=work, env={"PATH": "/nonexistent:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 66
    assert proc.stderr.startswith(f"modak: the dataset {gone} (application.dataset) is not on ")


def test_further_data_paths_are_bound_and_checked_as_the_dataset_is(tmp_path):
    """A script that reads more than its dataset (its starting weights, in another
    directory) names them in application.data_paths: each is bound at its own path (read-
    only), made in a Charliecloud image, and checked on the node, which stops the job naming
    the one it lacks; MODAK_DATASET still names the dataset."""
    data, weights = tmp_path / "scratch" / "imagenet", tmp_path / "home" / "weights"
    data.mkdir(parents=True)
    weights.mkdir(parents=True)
    app = {"dataset": str(data), "data_paths": [str(weights)]}
    result = plan_of(request(scheduler="slurm", runtime="podman", application=app))
    assert result.plan.dataset == str(data) and result.plan.data_paths == (str(weights),)
    assert f" data {data}, {weights} (read-only, at each one's own path) " in " ".join(
        plan_table(result.plan).split())
    calls, _ = run_script(result.files["job.sh"], tmp_path)
    (call,) = [c for c in calls if c["prog"] == "podman"]
    argv = call["argv"]
    for path in (data, weights):
        assert argv[argv.index(f"{path}:{path}:ro") - 1] == "--volume"
    assert f"MODAK_DATASET={data}" in argv
    ch = plan_of(request(scheduler="slurm", runtime="charliecloud",
                         application={"data_paths": ["/scratch/a", "/scratch/b"]}))
    assert ch.files["Dockerfile.charliecloud"].splitlines()[-1] == "RUN mkdir -p /scratch/a " \
        "/scratch/b" and "MODAK_DATASET" not in ch.files["job.sh"]
    # the node lacks the second: the job names it and its field, and launches nothing
    gone = tmp_path / "home" / "gone"
    app = {"dataset": str(data), "data_paths": [str(weights), str(gone)]}
    work = tmp_path / "node"
    work.mkdir()
    (work / "job.sh").write_text(plan_of(request(scheduler="slurm", runtime="podman",
                                                 application=app)).files["job.sh"])
    proc = subprocess.run(["bash", "job.sh"], cwd=work, env={"PATH": "/nonexistent:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 66
    assert proc.stderr.startswith(f"modak: the data {gone} (application.data_paths) is not on ")
    # what is refused, with its field
    for bad, said in (([str(weights), f"{weights}/"], "is named twice"),
                      ([str(data)], "names the dataset"), (["weights"], "must be absolute"),
                      (["/etc/ssl"], "the container's own system"),
                      ([f"/d{i}" for i in range(17)], "at most 16 items")):
        with pytest.raises(ValueError, match=said):
            request(application={"dataset": str(data), "data_paths": bad})


def test_data_paths_in_the_dsl_are_read_and_refused_with_their_field():
    doc = {"job": {"application": {"executable": "python3 train.py",
                                   "data_paths": ["/scratch/w", "relative/w"]},
                   "target": {"job_scheduler_type": "slurm"},
                   "optimisation": {"app_type": "ai_training", "app_type-ai_training": {
                       "config": {"ai_framework": "pytorch"},
                       "ai_framework-pytorch": {"version": "2.13"}}}}}
    with pytest.raises(InputError) as err:
        read_dsl(doc, "r.json")
    said = str(err.value)
    assert "r.json: job.application.data_paths[1]: dataset path 'relative/w' must be " \
        "absolute" in said
    doc["job"]["application"]["data_paths"] = ["/scratch/w"]
    assert read_dsl(doc, "r.json").application.data_paths == ("/scratch/w",)


def test_a_charliecloud_image_has_its_datasets_mount_point(tmp_path):
    """ch-run binds onto a directory its read-only image has: the Charliecloud recipe makes
    the dataset's path, last (its earlier layers are the same image's), and ch-run binds the
    data there; the other runtimes' recipes, which need none, stay the same image.  Under
    /tmp (which ch-run binds from the node) the image needs none."""
    def plan_with(dataset):
        app = {"dataset": dataset} if dataset else {}
        return plan_of(request(scheduler="slurm", runtime="charliecloud", application=app))

    bare = plan_with(None)
    for data, mount in (("/scratch/proj/my data+1", None), ("/scratch/proj/imagenet", True),
                        (str(tmp_path / "d"), False)):
        if mount is None:  # (a space is refused, as in every path)
            with pytest.raises(ValueError, match="invalid dataset path"):
                plan_with(data)
            continue
        result = plan_with(data)
        recipe = result.files["Dockerfile.charliecloud"].splitlines()
        assert recipe[:-1] == bare.files["Dockerfile.charliecloud"].splitlines()[:len(recipe) - 1]
        assert (recipe[-1] == f"RUN mkdir -p {data}") is mount
        assert (result.plan.image.tag != bare.plan.image.tag) is mount
        for other in ("Containerfile", "apptainer.def"):
            assert result.files[other] == bare.files[other]
        assert (f" data {data} (at that path; charliecloud binds it writable where the login "
                "may write, and its image has the path) ") in " ".join(
                    plan_table(result.plan).split())
        (line,) = [x for x in result.files["job.sh"].splitlines()
                   if x.startswith("srun ch-run ")]
        words = line.split()
        assert words[words.index(f"{data}:{data}") - 1] == "--bind"
        assert words.index(f"{data}:{data}") < words.index(result.plan.image.reference)
    # on a node that has it, ch-run gets it
    Path(data).mkdir()
    calls, _ = run_script(result.files["job.sh"], tmp_path)
    (call,) = [c for c in calls if c["prog"] == "ch-run"]
    assert f"{data}:{data}" in call["argv"] and f"--set-env=MODAK_DATASET={data}" in call["argv"]


def test_jemalloc_comes_with_its_measured_tuning():
    from modak_lib.catalogue import load_catalogue
    from modak_lib.models import Configuration
    from modak_lib.pipeline import option_environment
    cat = load_catalogue()
    req = request()
    cfg = Configuration(image="pytorch-2.13.0-cpu", threads=2, allocator="jemalloc")
    env = option_environment(cfg, cat.variant(cfg.image), req, cat)
    assert env["LD_PRELOAD"].endswith("libjemalloc.so.2")
    assert env["MALLOC_CONF"].startswith("oversize_threshold:1,background_thread:true")
    cfg = Configuration(image="pytorch-2.13.0-cpu", threads=2, allocator="tcmalloc")
    assert "MALLOC_CONF" not in option_environment(cfg, cat.variant(cfg.image), req, cat)
