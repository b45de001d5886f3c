"""`modak init --script`: a blueprint written around the user's own script, from what the
script says of itself (read, never run), that plans as written."""
import json
from pathlib import Path

import pytest
import yaml

from modak_lib.cli import main
from modak_lib.readers import read_request

USER_SCRIPT = '''\
import argparse
import os

import pandas as pd
import torch
import yaml
from torch.utils.data import DataLoader

from nets import Net

p = argparse.ArgumentParser()
p.add_argument("--max_steps", type=int, default=500)
p.add_argument("-b", "--bs", type=int, default=32)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--save-dir", default="ckpt")
a = p.parse_args()
frame = pd.read_csv("labels.csv")
settings = yaml.safe_load(open("settings.yaml"))
os.makedirs(a.save_dir, exist_ok=True)
torch.save(Net().state_dict(), os.path.join(a.save_dir, "net.pt"))
with open("metrics.json", "w") as f:
    f.write("{}")
'''


def _init(capsys, *argv):
    code = main(["init", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))  # (no wheelhouse there)
    proj = tmp_path / "speech-tagger"
    proj.mkdir()
    (proj / "train.py").write_text(USER_SCRIPT)
    (proj / "nets.py").write_text("import torch\nclass Net(torch.nn.Module):\n    pass\n")
    (proj / "labels.csv").write_text("a,b\n1,2\n")
    (proj / "settings.yaml").write_text("lr: 0.1\n")
    (proj / "notes.txt").write_text("not named by the script\n")
    return proj


def _application(bp: Path) -> dict:
    doc = yaml.safe_load(bp.read_text())
    nodes = doc["topology_template"]["node_templates"]
    (name, job), = [(k, v) for k, v in nodes.items() if k != "target"]
    return name, job["properties"]["application"], doc


def test_the_blueprint_says_what_the_script_says_and_plans(project, capsys):
    before = (project / "train.py").read_text()
    code, out, err = _init(capsys, "--script", "train.py", str(project))
    assert code == 0, err
    assert (project / "train.py").read_text() == before  # never rewritten
    assert sorted(p.name for p in project.iterdir()) == [
        "blueprint.yaml", "infra-local.yaml", "inventory.yml", "labels.csv",
        "modak-types.yaml", "nets.py", "notes.txt", "settings.yaml", "train.py"]
    name, app, doc = _application(project / "blueprint.yaml")
    # the generic script name: the workload is named after its directory
    assert name == app["model"] == "speech-tagger"
    assert app["framework"] == "pytorch" and app["framework_version"] == "2.13"
    assert doc["topology_template"]["inputs"]["steps"]["default"] == "500"
    assert app["arguments"] == ["--max_steps", {"get_input": "steps"}, "--bs", "32"]
    assert app["batch_size"] == 32 and app["steps"] == {"get_input": "steps"}
    # pandas and PyYAML are not the image's; torch is; nets is the user's own module
    assert app["pip_packages"] == ["pandas", "pyyaml"]
    # the data it reads beside it goes with it, the modules too; not what it never names
    assert app["files"] == ["train.py", "nets.py", "labels.csv", "settings.yaml"]
    # what it writes: its --save-dir's default and its metrics file
    assert app["outputs"] == ["ckpt", "metrics.json"]
    assert "--lr (0.0003)" in (project / "blueprint.yaml").read_text()
    assert "pip_packages: pandas, pyyaml" in out
    # it plans as written, sending what it lists
    code = main(["plan", str(project / "blueprint.yaml"), "--infra",
                 str(project / "infra-local.yaml"), "--model", "none", "--json", "--out",
                 str(project.parent / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert plan["steps"] == 500 and plan["outputs"] == ["ckpt", "metrics.json"]
    assert plan["app_files"] == ["labels.csv", "nets.py", "settings.yaml", "train.py"]
    request = read_request(project / "blueprint.yaml")
    assert request.application.model == "speech-tagger" and request.application.batch_size == 32


def test_data_it_cannot_send_is_named_not_listed(tmp_path, capsys, monkeypatch):
    """A data file whose name a path may not have (a space), or a data set too large to
    send, is said in a comment, not listed in application.files (the blueprint would not
    read back)."""
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))
    import modak_lib.scaffold as scaffold
    monkeypatch.setattr(scaffold, "MAX_FILES", 5)
    (tmp_path / "fit.py").write_text(
        "import torch\nopen('my labels.csv').read()\nopen('small.csv').read()\n"
        "import os\nos.listdir('images')\n")
    (tmp_path / "my labels.csv").write_text("a\n")
    (tmp_path / "small.csv").write_text("a\n")
    (tmp_path / "images").mkdir()
    for i in range(8):
        (tmp_path / "images" / f"{i}.png").write_text("x")
    code, _, err = _init(capsys, "--script", "fit.py", str(tmp_path))
    assert code == 0, err
    name, app, doc = _application(tmp_path / "blueprint.yaml")
    assert "files" not in app  # (the script is found alone, as MODAK finds it)
    assert "not sent (more than MODAK sends, or a name a\n          # path here may not " \
        "have): images, my labels.csv, small.csv" in (tmp_path / "blueprint.yaml").read_text()
    (tmp_path / "images" / "7.png").unlink()
    for i in range(3, 7):
        (tmp_path / "images" / f"{i}.png").unlink()
    code, _, err = _init(capsys, "--force", "--script", "fit.py", str(tmp_path))
    assert code == 0, err
    assert _application(tmp_path / "blueprint.yaml")[1]["files"] == ["fit.py", "images",
                                                                     "small.csv"]
    assert "path here may not have): my labels.csv;" in (tmp_path / "blueprint.yaml").read_text()


def test_a_keras_script_gets_its_backend_and_the_image_of_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))
    (tmp_path / "fit_torch.py").write_text(
        'import os\nos.environ.setdefault("KERAS_BACKEND", "torch")\nimport keras\n'
        'import numpy as np\nimport torch\n'
        'keras.Sequential([keras.layers.Dense(1)]).fit(np.zeros((8, 2)), np.zeros(8),'
        ' batch_size=4, epochs=1)\n')
    code, out, err = _init(capsys, "--script", str(tmp_path / "fit_torch.py"), str(tmp_path))
    assert code == 0, err
    name, app, doc = _application(tmp_path / "blueprint.yaml")
    assert name == "fit_torch" and app["framework"] == "keras"
    assert app["keras_backend"] == "torch"
    # the image with the torch backend installs torch and NumPy: nothing to add
    assert "pip_packages" not in app and "keras-3.15.1-torch-cpu" in \
        (tmp_path / "blueprint.yaml").read_text()
    # its one literal batch size, from model.fit; no length to read
    assert app["batch_size"] == 4 and "steps" not in app and "epochs" not in app
    props = doc["topology_template"]["node_templates"][name]["properties"]
    assert "compilers" not in props["optimisation"]  # that image offers none


