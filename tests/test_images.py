"""MODAK's images on a front-end (plugins/modules/modak_images.py): leases, the listing,
and the prune, run as Ansible runs the module (its script, with its arguments' file), on
images that are files built by modak_image with a builder of plain commands (``cp``,
``rm``), as Apptainer's SIF files are. Podman's, on the real front-end: tests/test_deploy.py.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT

DAY = 86400
# a runtime whose images are files: built by copying the recipe, removed with rm
BUILDER = {"exists": {"argv": ["test", "-s", "{image}"]},
           "build": {"argv": ["cp", "{recipe}", "{partial}"], "cwd": "context"},
           "remove": {"argv": ["rm", "-f", "{image}"]},
           "size": {"argv": ["stat", "-c", "%s", "{image}"]}, "file": True}


def module(name, args, check=False):
    """Run a module of the collection as Ansible does, with ``args``: its JSON result."""
    pytest.importorskip("ansible")
    args = dict(args, _ansible_check_mode=check)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "build/collections"))
    proc = subprocess.run(
        [sys.executable, "-m", f"ansible_collections.modak.modak.plugins.modules.{name}"],
        input=json.dumps({"ANSIBLE_MODULE_ARGS": args}), capture_output=True, text=True,
        env=env, timeout=60)
    out = json.loads(proc.stdout)
    out["rc"] = proc.returncode
    return out


@pytest.fixture
def images(tmp_path):
    """build(name): a file image built by modak_image in an image directory; the
    directory's listing, lease and prune as calls."""
    log_dir = tmp_path / "images"
    log_dir.mkdir()

    def build(name, builder=BUILDER):
        ctx = tmp_path / f"build-{name}"
        ctx.mkdir()
        (ctx / "recipe").write_text(f"an image called {name}\n" * 100)
        out = module("modak_image", {"runtime": "files", "builder": builder,
                                     "image": str(log_dir / f"{name}.sif"),
                                     "recipe": str(ctx / "recipe"), "context": str(ctx),
                                     "log_dir": str(log_dir), "poll": 1})
        assert out["rc"] == 0 and out["built"], out
        return out["image"]

    def call(state="listed", check=False, **kw):
        return module("modak_images", dict(log_dir=str(log_dir), state=state, **kw), check)

    build.dir, build.call = log_dir, call
    return build


