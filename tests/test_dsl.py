"""The MODAK optimisation DSL: every branch accepted, every mistake named by its path."""
import json

import pytest
from conftest import DELETE, ROOT, dsl, run_modak

from modak_lib.errors import InputError
from modak_lib.models import Compiler, Framework
from modak_lib.readers import read_request
from modak_lib.readers.dsl import read_dsl


def test_shipped_example_reads_like_the_old_service():
    req = read_request(ROOT / "examples/resnet50/request.json")
    app = req.application
    # "python3 resnet/resnet_imagenet_main.py" + an arguments string, as the old DSL had them
    assert (app.executable, app.script) == ("python3", "resnet/resnet_imagenet_main.py")
    assert app.arguments[:2] == ("--data_dir=/scratch/abc/imagenet/train", "--batch_size=96")
    assert app.framework == Framework.tensorflow and app.framework_version == "2.1"
    assert app.user_image == "tensorflow/tensorflow:2.1.0-gpu-py3"
    assert req.optimisation.compilers == (Compiler.xla,)
    assert req.target.scheduler == "pbs"  # torque
    assert req.target.accelerators.vendor == "nvidia" and req.target.accelerators.count == 1
    assert req.job.wall_time_limit == 12 * 3600  # "12:00:00 " with its trailing blank
    assert req.job.mail_events == ("begin", "end", "fail")
    assert req.target.cores_per_node == 40  # from core_count, without an infra file


@pytest.mark.parametrize("framework, section, extra, expect", [
    ("tensorflow", {"version": "2.21", "xla": True}, {}, [Compiler.xla]),
    ("tensorflow", {"version": "2.1", "ngraph": True}, {}, [Compiler.ngraph]),
    ("pytorch", {"version": "2.13", "glow": True}, {}, [Compiler.glow]),
    ("pytorch", {"version": "2.13", "compile": ["default", "max-autotune"]}, {},
     [Compiler.torch_compile]),
    ("keras", {"version": "3", "backend": "jax", "jit_compile": True}, {}, [Compiler.xla]),
    ("mxnet", {"version": "1.9"}, {}, []),
    ("cntk", {"version": "2.7"}, {}, []),
])
def test_every_ai_framework_branch(framework, section, extra, expect):
    doc = dsl(**{"job.optimisation.app_type-ai_training": {
        "config": {"ai_framework": framework}, f"ai_framework-{framework}": section}})
    req = read_dsl(doc, "r.json")
    assert req.application.framework.value == framework
    assert list(req.optimisation.compilers) == expect
    if framework == "pytorch" and "compile" in section:
        assert req.optimisation.compiler_modes == ("default", "max-autotune")


def test_the_steps_the_job_runs_reach_the_plan():
    doc = dsl(**{"job.optimisation.app_type-ai_training": {
        "config": {"ai_framework": "pytorch", "steps": 600},
        "ai_framework-pytorch": {"version": "2.13", "compile": True}}})
    assert read_dsl(doc, "r.json").application.steps == 600
    found = problems(dsl(**{"job.optimisation.app_type-ai_training.config.steps": 0}))
    assert any(p == "job.optimisation.app_type-ai_training.config.steps" for p, _ in found), found


def test_the_epochs_the_job_runs_reach_the_plan_and_not_beside_its_steps():
    config = "job.optimisation.app_type-ai_training.config"
    doc = dsl(**{"job.optimisation.app_type-ai_training": {
        "config": {"ai_framework": "pytorch", "epochs": 30},
        "ai_framework-pytorch": {"version": "2.13"}}})
    app = read_dsl(doc, "r.json").application
    assert app.epochs == 30 and app.steps is None
    assert any(p == f"{config}.epochs" for p, _ in problems(dsl(**{f"{config}.epochs": 0})))
    assert problems(dsl(**{f"{config}.epochs": 3, f"{config}.steps": 600})) == [
        (config, "steps and epochs both state the job's length: state one")]


def test_hpc_mpi_branch():
    doc = dsl(**{"job.optimisation": {
        "enable_opt_build": False, "app_type": "hpc",
        "app_type-hpc": {"config": {"parallelisation": "mpi"},
                         "parallelisation-mpi": {"library": "openmpi", "version": "4.1"}}},
        "job.application.mpi_ranks": 4})
    req = read_dsl(doc, "r.json")
    assert req.application.app_type == "hpc" and req.application.mpi_ranks == 4


