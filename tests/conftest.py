"""Shared helpers: build requests and plans without files, run rendered scripts safely."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from modak_lib.models import JobRequest
from modak_lib.pipeline import make_plan

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"

BASE_DSL: dict[str, Any] = {
    "job": {
        "job_options": {"job_name": "train", "wall_time_limit": "01:00:00", "core_count": 4},
        "application": {"executable": "python3 train.py", "arguments": "--steps 10"},
        "target": {"job_scheduler_type": "slurm"},
        "optimisation": {
            "enable_opt_build": True, "app_type": "ai_training",
            "app_type-ai_training": {"config": {"ai_framework": "pytorch"},
                                     "ai_framework-pytorch": {"version": "2.13"}},
        },
    }
}


def dsl(**changes: Any) -> dict[str, Any]:
    """BASE_DSL with dotted-path changes: dsl(**{"job.job_options.job_name": "x"})."""
    doc = copy.deepcopy(BASE_DSL)
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return doc


DELETE = object()


def request(scheduler: str = "local", runtime: str = "none", framework: str = "pytorch",
            version: str = "2.13", **sections: dict[str, Any]) -> JobRequest:
    """A JobRequest built directly (no reader), for renderer and hostile-input tests."""
    data: dict[str, Any] = {
        "source": "test-request.json", "source_format": "modak-dsl",
        "job": {"job_name": "train", "wall_time_limit": 3600},
        "application": {"framework": framework, "framework_version": version,
                        "script": "train.py"},
        "optimisation": {},
        "target": {"name": "testhost", "scheduler": scheduler, "container_runtime": runtime,
                   "cores_per_node": 4, "microarchitecture": "x86_64_v3"},
        "environment": {},
    }
    for key, value in sections.items():
        data[key].update(value)
    return JobRequest.model_validate(data)


def plan_of(req: JobRequest, **kw: Any):
    return make_plan(req, run_id="test-run", **kw)


def need(module: str):
    """Import a framework a test needs; missing is a failure in CI, a skip elsewhere."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} missing in CI: scripts/setup-venv installs '.[workloads]'")
        pytest.skip(f"{module} not installed: pip install -e '.[workloads]'")


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def run_modak(*args: str, cwd: Path | None = None,
              separate: bool = False) -> subprocess.CompletedProcess:
    """``modak ARGS``: in this process (``cli.main``, its output captured, an exception
    propagating as the failure it is), or as the installed command when ``separate``
    (what only a process shows: the console script, its exit status, no traceback)."""
    if separate:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run(["modak", *args], capture_output=True, text=True,
                              cwd=cwd or ROOT, env=env, timeout=60)
    from modak_lib.cli import main
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["modak", *args], code, out.getvalue(), err.getvalue())


# Under pytest-xdist (scripts/test: a worker per core) the tests of these modules run in one
# worker, one after another: the front-end's (its single Slurm node, its user's home, the
# session's start and stop of it), and the packaging tests (their module's wheel and fresh
# venv, built once). Every other test is a unit of its own, sent to whichever worker is free.
FRONTEND_MODULES = ("test_deploy.py", "test_xopera.py", "test_molecule.py",
                    "test_runtime_slurm.py")
ONE_WORKER_MODULES = ("test_packaging.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":  # another --dist given: xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        # (xdist's loadgroup marks cannot do it: pytest 9 no longer lets them rename a test)
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            name = module.rsplit("/", 1)[-1]
            if name in FRONTEND_MODULES:
                return "frontend"
            return module if name in ONE_WORKER_MODULES else nodeid

    return Scheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def _isolated_store_and_model(tmp_path_factory):
    """Tests never read or write the user's results store or model."""
    d = tmp_path_factory.mktemp("modak-data")
    os.environ["MODAK_RESULTS"] = str(d / "results.sqlite")
    os.environ["MODAK_MODEL"] = str(d / "model.joblib")
    os.environ["MODAK_PROBES"] = str(d / "probes.json")
    yield


@pytest.fixture(scope="session")
def fitted_model(tmp_path_factory) -> Path:
    """One model fitted on the shipped dataset, for the tests that only plan with it (a test
    of the closed loop fits its own): copy it, never write to it."""
    path = tmp_path_factory.mktemp("fitted") / "model.joblib"
    from modak_lib.perf.fit import fit_if_possible
    assert fit_if_possible(path), "no model could be fitted on the shipped dataset"
    return path


@pytest.fixture
def tmp_json(tmp_path):
    def make(data: Any, name: str = "request.json") -> Path:
        return write_json(tmp_path / name, data)
    return make


# ---------------------------------------------------------------------------
# the real front-end (scripts/frontend), shared by the tests of FRONTEND_MODULES
FRONTEND = ROOT / "scripts/frontend"


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not shutil.which("apt-get") or not Path("/etc/debian_version").exists():
        return "needs Debian's apt-get"
    if not shutil.which("ansible-playbook"):
        return "needs ansible-core (scripts/setup-venv installs it)"
    return None


@pytest.fixture
def frontend(request):
    """The local front-end, for a test of one of FRONTEND_MODULES (their worker's alone)."""
    if request.node.path.name not in FRONTEND_MODULES:
        pytest.fail(f"{request.node.path.name} takes the front-end: add it to FRONTEND_MODULES "
                    "in tests/conftest.py, whose tests run one after another in one worker")
    request.getfixturevalue("_frontend_up")


@pytest.fixture(scope="session")
def _frontend_up():
    why = _unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the deploy tests must run in CI but {why}")
        pytest.skip(f"{why}: run scripts/test as root on Debian (scripts/frontend installs "
                    "Slurm, SSH, Podman and Charliecloud)")
    was_up = subprocess.run([str(FRONTEND), "status"], capture_output=True).returncode == 0
    for step in (["install"], ["up"], ["base-image"]):
        proc = subprocess.run([str(FRONTEND), *step], capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"scripts/frontend {step[0]}: {proc.stderr[-3000:]}"
    proc = subprocess.run([str(ROOT / "scripts/wheelhouse")], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    yield
    if not was_up:
        subprocess.run([str(FRONTEND), "down"], check=True, timeout=120)
        assert subprocess.run([str(FRONTEND), "status"], capture_output=True).returncode != 0
