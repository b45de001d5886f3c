"""The script's outputs back to the controller (plugins/module_utils/modak_outputs.py): what
the front-end packs of a run directory a script wrote as it liked, and what the controller
unpacks of an archive it cannot trust.  The deploy that fetches them runs in
tests/test_deploy_local.py."""
import io
import os
import sys
import tarfile

import pytest
from conftest import ROOT

from modak_lib.errors import InputError

sys.path.insert(0, str(ROOT / "build/collections"))
outputs = pytest.importorskip("ansible_collections.modak.modak.plugins.module_utils.modak_outputs")
sys.path.pop(0)


def _run_dir(tmp_path):
    """A run directory as a script may leave it: checkpoints, a metrics file, and links
    out of it, a link inside a folder, a pipe."""
    run = tmp_path / "run"
    (run / "checkpoints" / "old").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"\0weights" * 100)
    (run / "checkpoints" / "old" / "e1.pt").write_bytes(b"e1")
    (run / "metrics.json").write_text('{"loss": 0.1}')
    secret = tmp_path / "secret"
    secret.write_text("the login's own file")
    (run / "checkpoints" / "key").symlink_to(secret)
    (run / "leak").symlink_to(tmp_path)
    os.mkfifo(run / "checkpoints" / "pipe")
    return run


def test_the_outputs_are_packed_and_unpacked_as_regular_files_and_folders(tmp_path):
    run = _run_dir(tmp_path)
    archive = run / ".modak-outputs-1.tgz"
    got = outputs.pack(str(run), ["checkpoints", "./metrics.json", "model.onnx",
                                  "leak/secret", "../secret", "/etc/passwd"],
                       str(archive), 2 ** 20)
    assert got["archive"] == str(archive) and archive.is_file()
    assert got["files"] == ["checkpoints/best.pt", "checkpoints/old/e1.pt", "metrics.json"]
    assert got["bytes"] == 800 + 2 + len('{"loss": 0.1}')
    assert got["missing"] == ["model.onnx"]
    assert sorted(got["skipped"]) == [
        "../secret (not a path inside the run directory)",
        "/etc/passwd (not a path inside the run directory)",
        "checkpoints/key (a symbolic link)", "checkpoints/pipe (not a regular file or folder)",
        "leak/secret (a symbolic link, or inside one)"]
    assert not [p for p in run.iterdir() if p.name.startswith(".modak-outputs-") and
                p != archive]  # (no temporary file left)

    dest = tmp_path / "results" / "r1" / "outputs"
    written, refused = outputs.unpack(str(archive), str(dest))
    assert sorted(written) == got["files"] and refused == []
    assert (dest / "checkpoints" / "best.pt").read_bytes() == b"\0weights" * 100
    assert (dest / "metrics.json").read_text() == '{"loss": 0.1}'
    assert not (dest / "checkpoints" / "key").exists()
    # fetched again (a later deploy of the run): the same files, written over
    (run / "metrics.json").write_text('{"loss": 0.05}')
    outputs.pack(str(run), ["metrics.json"], str(archive), 2 ** 20)
    assert outputs.unpack(str(archive), str(dest)) == (["metrics.json"], [])
    assert (dest / "metrics.json").read_text() == '{"loss": 0.05}'


def test_a_file_gone_or_unreadable_when_packed_is_left_out_and_named(tmp_path, monkeypatch):
    """A file listed, then gone (or unreadable) when the archive is written: the archive
    holds the others, whole, and the file is named with why."""
    run = _run_dir(tmp_path)
    listed = outputs.collect

    def then_gone(*args):
        got = listed(*args)
        (run / "checkpoints" / "best.pt").unlink()
        return got

    monkeypatch.setattr(outputs, "collect", then_gone)
    got = outputs.pack(str(run), ["checkpoints"], str(run / "out.tgz"), 2 ** 20)
    assert got["files"] == ["checkpoints/old/e1.pt"]
    assert "checkpoints/best.pt (not readable: No such file or directory)" in got["skipped"]
    assert outputs.unpack(got["archive"], str(tmp_path / "back"))[0] == [
        "checkpoints/old/e1.pt"]


def test_nothing_is_packed_past_the_limit_or_where_nothing_was_written(tmp_path):
    run = _run_dir(tmp_path)
    archive = run / "out.tgz"
    with pytest.raises(outputs.OutputsError, match=r"more than 0 MiB .*fetch them from "):
        outputs.pack(str(run), ["checkpoints"], str(archive), 500)
    assert not archive.exists()
    got = outputs.pack(str(run), ["never-written"], str(archive), 2 ** 20)
    assert got["archive"] is None and got["missing"] == ["never-written"]
    assert not archive.exists()


def _hostile_archive(path, outside):
    """An archive the front-end could hand back: names out of the folder, links, a
    device, beside one honest file."""
    with tarfile.open(path, "w:gz") as tar:
        def add(name, data=b"x", **kw):
            info = tarfile.TarInfo(name)
            for key, value in kw.items():
                setattr(info, key, value)
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
        add("ok.txt", b"fine")
        add("../escape.txt")
        add(str(outside / "absolute.txt"))
        add("link", type=tarfile.SYMTYPE, linkname=str(outside))
        add("link/through.txt")
        add("hard", type=tarfile.LNKTYPE, linkname="ok.txt")
        add("dev", type=tarfile.CHRTYPE)
        add("sub/../../up.txt")


def test_an_archive_from_the_front_end_writes_nothing_outside_its_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = tmp_path / "hostile.tgz"
    _hostile_archive(archive, outside)
    dest = tmp_path / "results" / "outputs"
    (dest / "pre").mkdir(parents=True)
    (dest / "pre-link").symlink_to(outside)  # (a link already there is not written through)
    written, refused = outputs.unpack(str(archive), str(dest))
    # (the link refused, a file under its name is a file in a folder of outputs/)
    assert written == ["ok.txt", "link/through.txt"]
    assert not (dest / "link").is_symlink() and (dest / "link" / "through.txt").is_file()
    assert set(refused) == {"../escape.txt", str(outside / "absolute.txt"), "link", "hard",
                            "dev", "sub/../../up.txt"}
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "results" / "up.txt").exists()
    assert (dest / "ok.txt").read_text() == "fine"
    with tarfile.open(tmp_path / "through.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("pre-link/x.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    assert outputs.unpack(str(tmp_path / "through.tgz"), str(dest)) == ([], ["pre-link/x.txt"])
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("given,said", [
    ("/home/u/ckpt", "must name a file or folder in the run directory"),
    ("../ckpt", "'..' is not allowed"),
    (".", "must name a file or folder in the run directory"),
    ("modak_runtime/x", "is MODAK's own"),
    (".modak-job.json", "is MODAK's own"),
    ("ck pt", "invalid output"),
])
def test_an_output_outside_the_run_directory_is_refused_naming_the_field(given, said):
    from modak_lib.readers.tosca import request_from_nodes
    with pytest.raises(InputError) as err:
        request_from_nodes("job", {"application": {"framework": "pytorch", "script": "t.py",
                                                   "outputs": ["metrics.json", given]}},
                           "fe", {"scheduler": "local"}, "TOSCA node job", None)
    assert "application.outputs[1]" in str(err.value) and said in str(err.value), str(err.value)
    req = request_from_nodes("job", {"application": {"framework": "pytorch", "script": "t.py",
                                                     "outputs": ["./ckpt/", "metrics.json"]}},
                             "fe", {"scheduler": "local"}, "TOSCA node job", None)
    assert req.application.outputs == ("ckpt", "metrics.json")
