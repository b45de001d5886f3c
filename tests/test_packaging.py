"""MODAK as users install it: the built wheel and the built collection, in fresh places.

One module-scoped fixture builds both artefacts from this checkout, creates a new virtual
environment outside it, installs the wheel (with its dependencies, ansible-core and the
user's own torch) and the collection tarball into a new collections path, and runs everything
from a directory outside the checkout with a clean environment, so that nothing of the
repository is on any path: a packaging regression (a data file left out of the wheel, a
role that reads from the checkout) fails here.
"""
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

import modak_lib

pytestmark = pytest.mark.slow


def _run(argv, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 900)
    return subprocess.run(argv, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("installed")
    dist = base / "dist"
    # the artefacts, as a release would build them
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--disable-pip-version-check", "-q", "-w", str(dist), str(ROOT)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run(["ansible-galaxy", "collection", "build", "--output-path", str(dist), str(ROOT)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(dist.glob("modak-*.whl"))
    tarball = next(dist.glob("modak-modak-*.tar.gz"))

    # a fresh venv from the base interpreter (not this one, which has the checkout on its path)
    venv = base / "venv"
    python = getattr(sys, "_base_executable", sys.executable)
    proc = _run([python, "-m", "venv", str(venv)])
    assert proc.returncode == 0, proc.stderr
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    proc = _run(pip + [str(wheel), "ansible-core>=2.16,<2.20", "torch==2.13.0"])
    if proc.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"installing the wheel into a fresh venv failed: {proc.stderr[-3000:]}")
        pytest.skip("installing the wheel's dependencies needs the package index: "
                    f"{proc.stderr.strip().splitlines()[-1:]}")
    collections = base / "collections"
    env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(base / "home"),
           "LANG": "C.UTF-8", "MODAK_HOME": str(base / "modak-home"),
           "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_LOCAL_TEMP": str(base / "ansible-tmp")}
    (base / "home").mkdir()
    proc = _run([str(venv / "bin/ansible-galaxy"), "collection", "install", "--offline",
                 "-p", str(collections), str(tarball)], env=env, cwd=base)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    work = base / "work"
    work.mkdir()

    def run(*argv, cwd=work):
        exe = str(venv / "bin" / argv[0])
        return _run([exe, *argv[1:]], env=env, cwd=cwd)

    run.wheel, run.tarball, run.work, run.env = wheel, tarball, work, env
    return run