def safe(ref):
    """The image's name in the image directory's records (as the module makes it)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", ref)


def by_image(listing):
    return {os.path.basename(e["image"]): e for e in listing["images"]}


def age(path, days):
    """Make a file as old as ``days``."""
    when = time.time() - days * DAY
    os.utime(path, (when, when))


def test_a_built_image_records_how_to_remove_it_and_is_listed(images):
    a = images("a")
    record = json.loads((images.dir / ".built" / (safe(a) + ".json")).read_text())
    assert record == {"image": a, "runtime": "files", "remove": ["rm", "-f", a],
                      "size": ["stat", "-c", "%s", a], "file": True,
                      "exists": ["test", "-s", a], "listed": False, "cache_gc": None}
    out = images.call()
    assert out["rc"] == 0 and not out["changed"], out
    (entry,) = out["images"]
    assert entry["image"] == a and entry["runtime"] == "files"
    assert entry["size_bytes"] == os.path.getsize(a) == 1800  # (the file's own size)
    assert entry["unused_days"] < 0.01 and entry["leases"] == [] and not entry["building"]
    assert entry["why"] == "kept: used 0.0 days ago" and not entry["removable"]
    assert out["lines"] == [f"{a} (files, 1.8 kB): last used 0.0 days ago: kept: used 0.0 "
                            "days ago"]


def test_the_prune_removes_what_no_run_holds_or_used_lately(images):
    held, idle, recent = images("held"), images("idle"), images("recent")
    lease = images.call("leased", image=held, run="r1", run_dir="/runs/job-r1", file=True,
                        runtime="files", builder=BUILDER)
    assert lease["rc"] == 0 and lease["changed"] and lease["exists"] is True, lease
    for image in (held, idle):  # built 40 days ago, not used since
        age(images.dir / ".built" / safe(image), 40)
    age(images.dir / ".used" / (safe(held) + ".last"), 40)
    age(images.dir / ".used" / safe(held) / "r1", 3)  # its job still queued
    # check mode: what would go, nothing removed
    dry = images.call("pruned", check=True, unused_days=30)
    assert dry["rc"] == 0 and dry["removed"] == [idle] and not dry["changed"], dry
    assert f"{idle} (files, 2.1 kB): last used 40.0 days ago: would be removed: unused for " \
           "40.0 days" in dry["lines"]
    assert os.path.exists(idle)
    out = images.call("pruned", unused_days=30)
    assert out["rc"] == 0 and out["removed"] == [idle] and out["changed"], out
    assert not os.path.exists(idle) and os.path.exists(held) and os.path.exists(recent)
    whys = {k: e["why"] for k, e in by_image(out).items()}
    assert whys == {"held.sif": "kept: in use by 1 run(s)", "idle.sif": "removed: unused for "
                    "40.0 days", "recent.sif": "kept: used 0.0 days ago"}
    assert "held by /runs/job-r1" in next(ln for ln in out["lines"] if ln.startswith(held))
    left = images.call()
    assert sorted(by_image(left)) == ["held.sif", "recent.sif"]  # its record went too
    # a run that leases it now is told it is not there: it builds it again
    again = images.call("leased", image=idle, run="r3", file=True, runtime="files",
                        builder=BUILDER)
    assert again["rc"] == 0 and again["exists"] is False, again
    images.call("released", image=idle, run="r3", file=True)
    # its job ended: the lease is given back, and the image's last use is now
    back = images.call("released", image=held, run="r1", file=True)
    assert back["changed"] and not images.call("released", image=held, run="r1",
                                                file=True)["changed"]
    entry = by_image(images.call("pruned", unused_days=30))["held.sif"]
    assert entry["leases"] == [] and entry["why"] == "kept: used 0.0 days ago"


def test_a_stale_lease_no_longer_keeps_its_image(images):
    a = images("a")
    images.call("leased", image=a, run="lost", file=True)
    for path in (images.dir / ".built" / safe(a),
                 images.dir / ".used" / (safe(a) + ".last"),
                 images.dir / ".used" / safe(a) / "lost"):
        age(path, 20)
    listing = images.call("listed", unused_days=10, stale_days=14)
    (entry,) = listing["images"]
    assert entry["leases"] == [{"run": "lost", "run_dir": "", "age_days": 20.0, "stale": True}]
    assert "1 stale lease(s), older than stale_days" in listing["lines"][0]
    assert images.call("pruned", unused_days=10, stale_days=30)["removed"] == []
    out = images.call("pruned", unused_days=10, stale_days=14)
    assert out["removed"] == [a] and not os.path.exists(a)
    assert not (images.dir / ".used" / safe(a)).exists()


def test_an_image_an_older_modak_built_is_kept_until_a_run_records_how_to_remove_it(images):
    a = images("a")
    (images.dir / ".built" / (safe(a) + ".json")).unlink()  # as before this MODAK
    age(images.dir / ".built" / safe(a), 90)
    (entry,) = images.call("pruned", unused_days=1)["images"]
    assert entry["image"] == a and entry["runtime"] is None and not entry["removable"]
    assert entry["why"].startswith("kept: built by an older MODAK") and os.path.exists(a)
    # a run uses it: its lease records how to remove it, from the plan's builder
    images.call("leased", image=a, run="r2", file=True, runtime="files", builder=BUILDER)
    assert json.loads((images.dir / ".built" / (safe(a) + ".json")).read_text())["remove"] == \
        ["rm", "-f", a]
    images.call("released", image=a, run="r2", file=True)
    age(images.dir / ".used" / (safe(a) + ".last"), 2)
    out = images.call("pruned", unused_days=1)
    assert out["removed"] == [a] and not os.path.exists(a), out


def test_a_record_without_a_size_command_gets_the_builders_at_the_next_lease(images):
    """An image built when its runtime had no size command (Charliecloud's, before): a run
    that leases it with a builder that has one records it, so that the listing has its
    size; the lease keeps what was recorded of removing it."""
    without = {k: v for k, v in BUILDER.items() if k != "size"}
    b = images("b", builder=without)
    path = images.dir / ".built" / (safe(b) + ".json")
    assert json.loads(path.read_text())["size"] is None
    images.call("leased", image=b, run="r3", file=False, runtime="files", builder=BUILDER)
    record = json.loads(path.read_text())
    assert record["size"] == ["stat", "-c", "%s", b] and record["remove"] == ["rm", "-f", b]
    (entry,) = images.call("listed")["images"]
    assert entry["size_bytes"] == os.path.getsize(b)


def test_an_image_removed_outside_modak_is_listed_gone_and_its_records_dropped(images):
    """An image removed by hand (a SIF file deleted, Charliecloud's storage reset): the
    listing says it is gone, whenever it was last used; the prune drops its records without
    running its remove command (which would fail); an image a run holds is not looked at."""
    a, b = images("a"), images("b")
    os.unlink(a)
    os.unlink(b)
    images.call("leased", image=b, run="r4", file=True)
    listed = by_image(images.call("listed"))
    assert listed["a.sif"]["gone"] and listed["a.sif"]["why"].startswith("gone: no longer")
    assert listed["a.sif"]["size_bytes"] is None and listed["a.sif"]["removable"]
    assert not listed["b.sif"]["gone"] and listed["b.sif"]["why"] == "kept: in use by 1 run(s)"
    check = images.call("pruned", check=True)
    assert check["forgotten"] == [a] and check["removed"] == [] and not check["changed"]
    assert (images.dir / ".built" / safe(a)).exists()
    out = images.call("pruned")
    assert out["rc"] == 0 and out["forgotten"] == [a] and out["removed"] == [], out
    assert out["changed"] and "forgotten: gone" in " ".join(out["lines"])
    assert not (images.dir / ".built" / safe(a)).exists()
    assert not (images.dir / ".built" / (safe(a) + ".json")).exists()
    assert (images.dir / ".built" / safe(b)).exists()  # (held: a run builds it again)


def test_a_removal_that_fails_keeps_the_image_and_says_so(images):
    a = images("a", builder=dict(BUILDER, remove={"argv": ["sh", "-c", "echo cannot >&2; "
                                                           "exit 3", "{image}"]}))
    age(images.dir / ".built" / safe(a), 40)
    out = images.call("pruned", unused_days=30)
    assert out["rc"] != 0 and out["msg"] == f"could not remove 1 image(s): {a}: cannot", out
    assert by_image(out)["a.sif"]["why"] == "kept: its removal failed" and out["removed"] == []
    assert os.path.exists(a) and (images.dir / ".built" / safe(a)).exists()
    assert by_image(images.call())["a.sif"]["removable"]  # (tried again by the next prune)
    os.unlink(a)  # removed by hand: it is gone, and so are its records (no removal tried)
    gone = images.call("pruned", unused_days=30)
    assert gone["rc"] == 0 and gone["forgotten"] == [a] and gone["removed"] == [], gone
    assert images.call()["images"] == []


def test_a_running_build_keeps_its_image(images):
    a = images("a")
    age(images.dir / ".built" / safe(a), 40)
    lock = images.dir / ".building" / (safe(a) + ".pid")
    lock.write_text(str(os.getpid()))  # (a live process holds the build's lock)
    (entry,) = images.call("pruned", unused_days=30)["images"]
    assert entry["building"] and entry["why"] == "kept: a build of it is running"
    assert os.path.exists(a)


def test_the_prune_clears_each_builders_cache_once_unless_a_build_runs(images, tmp_path):
    """After its removals a prune runs the command its images' build records give for
    clearing their builder's cache of what no image uses (Podman's failed builds' layers,
    Charliecloud's unreachable build states), once a command, whatever the number of
    images; not in check mode, not while a build runs, and one that fails is a warning."""
    said = tmp_path / "gc.log"
    gc = {"argv": ["sh", "-c", f"echo ran >> {said}; echo freed 3 states"]}
    a, b = images("a", dict(BUILDER, cache_gc=gc)), images("b", dict(BUILDER, cache_gc=gc))
    images("plain")  # (a builder without a cache command: nothing of its own to run)
    age(images.dir / ".built" / safe(a), 40)
    listed = images.call()
    assert "caches" not in listed and not said.exists()  # a listing clears nothing
    dry = images.call("pruned", check=True, unused_days=30)
    assert dry["lines"][-1] == f"builder cache: would run sh -c echo ran >> {said}; echo " \
        "freed 3 states" and not said.exists(), dry
    out = images.call("pruned", unused_days=30)
    assert out["rc"] == 0 and out["removed"] == [a], out
    assert said.read_text() == "ran\n"  # once for both images
    assert out["caches"] == [{"argv": gc["argv"], "ran": True, "rc": 0, "line": out["lines"][-1]}]
    assert out["lines"][-1].endswith(": freed 3 states")
    assert all("cache_gc" not in e for e in out["images"])
    # a build running in the directory: its layers are no image's yet, and stay
    lock = images.dir / ".building" / "new_image.pid"
    lock.write_text(str(os.getpid()))
    busy = images.call("pruned", unused_days=30)
    assert said.read_text() == "ran\n" and busy["caches"][0]["ran"] is False
    assert busy["lines"][-1].endswith("not run: a build is running (new_image)")
    lock.unlink()
    # one that fails: said, and a warning; the prune's removals stand
    record = images.dir / ".built" / (safe(b) + ".json")
    broken = json.loads(record.read_text())
    broken["cache_gc"] = ["sh", "-c", "echo storage is locked >&2; exit 3"]
    record.write_text(json.dumps(broken))
    failed = images.call("pruned", unused_days=30)
    assert failed["rc"] == 0 and failed["lines"][-1] == (
        "builder cache: sh -c echo storage is locked >&2; exit 3 failed (exit 3): storage "
        "is locked"), failed
    # (Ansible 2.19 hands a module's warnings on as events)
    assert "storage is locked" in json.dumps(failed["warnings"]), failed


def test_an_older_record_gets_the_builders_cache_command_at_the_next_lease(images):
    a = images("a")
    gc = {"argv": ["true"]}
    images.call("leased", image=a, run="r1", file=True, runtime="files",
                builder=dict(BUILDER, cache_gc=gc))
    record = json.loads((images.dir / ".built" / (safe(a) + ".json")).read_text())
    assert record["cache_gc"] == ["true"] and record["size"] == ["stat", "-c", "%s", a]


def test_bad_arguments_fail_without_touching_anything(images):
    assert images.call("leased", image="x")["rc"] != 0  # no run
    out = images.call("pruned", unused_days=-1)
    assert out["rc"] != 0 and "cannot be negative" in out["msg"]
    empty = module("modak_images", {"log_dir": str(images.dir / "none")})
    assert empty["rc"] == 0 and empty["images"] == [] and "no such directory" in empty["lines"][0]