def problems(doc):
    with pytest.raises(InputError) as exc:
        read_dsl(doc, "bad.json")
    assert exc.value.source == "bad.json"
    return exc.value.problems


@pytest.mark.parametrize("changes, path, words", [
    ({"job.job_options.colour": "red"}, "job.job_options.colour", "unknown key"),
    ({"job.optimisation.app_type-ai_training.ai_framework-pytorch.speed": 1},
     "job.optimisation.app_type-ai_training.ai_framework-pytorch.speed", "unknown key"),
    ({"job.extra": {}}, "job.extra", "unknown key"),
    # a slip of a known key names it; a key close to none lists the known ones, where few
    ({"job.job_options.job_nmae": "x"}, "job.job_options.job_nmae",
     "unknown key (did you mean 'job_name'?)"),
    ({"job.application.colour": "red"}, "job.application.colour",
     "unknown key (known: app_tag, app_type, arguments,"),
    ({"job.job_options.wall_time_limit": "1 day, 6:00:00"}, "job.job_options.wall_time_limit",
     "invalid wall time"),
    ({"job.target.job_scheduler_type": "sge"}, "job.target.job_scheduler_type", "slurm"),
    ({"job.optimisation.app_type-ai_training.config.ai_framework": "caffe"},
     "job.optimisation.app_type-ai_training.config.ai_framework", "tensorflow"),
    ({"job.optimisation.app_type-ai_training.ai_framework-pytorch": DELETE},
     "job.optimisation.app_type-ai_training", "ai_framework-pytorch"),
    ({"job.optimisation.app_type": "hpc"}, "job.optimisation", "app_type-hpc"),
    ({"job.optimisation.opt_build": {"cpu_type": "sparc"}}, "job.optimisation.opt_build.cpu_type",
     "x86"),
    ({"job.job_options.request_event_notification": "abe"}, "job.job_options",
     "email_address is required"),
    ({"job.job_options.combine_stdout_stderr": False}, "job.job_options",
     "standard_error_file is required"),
    ({"job.job_options.node_count": 0}, "job.job_options.node_count", "greater than 0"),
    ({"job.job_options.job_name": "a b"}, "job.job_options.job_name", "invalid job name"),
    ({"job.job_options.email_address": "not-an-address"}, "job.job_options.email_address",
     "invalid e-mail"),
    ({"job.application.arguments": "--name 'unclosed"}, "job.application.arguments",
     "cannot split"),
    ({"job.application.executable": "python3 ../../etc/x.py"}, "job.application.executable",
     "'..' is not allowed"),
])
def test_errors_name_the_field(changes, path, words):
    found = problems(dsl(**changes))
    assert any(p == path and words in m for p, m in found), found


def test_cli_error_exit_2_without_traceback(tmp_json):
    path = tmp_json(dsl(**{"job.job_options.wall_time_limit": "soon"}))
    proc = run_modak("plan", str(path), separate=True)  # the installed command itself
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{path}: job.job_options.wall_time_limit: invalid wall time 'soon'" in proc.stderr


def test_cli_reports_json_syntax_error_with_line(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{\n  "job": {\n    "job_options": {,}\n  }\n}\n')
    proc = run_modak("plan", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{bad}: invalid JSON at line 3" in proc.stderr


def test_cli_missing_file(tmp_path):
    proc = run_modak("plan", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "nope.json: file not found" in proc.stderr


def test_not_a_request(tmp_json):
    proc = run_modak("plan", str(tmp_json({"jobs": []})))
    assert proc.returncode == 2 and "neither a TOSCA blueprint" in proc.stderr


def test_schema_validates_the_shipped_dsl_example():
    jsonschema = pytest.importorskip("jsonschema")
    proc = run_modak("schema", "--only", "dsl")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    example = json.loads((ROOT / "examples/resnet50/request.json").read_text())
    jsonschema.validate(example, schema)
    example["job"]["job_options"]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(example, schema)


def test_schema_of_everything_names_each_input():
    proc = run_modak("schema")
    assert proc.returncode == 0
    defs = json.loads(proc.stdout)["$defs"]
    for name in ("DslDocument", "Target", "Application", "JobOptions", "Optimisation", "Plan"):
        assert name in defs
