"""`modak opera`: a request anywhere, as a CSAR that xOpera deploys (modak_lib.opera); the
deploy itself against the front-end is in test_xopera.py."""
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from modak_lib.cli import main
from modak_lib.opera import entry_blueprint, instance_dir, same_request
from modak_lib.readers import read_request
from modak_lib.readers.tosca import installed_types

REQUESTS = [
    (ROOT / "examples/mnist-cnn/blueprint.yaml", ROOT / "examples/infra/hlrs-testbed.yaml", {}),
    (ROOT / "examples/mnist-cnn/blueprint.yaml", ROOT / "examples/infra/local-frontend.yaml",
     {"steps": "40"}),
    (ROOT / "examples/resnet50/request.json", None, {}),
    (ROOT / "tosca/examples/mnist-cnn-slurm.yaml", None,
     {"arguments": ["--model", "mnist-cnn", "--steps", "7"]}),
    (ROOT / "tosca/examples/mnist-cnn-pbs.yaml", None, {}),
    (ROOT / "tosca/examples/resnet50-gpu-pbs.yaml", None, {}),
]


@pytest.mark.parametrize("path, infra, inputs", REQUESTS,
                         ids=[f"{p.parent.name}/{p.name}-{i}" for i, (p, _, _) in
                              enumerate(REQUESTS)])
def test_the_entry_reads_back_as_the_request(tmp_path, path, infra, inputs):
    """Blueprints (their inputs resolved, the infrastructure file's hardware merged) and a
    DSL document, written as the CSAR's entry of literal values, read back as the same
    request: what the operations plan is what `modak plan` plans."""
    request = read_request(path, infra=infra, inputs=inputs)
    entry = entry_blueprint(request)
    (tmp_path / "modak-types.yaml").write_text(installed_types().read_text())
    (tmp_path / "entry.yaml").write_text(yaml.safe_dump(entry))
    back = read_request(tmp_path / "entry.yaml")
    same_request(request, back)
    assert back.application.arguments == request.application.arguments
    if inputs.get("steps"):  # (inside a list, which xOpera would not resolve)
        assert "40" in entry["topology_template"]["node_templates"]["mnist-cnn"][
            "properties"]["application"]["arguments"]
    outputs = entry["topology_template"]["outputs"]
    assert outputs["job_state"] == {"value": {"get_attribute": [request.job.job_name,
                                                                "job_state"]}}


def test_a_difference_is_an_internal_error_naming_the_field():
    from modak_lib.errors import CatalogueError
    request = read_request(ROOT / "examples/mnist-cnn/blueprint.yaml")
    other = request.model_copy(update={"job": request.job.model_copy(
        update={"wall_time_limit": 60})})
    with pytest.raises(CatalogueError, match="job.wall_time_limit differ"):
        same_request(request, other)


def _opera(capsys, *argv):
    code = main(["opera", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_modak_opera_says_what_is_missing_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODAK_HOME", str(tmp_path / "home"))
    bp = tmp_path / "job" / "blueprint.yaml"
    assert main(["init", str(bp.parent)]) == 0
    capsys.readouterr()
    # no xOpera: how to install it
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = _opera(capsys, "deploy", str(bp))
    assert code == 2 and "xOpera is not installed here" in err and "opera==0.7.0" in err
    # with one (a stand-in that records its arguments), what is wrong with the request
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "opera"
    stand_in.write_text('#!/bin/sh\necho "$@" > "$MODAK_HOME/opera-args"\n'
                        'mkdir -p "$3" && touch "$3/instance"\n'
                        'echo "$MODAK_CSAR_ROOT" > "$MODAK_HOME/csar-root"\n'
                        'echo "${MODAK_NEW_RUN:-}" > "$MODAK_HOME/new-run"\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    bad = tmp_path / "job" / "bad.yaml"
    bad.write_text(bp.read_text().replace("compilers: [torch.compile]", "compilers: [tvm]"))
    code, _, err = _opera(capsys, "deploy", str(bad))
    assert code == 2 and "optimisation.compilers[0]" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "home" / "opera-args").exists()  # never started
    code, _, err = _opera(capsys, "outputs", str(bp))
    assert code == 2 and "not deployed with modak opera" in err
    # a good one: xOpera is given the CSAR, made of the request's files, the installed
    # types and the collection's playbooks
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(ROOT / "build/collections"))
    code, _, err = _opera(capsys, "deploy", str(bp), "--infra",
                          str(ROOT / "examples/infra/local-frontend.yaml"), "--inputs",
                          str(_inputs(tmp_path, {"steps": "9"})), "--new-run")
    assert code == 0, err
    where = instance_dir(bp)
    args = (tmp_path / "home" / "opera-args").read_text().split()
    assert args == ["deploy", "--instance-path", str(where / "state"), str(where / "modak.csar")]
    csar = Path((tmp_path / "home" / "csar-root").read_text().strip())
    assert csar == where / "csar"
    assert (tmp_path / "home" / "new-run").read_text().strip() == "1"
    names = sorted(str(p.relative_to(csar)) for p in csar.rglob("*") if p.is_file())
    assert {"TOSCA-Metadata/TOSCA.meta", "modak-request.yaml", "modak-types.yaml",
            "playbooks/job-create.yml", "playbooks/job-vars.yml", "train.py"} <= set(names)
    entry = yaml.safe_load((csar / "modak-request.yaml").read_text())
    app = entry["topology_template"]["node_templates"]["mnist-cnn"]["properties"]["application"]
    assert app["arguments"] == ["--steps", "9", "--batch-size", "128"]
    target = entry["topology_template"]["node_templates"]["target"]["properties"]
    assert target["scheduler"] == "slurm" and target["frontend"]["port"] == 2222
    # the same request again resumes that deployment; another one of the same file is
    # refused, unless the earlier is to be forgotten
    deploy = ["deploy", str(bp), "--infra", str(ROOT / "examples/infra/local-frontend.yaml"),
              "--inputs", str(_inputs(tmp_path, {"steps": "9"}))]
    assert _opera(capsys, *deploy)[0] == 0
    assert (tmp_path / "home" / "opera-args").read_text().split()[:5] == [
        "deploy", "--resume", "--force", "--instance-path", str(where / "state")]
    _inputs(tmp_path, {"steps": "10"})
    code, _, err = _opera(capsys, *deploy)
    assert code == 2 and "this is another request" in err and "--clean" in err
    assert _opera(capsys, *deploy, "--clean")[0] == 0
    assert (tmp_path / "home" / "opera-args").read_text().split()[1:3] == [
        "--clean-state", "--force"]
    # an operation that fails says why (xOpera prints no task's message)
    stand_in.write_text('#!/bin/sh\necho "configure: no wheels" > "$MODAK_OPERA_REASON"\n'
                        'exit 1\n')
    code, _, err = _opera(capsys, *deploy)
    assert code == 1 and err.strip() == f"modak: error: {bp}: the configure: no wheels"
    # the same file is the same deployment: outputs finds its state
    stand_in.write_text('#!/bin/sh\necho "$@" > "$MODAK_HOME/opera-args"\n')
    code, _, err = _opera(capsys, "outputs", str(bp), "--format", "json")
    assert code == 0, err
    assert (tmp_path / "home" / "opera-args").read_text().split() == [
        "outputs", "--instance-path", str(where / "state"), "--format", "json"]


def _inputs(tmp_path, values):
    path = tmp_path / "inputs.yaml"
    path.write_text(yaml.safe_dump(values))
    return path