@pytest.mark.parametrize("dirname", ["true", "1.5", "null"])
def test_what_the_script_says_stays_data(tmp_path, capsys, monkeypatch, dirname):
    """Names and defaults of the user's options, and a workload named after a directory
    whose name YAML reads otherwise, land in the blueprint as strings or comments."""
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))
    proj = tmp_path / dirname
    proj.mkdir()
    (proj / "main.py").write_text(
        "import argparse, torch\np = argparse.ArgumentParser()\n"
        "p.add_argument('--steps', default=7)\n"
        "p.add_argument('--x: {y}', default='a\\nb: c # d')\n"
        "p.add_argument('data_dir')\n"
        "p.add_argument('--batch-size', default='64')\n")
    code, _, err = _init(capsys, "--script", "main.py", str(proj))
    assert code == 0, err
    text = (proj / "blueprint.yaml").read_text()
    name, app, doc = _application(proj / "blueprint.yaml")
    assert name == app["model"] == dirname and app["arguments"] == ["--steps",
                                                                  {"get_input": "steps"}]
    # a default that is no count is not a batch size; the others are listed for the user
    assert "batch_size" not in app
    assert "#   --x: {y} ('a\\nb: c # d'), data_dir (positional), --batch-size ('64')" in text
    assert doc["topology_template"]["inputs"]["steps"]["default"] == "7"


def test_refused_scripts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))
    proj = tmp_path / "proj"
    proj.mkdir()
    (tmp_path / "outside.py").write_text("import torch\n")
    (proj / "link.py").symlink_to(tmp_path / "outside.py")
    (proj / "plain.py").write_text("print('no framework')\n")
    (proj / "broken.py").write_text("def (:\n")
    for argv, said in (
            (["--script", str(tmp_path / "outside.py")], "not inside"),
            (["--script", "../outside.py"], "'..' is not allowed"),
            (["--script", "link.py"], "a symbolic link"),
            (["--script", "missing.py"], "no such file"),
            (["--script", "broken.py"], "not a Python file MODAK can read"),
            (["--script", "plain.py"], "name its framework with --framework"),
            (["--framework", "keras"], "only with --script")):
        code, out, err = _init(capsys, *argv, str(proj))
        assert code == 2 and len(err.splitlines()) == 1 and said in err, (argv, err)
        assert err.startswith("modak: error: ")
    assert not (proj / "blueprint.yaml").exists()
    code, _, err = _init(capsys, "--script", "plain.py", "--framework", "pytorch", str(proj))
    assert code == 0, err
    assert _application(proj / "blueprint.yaml")[1]["framework"] == "pytorch"
    # written once: a second time refuses, the script's blueprint as for the example
    code, _, err = _init(capsys, "--script", "plain.py", "--framework", "pytorch", str(proj))
    assert code == 2 and "exist(s); nothing was written" in err
