"""The archive a run directory's files travel in (modak_lib.files.pack, modak_pack), unpacked
with GNU tar as ansible.builtin.unarchive unpacks it on the front-end."""
import os
import stat
import subprocess
import tarfile

import pytest

from modak_lib.files import UnsafePathError, pack


def _tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "pkg" / "model.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o755)
    os.chmod(src / "train.py", 0o640)
    return src


def test_a_packed_tree_unpacks_into_the_run_directory_as_it_was(tmp_path):
    src = _tree(tmp_path)
    old = 1_600_000_000
    os.utime(src / "train.py", (old, old))
    figures = pack([(str(src / "train.py"), "train.py", None),
                    (str(src / "pkg/model.py"), "pkg/model.py", None),
                    (str(src / "run.sh"), "job.sh", 0o750)], tmp_path / "a.tar.gz")
    assert figures == {"files": 3, "bytes": 15 + 6 + 10}
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["tar", "--extract", "-C", str(run), "--no-same-owner", "-f",
                    str(tmp_path / "a.tar.gz")], check=True)
    assert (run / "train.py").read_text() == "print('train')\n"
    assert (run / "pkg/model.py").read_text() == "X = 1\n"
    assert stat.S_IMODE((run / "job.sh").stat().st_mode) == 0o750 & ~_umask()
    assert stat.S_IMODE((run / "train.py").stat().st_mode) == 0o640 & ~_umask()
    assert int((run / "train.py").stat().st_mtime) == old
    # unchanged: tar's comparison (unarchive's test of whether to unpack) finds nothing
    same = subprocess.run(["tar", "--diff", "-C", str(run), "--no-same-owner", "-f",
                           str(tmp_path / "a.tar.gz")], capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    (run / "pkg/model.py").write_text("X = 2\n")
    changed = subprocess.run(["tar", "--diff", "-C", str(run), "-f",
                              str(tmp_path / "a.tar.gz")], capture_output=True, text=True)
    assert changed.returncode == 1 and "pkg/model.py" in changed.stdout


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_same_files_make_the_same_archive(tmp_path):
    src = _tree(tmp_path)
    entries = [(str(src / "train.py"), "train.py", None),
               (str(src / "pkg/model.py"), "pkg/model.py", None)]
    pack(entries, tmp_path / "a.tar.gz")
    pack(list(reversed(entries)), tmp_path / "b.tar.gz")
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["pkg/model.py", "train.py"]
    assert all(m.isreg() and m.uid == 0 and m.uname == "" for m in members)


@pytest.mark.parametrize("name", ["../x.py", "/etc/x", "a/../../x", "a//b", "./a", "", "a/.",
                                  ".", "..", "a/"])
def test_a_name_outside_the_run_directory_is_refused(tmp_path, name):
    src = _tree(tmp_path)
    with pytest.raises(UnsafePathError):
        pack([(str(src / "train.py"), name, None)], tmp_path / "a.tar.gz")
    assert not list(tmp_path.glob("*.tar.gz")) and not list(tmp_path.glob(".*.tmp"))


def test_a_link_or_a_name_twice_is_refused_and_nothing_is_left(tmp_path):
    src = _tree(tmp_path)
    (src / "link.py").symlink_to("/etc/hostname")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        pack([(str(src / "train.py"), "train.py", None), (str(src / "link.py"), "l.py", None)],
             tmp_path / "a.tar.gz")
    with pytest.raises(UnsafePathError, match="named twice"):
        pack([(str(src / "train.py"), "t.py", None), (str(src / "run.sh"), "t.py", None)],
             tmp_path / "a.tar.gz")
    with pytest.raises(UnsafePathError, match="regular file"):
        pack([(str(src / "pkg"), "pkg", None)], tmp_path / "a.tar.gz")
    assert not [p for p in tmp_path.iterdir() if p.name != "src"]
