"""What the plan says a job would lack: the user's modules not sent, and the imports and
distributions that the wheelhouse an image installs from has no wheel of (modak_lib.imports)."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from modak_lib.imports import Wheelhouse, check, required_imports

ROOT = Path(__file__).resolve().parents[1]


def _wheel(directory: Path, name: str, members: list[str], requires: tuple = ()) -> Path:
    """A wheel of ``members`` (empty files) and its metadata (``requires``: its
    Requires-Dist), as pip downloads one."""
    directory.mkdir(parents=True, exist_ok=True)
    dist, version = name.split("-")[:2]
    path = directory / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member in members:
            z.writestr(member, "")
        z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


def _script(tmp_path: Path, text: str, name: str = "train.py") -> tuple[str, str]:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path), name


def test_the_required_imports_leave_out_optional_ones_and_name_their_first_line(tmp_path):
    pair = _script(tmp_path, """\
        import os, numpy.linalg as la
        from torch import nn
        from . import sibling
        from .pkg import other
        try:
            import wandb
        except ImportError:
            wandb = None
        try:
            from apex import amp
        except (ModuleNotFoundError, AttributeError):
            amp = None
        try:
            import ujson as json
        except Exception:
            import json
        try:
            import tensorboard
        except ValueError:  # does not make the import optional
            pass
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import mypy_extensions
        else:
            import attr

        def main():
            import yaml
            from torch import optim
        """)
    found = {i.module: i.line for i in required_imports([pair])}
    assert found == {"os": 1, "numpy": 1, "torch": 2, "tensorboard": 18, "typing": 21,
                     "attr": 25, "yaml": 28, "json": 16}
    assert required_imports([(str(tmp_path / "data.csv"), "data.csv")]) == []
    # a file that does not parse names nothing (the job's own error will say why), nor
    # does one nested deeper than the parser goes (it raised RecursionError: a traceback)
    assert required_imports([_script(tmp_path, "import (\n", "broken.py")]) == []
    deep = "import pandas\nx = " + "+".join(["'a'"] * 100_000) + "\n"
    assert required_imports([_script(tmp_path, deep, "deep.py")]) == []
    # as deep as it goes, walked whole (without recursion: it had been 1000 frames)
    deeper = "x = " + "+".join(["'a'"] * 900) + "\nimport pandas\n"
    assert [i.module for i in required_imports([_script(tmp_path, deeper, "d.py")])] == \
        ["pandas"]


def test_a_wheelhouse_gives_every_kind_of_top_level_module_its_wheels_hold(tmp_path):
    house = tmp_path / "wheels"
    _wheel(house, "Pkg_One-1.0", ["pkg/__init__.py", "pkg/sub/mod.py"])
    _wheel(house, "single-2.0", ["single.py"])
    _wheel(house, "fast-3.0", ["_fast.cpython-311-x86_64-linux-gnu.so"])
    _wheel(house, "nspkg-1.0", ["google/protobuf/__init__.py"])
    _wheel(house, "data-1.0", ["data-1.0.data/purelib/inplace/__init__.py",
                               "data-1.0.data/scripts/tool", "data-1.0.data/headers/x.h"])
    _wheel(house, "meta-1.0", [])
    (house / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    read = Wheelhouse.read(house)
    assert read.provides == {"pkg-one": {"pkg"}, "single": {"single"}, "fast": {"_fast"},
                             "nspkg": {"google"}, "data": {"inplace"}, "meta": set()}
    assert read.unreadable == ["broken-1.0-py3-none-any.whl"]
    assert Wheelhouse.read(tmp_path / "none").distributions == set()


def test_a_wheelhouse_installs_the_closure_of_its_images_requirements(tmp_path):
    house = tmp_path / "wheels"
    _wheel(house, "app-1.0", ["app/__init__.py"], (
        "Lib_A>=1", "winonly; sys_platform == 'win32'", "armonly; platform_machine == 'aarch64'",
        "old; python_version < '3.8'", "extra-dep; extra == 'plots'", "not a requirement!"))
    _wheel(house, "app-0.9", ["app/__init__.py"], ("legacy",))  # another version's
    _wheel(house, "lib_a-1.2", ["lib_a/__init__.py"], ("lib-b[fast]",))
    _wheel(house, "lib_b-1.0", ["lib_b/__init__.py"], ("speedup; extra == 'fast'",))
    for name in ("winonly", "armonly", "old", "extra_dep", "legacy", "speedup", "unrelated"):
        _wheel(house, f"{name}-1.0", [f"{name}.py"])
    read = Wheelhouse.read(house)
    assert read.installed(["app"]) == {"app", "lib-a", "lib-b", "speedup", "legacy"}
    assert read.installed(["app[plots]", "missing"], arch="aarch64") == {
        "app", "lib-a", "lib-b", "speedup", "legacy", "extra-dep", "armonly"}
    # the wheels its build is given: those of the closure, every version of each there
    assert read.wheels_for(["app"]) == [f"{n}-py3-none-any.whl" for n in (
        "app-0.9", "app-1.0", "legacy-1.0", "lib_a-1.2", "lib_b-1.0", "speedup-1.0")]
    # not known for sure: a requirement without a wheel (the whole wheelhouse is given)
    assert read.wheels_for(["app", "missing"]) is None
    # what the image does not install is missing, though a wheel of it is there
    script = _script(tmp_path, "import app, lib_b, unrelated\n")
    found = check([script], "train.py", ["app"], read)
    assert [i.module for i in found.missing_imports] == ["unrelated"]
    assert "image x would not have" in found.warning("x", house, True)


def test_the_check_names_what_no_wheel_provides_and_the_modules_not_sent(tmp_path):
    house = tmp_path / "wheels"
    _wheel(house, "torch-2.13.0", ["torch/__init__.py"])
    _wheel(house, "numpy-2.4.6", ["numpy/__init__.py"])
    script = _script(tmp_path / "job", """\
        import tomllib, imghdr, json        # 3.11's standard library, not the controller's
        import numpy, torch
        import model                        # sent, beside the script
        import helpers                      # beside the script, not sent
        import tools                        # a package beside it, not sent
        import pandas
        from sklearn import metrics
        import notinstalledanywhere
        import modak_runtime                # the runtime goes with every run
        """, "src/train.py")
    (tmp_path / "job/src/model.py").write_text("")
    (tmp_path / "job/src/helpers.py").write_text("")
    (tmp_path / "job/src/tools").mkdir()
    (tmp_path / "job/src/tools/__init__.py").write_text("")
    (tmp_path / "job/src/data").mkdir()  # a directory of data is not a module
    files = [script, (str(tmp_path / "job/src/model.py"), "src/model.py"),
             (str(tmp_path / "job/src/model.py"), "src/sklearn.json")]  # (data: no module)
    found = check(files, "src/train.py", ["Pandas>=2", "not a req!"], Wheelhouse.read(house),
                  own=["torch==2.13.0", "numpy", "typing-extensions"])
    assert [i.module for i in found.unsent_modules] == ["helpers", "tools"]
    # (pandas is asked for, without a wheel: said once, as a distribution)
    assert [i.module for i in found.missing_imports] == ["sklearn", "notinstalledanywhere"]
    assert found.missing_distributions == ["typing-extensions", "pandas"]
    said = found.warning("pytorch-2.13.0-cpu", house, default=False)
    assert "'helpers' (src/train.py line 4), 'tools' (src/train.py line 5) from beside the " \
           "script here" in said
    assert "'sklearn' (src/train.py line 7)" in said
    assert f"image pytorch-2.13.0-cpu would not have (it installs its Python packages from " \
           f"the wheelhouse {house} only" in said
    assert "the image installs 'typing-extensions', 'pandas', which the wheelhouse" in said
    # the command downloads each distribution once, by its name (sklearn's is scikit-learn),
    # and the image's own with --image
    assert f"`modak wheelhouse --image pytorch-2.13.0-cpu --dir {house} pandas scikit-learn`" \
           in said
    assert said.endswith("adding the distribution that provides 'notinstalledanywhere'")
    # without a wheelhouse (an image from a package index), only the modules not sent
    unknown = check(files, "src/train.py", ["pandas"], None)
    assert unknown.missing_imports == [] and unknown.missing_distributions == []
    assert "wheelhouse" not in unknown.warning("x", house, True)
    # all there: nothing to say
    _wheel(house, "pandas-2.3.0", ["pandas/__init__.py"])
    _wheel(house, "scikit_learn-1.7.0", ["sklearn/__init__.py"])
    _wheel(house, "other-1.0", ["notinstalledanywhere.py"])
    sent = files + [(str(tmp_path / "job/src/helpers.py"), "src/helpers.py"),
                    (str(tmp_path / "job/src/tools/__init__.py"), "src/tools/__init__.py")]
    assert check(sent, "src/train.py", ["pandas", "scikit-learn", "other"], Wheelhouse.read(house),
                 own=["torch", "numpy"]).warning("x", house, True) is None


def _blueprint(tmp_path: Path, runtime: str, files: list[str]) -> Path:
    types = ROOT / "modak_lib/data/tosca/modak-types.yaml"
    (tmp_path / "modak-types.yaml").write_text(types.read_text())
    text = (ROOT / "examples/mnist-cnn/blueprint.yaml").read_text()
    text = text.replace("../../tosca/modak-types.yaml", "modak-types.yaml")
    text = text.replace("model: mnist-cnn", f"model: user-imports\n          files: {files}")
    path = tmp_path / "blueprint.yaml"
    path.write_text(text)
    infra = (ROOT / "examples/infra/local-frontend.yaml").read_text()
    (tmp_path / "infra.yaml").write_text(infra.replace("container_runtime: podman",
                                                       f"container_runtime: {runtime}"))
    return path


def test_modak_plan_warns_of_what_the_image_would_lack_before_anything_is_built(tmp_path):
    _script(tmp_path, "import torch\nimport pandas\nimport helpers\n")
    (tmp_path / "helpers.py").write_text("")
    request = _blueprint(tmp_path, "podman", ["train.py"])
    home = tmp_path / "home"
    _wheel(home / "wheelhouse", "torch-2.13.0", ["torch/__init__.py"])
    _wheel(home / "wheelhouse", "numpy-2.4.6", ["numpy/__init__.py"])
    env = dict(os.environ, MODAK_HOME=str(home))

    def plan(infra="infra.yaml"):
        proc = subprocess.run([sys.executable, "-m", "modak_lib.cli", "plan", str(request),
                               "--infra", str(tmp_path / infra), "--model", "none"],
                              capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    said = plan()
    assert "'pandas' (train.py line 2), which image pytorch-2.13.0-cpu would not have" in said
    assert "`modak wheelhouse --image pytorch-2.13.0-cpu pandas`" in said  # the default dir
    assert "'helpers' (train.py line 3) from beside the script here" in said
    # the job's Python is the front-end's own (no container): its packages are not known
    # here, but the module not sent is
    text = (tmp_path / "infra.yaml").read_text().replace("container_runtime: podman",
                                                          "container_runtime: none")
    (tmp_path / "bare.yaml").write_text(text)
    said = plan("bare.yaml")
    assert "'helpers'" in said and "pandas" not in said
    # listed in pip_packages, without a wheel: the build would fail
    request.write_text(request.read_text().replace(
        "files: ['train.py']", "files: ['train.py', 'helpers.py']\n          pip_packages: [pandas]"))
    said = plan()
    assert "the image installs 'pandas', which the wheelhouse" in said and "helpers" not in said
    assert "imports" not in said  # its import is said once, as the distribution
    # sent, listed, and the wheelhouse holds pandas: nothing is said
    _wheel(home / "wheelhouse", "pandas-2.3.0", ["pandas/__init__.py"])
    assert "warning" not in plan()


@pytest.mark.skipif(not (ROOT / "build/collections").exists(),
                    reason="needs the collection linked: run scripts/setup-venv")
def test_the_deploys_plan_says_it_as_a_warning_with_the_plays_wheelhouse(tmp_path):
    _script(tmp_path, "import torch\nfrom sklearn import metrics\n")
    request = _blueprint(tmp_path, "podman", ["train.py"])
    house = tmp_path / "my wheels"
    _wheel(house, "torch-2.13.0", ["torch/__init__.py"])
    playbook = tmp_path / "plan.yml"
    debug = {"ansible.builtin.debug": {
        "msg": "DIRS {{ planned.dirs.wheelhouse }} WHEELS {{ planned.wheels | join(' ') "
               "if planned.wheels is not none else 'null' }}"}}
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "plan", "modak.modak.modak_plan": {
            "request": str(request), "infra": str(tmp_path / "infra.yaml"), "model": "none",
            "out_dir": str(tmp_path / "plans"), "wheelhouse": str(house)},
         "register": "planned"}, debug]}]))

    def play():
        proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local",
                               str(playbook)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, ANSIBLE_NOCOLOR="1",
                                                    MODAK_HOME=str(tmp_path / "home"),
                                                    COLUMNS="1000"))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return " ".join((proc.stdout + proc.stderr).split())

    out = play()
    assert "[WARNING]: the job imports 'sklearn' (train.py line 2)" in out
    assert "the image installs 'numpy', which the wheelhouse" in out  # the image's own
    assert "modak wheelhouse --image pytorch-2.13.0-cpu --dir '" + str(house) + \
        "' scikit-learn`" in out
    # where the image's build then looks for its wheels; with NumPy's wheel missing, all
    assert f"DIRS {house} WHEELS null" in out
    # with every wheel the image installs there, just those: not a wheelhouse's others
    _wheel(house, "numpy-2.4.6", ["numpy/__init__.py"])
    _wheel(house, "jax-0.9", ["jax/__init__.py"], ("numpy",))
    _wheel(house, "torch-2.12.0", ["torch/__init__.py"], ("filelock",))
    _wheel(house, "filelock-4.3.2", ["filelock/__init__.py"])
    out = play()  # (the same request: its pinned plan, which says it too)
    assert f"DIRS {house} WHEELS filelock-4.3.2-py3-none-any.whl " \
        "numpy-2.4.6-py3-none-any.whl torch-2.12.0-py3-none-any.whl " \
        "torch-2.13.0-py3-none-any.whl" in out, out[-2000:]


def test_a_run_that_failed_on_an_import_names_every_import_its_python_lacks(tmp_path):
    """The runtime, after a ModuleNotFoundError, reads the run directory's Python files and
    names each import that the job's Python cannot find, the failed one first: one failed
    run tells them all (a user's job that lacked three packages failed three times)."""
    from modak_lib.results import script_failure
    from tests.test_runtime import run

    _script(tmp_path, """\
        import os, json
        import helpers                   # beside the script: found
        try:
            import wandb_missing_here    # optional
        except ImportError:
            wandb = None
        import yaml_missing_here
        from sklearn_missing_here import metrics

        def plot():
            import plots_missing_here    # in a function: still listed
        """)
    (tmp_path / "helpers.py").write_text("import numpy\nimport first_missing_here\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/more.py").write_text("from extra_missing_here import x\n")
    (tmp_path / "modak_runtime").mkdir()  # (a run directory's copy of the runtime: not read)
    (tmp_path / "modak_runtime/x.py").write_text("import runtime_missing_here\n")
    rc, _, rec, err = run(tmp_path / "train.py", cwd=tmp_path)
    assert rc == 1 and "ModuleNotFoundError" in err
    error = rec["error"]
    assert error["message"] == "No module named 'first_missing_here'"
    assert error["missing"] == [["first_missing_here", "helpers.py", 2],
                                ["extra_missing_here", "sub/more.py", 1],
                                ["yaml_missing_here", "train.py", 7],
                                ["sklearn_missing_here", "train.py", 8],
                                ["plots_missing_here", "train.py", 11]]
    said = script_failure(error, "podman")
    assert said.startswith("ModuleNotFoundError: No module named 'first_missing_here' (the "
                           "run's files import 5 modules that the job's Python lacks: "
                           "'first_missing_here' (helpers.py line 2), 'extra_missing_here' "
                           "(sub/more.py line 1), ")
    assert said.endswith("'plots_missing_here' (train.py line 11); a package the image lacks: "
                         "list it in application.pip_packages; or a module of the user's the "
                         "run directory lacks: list it in application.files)")
    # the failed module alone adds nothing; a record without the list (an older runtime's)
    # or a broken one says the hint as before
    for missing in ([["first_missing_here", "helpers.py", 2]], None, [["x"]], "junk"):
        assert script_failure(dict(error, missing=missing)) == (
            "ModuleNotFoundError: No module named 'first_missing_here' (a package the image "
            "lacks: list it in application.pip_packages; or a module of the user's the run "
            "directory lacks: list it in application.files)")


def test_the_runtime_reads_a_bounded_part_of_a_large_run_directory(tmp_path, monkeypatch):
    """A folder of data sent with the script is not walked whole after a failed import: the
    top's files are read first, and no folder is entered past the entries' limit."""
    from modak_runtime import imports

    (tmp_path / "train.py").write_text("import a_missing\n")
    (tmp_path / "data").mkdir()
    for i in range(50):
        (tmp_path / "data" / f"{i}.png").write_text("")
    (tmp_path / "data" / "deeper").mkdir()
    (tmp_path / "data" / "deeper" / "tool.py").write_text("import b_missing\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "util.py").write_text("import c_missing\n")
    found = lambda: [name for _, name in imports._python_files(str(tmp_path))]  # noqa: E731
    assert found() == ["train.py", "data/deeper/tool.py", "lib/util.py"]
    monkeypatch.setattr(imports, "MAX_ENTRIES", 40)
    assert found() == ["train.py", "lib/util.py"]  # (data/ had 51 entries: not entered)
    monkeypatch.setattr(imports, "MAX_ENTRIES", 2)
    assert found() == ["train.py"]
    monkeypatch.setattr(imports, "MAX_FILES", 1)
    monkeypatch.setattr(imports, "MAX_ENTRIES", 10**6)
    assert found() == ["train.py"]
    assert [i.module for i in imports.missing_here(str(tmp_path / "train.py"),
                                                   str(tmp_path))] == ["a_missing"]