def test_the_artefacts_carry_their_data_and_no_build_output(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    for needed in ("modak_lib/data/measurements.csv", "modak_lib/data/transfer-campaign.csv.gz",
                   "modak_lib/data/quick-comparison.json", "modak_lib/data/catalogue.yaml",
                   "modak_lib/data/tosca/modak-types.yaml", "modak_lib/data/examples/train.py",
                   "modak_lib/templates/jobs/job.sh.j2", "modak_runtime/__main__.py"):
        assert needed in names
    assert any(n.endswith("licenses/LICENSES/Apache-2.0.txt") for n in names)
    # setuptools copies the packages into build/lib and never empties it: a file removed or
    # renamed since an earlier build (the campaign's CSV, now compressed) went on shipping
    stale = [n for n in names if n.startswith(("modak_lib/", "modak_runtime/"))
             and not (ROOT / n).exists()]
    assert not stale, f"the wheel carries files the checkout no longer has: {stale} " \
        "(left in build/lib by an earlier build: remove build/lib and build again)"
    with tarfile.open(installed.tarball) as tar:
        members = tar.getnames()
    assert "MANIFEST.json" in members and "LICENSES/GPL-3.0-or-later.txt" in members
    assert "roles/modak_job/meta/argument_specs.yml" in members
    bad = [m for m in members if re.search(r"(__pycache__|\.pyc$|\.egg-info|^build/|^\.venv/"
                                           r"|^tests/output|^dist/|^\.git/)", m)]
    assert not bad, bad


def test_the_installed_cli_plans_from_its_own_data_outside_the_checkout(installed):
    where = installed("python", "-c", "import modak_lib, sys; print(modak_lib.__file__); "
                      "print(sys.path)")
    assert where.returncode == 0 and str(ROOT) not in where.stdout
    assert "site-packages" in where.stdout.splitlines()[0]
    proc = installed("modak", "init", "project")
    assert proc.returncode == 0, proc.stderr
    proj = installed.work / "project"
    # this host's figures first, as a user of a new machine does: the model needs this
    # host's own GFLOP/s and bandwidth (a probe), even for a CPU kind the shipped data has
    proc = installed("modak", "probe", "--infra", "infra-local.yaml", "--seconds", "2",
                     cwd=proj)
    assert proc.returncode == 0 and "GFLOP/s" in proc.stdout, proc.stderr
    plans = []
    for _ in range(2):  # the first fits the model on the shipped datasets, the second loads it
        proc = installed("modak", "plan", "blueprint.yaml", "--infra", "infra-local.yaml",
                         "--json", cwd=proj)
        assert proc.returncode == 0, proc.stderr
        plans.append(json.loads(proc.stdout))
    assert [p["decided_by"] for p in plans] == ["model", "model"]
    assert plans[1]["candidates"][0]["prediction"]["seconds"] > 0
    table = installed("modak", "plan", "blueprint.yaml", "--infra", "infra-local.yaml",
                      cwd=proj).stdout
    assert max(len(line) for line in table.splitlines()) <= 100
    ev = installed("modak", "model", "eval", "--estimator", "linear", "--compare", "none")
    assert ev.returncode == 0, ev.stderr
    assert "mobile-cnn" in ev.stdout  # the shipped transfer campaign's families
    assert re.search(r"family\s+configs\s+LOCO MAPE\s+LOWO MAPE\s+LOWO \+stock\s+LOTO MAPE",
                     ev.stdout)
    types = json.loads(installed("modak", "tosca-types", "--json").stdout)
    assert types["version"] == modak_lib.__version__ and "site-packages" in types["path"]


def test_the_installed_collection_documents_its_roles(installed):
    proc = installed("ansible-doc", "-t", "role", "modak.modak.modak_job")
    assert proc.returncode == 0, proc.stderr
    assert "modak_job_timeout" in proc.stdout and "modak_job_poll" in proc.stdout


def test_the_installed_collection_deploys_with_a_local_connection(installed):
    proj = installed.work / "deployed"
    assert installed("modak", "init", str(proj)).returncode == 0
    proc = installed("ansible-playbook", "modak.modak.deploy", "-i", str(proj / "inventory.yml"),
                     "-e", '{"modak_inputs": {"steps": "12"}, "modak_job_poll": 1, '
                     f'"modak_work_dir": "{installed.work / "runs"}"}}')
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert re.search(r"job local-\d+ COMPLETED \(exit code 0\)", proc.stdout)
    assert re.search(r"^\[frontend\] job local-\d+ COMPLETED, \d+:\d\d:\d\d since submission$",
                     proc.stdout, re.M)
    home = Path(installed.env["MODAK_HOME"])
    assert list((home / "results").glob("*/mnist-cnn.out"))  # under the user's directory
    assert list((home / "plans").glob("*/plan.json"))
    # a play without a request is an error naming the variable, not a deploy of an example
    proc = installed("ansible-playbook", "modak.modak.deploy", "-i", str(proj / "inventory.yml"),
                     "-e", "modak_request=")
    assert proc.returncode != 0 and "no request: set modak_request" in proc.stdout


def _plugin_utils():
    sys.path.insert(0, str(ROOT / "build/collections"))  # scripts/setup-venv links it
    try:
        from ansible_collections.modak.modak.plugins.plugin_utils import modak_library
    finally:
        sys.path.pop(0)
    return modak_library


def test_the_action_plugins_refuse_a_library_of_another_version(monkeypatch):
    pytest.importorskip("ansible")
    from ansible.errors import AnsibleActionFail
    lib = _plugin_utils()
    assert lib.collection_version() == modak_lib.__version__  # from galaxy.yml here
    assert lib.check_library("modak_plan") is modak_lib
    monkeypatch.setattr(modak_lib, "__version__", "0.0.1")
    with pytest.raises(AnsibleActionFail, match=r"modak_plan: the modak Python package is "
                       r"0\.0\.1 but the collection modak\.modak is .*pip install modak=="):
        lib.check_library("modak_plan")


def test_one_version_number_for_the_package_the_runtime_and_the_collection():
    import modak_runtime
    galaxy = (ROOT / "galaxy.yml").read_text()
    assert re.search(r"^version: %s$" % re.escape(modak_lib.__version__), galaxy, re.M)
    assert modak_runtime.__version__ == modak_lib.__version__
    assert 'version = { attr = "modak_lib.__version__" }' in (ROOT / "pyproject.toml").read_text()
