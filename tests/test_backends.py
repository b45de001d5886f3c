"""Every registered container runtime's image commands, as modak_image (the front-end's
stdlib-only module) executes them from the runtime backend's data, and what it finds to
clean after a killed build.  Adding a runtime with images = its file, its registry line and
its row in BUILDS."""
import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from modak_lib.runtimes import RUNTIMES

sys.path.insert(0, str(ROOT / "build/collections"))
image = pytest.importorskip("ansible_collections.modak.modak.plugins.modules.modak_image")
sys.path.pop(0)

WITH_IMAGES = sorted(name for name, r in RUNTIMES.items() if r.builder() is not None)

# the runtimes whose image's size is a command's output (a file image's is the file's)
SIZES = {"podman": ["podman", "image", "inspect", "--format", "{{.Size}}", "localhost/modak/x:1"],
         "charliecloud": ["sh", "-c", 'd=$(ch-image gestalt storage-path) && du -sb '
                          '"$d/img/$(printf %s "$1" | tr "/:" "%+")" | cut -f1', "sh",
                          "modak/x:1"]}
# the runtimes whose builder has a cache that a prune clears of what no image uses: only
# MODAK's layers (its recipes' label) for Podman, whose store is the user's too
CACHES = {"podman": ["podman", "image", "prune", "--force", "--filter",
                     "label=org.modak.variant"],
          "charliecloud": ["ch-image", "build-cache", "--gc"]}
# runtime -> (image reference, build argv, exists argv, remove argv), for the recipe
# /b/recipe, the context /b and the build argument A=1
BUILDS = {
    "podman": ("localhost/modak/x:1",
               ["podman", "build", "--pull=missing", "--network=host", "--layers=true", "-f",
                "/b/recipe", "-t", "localhost/modak/x:1", "--build-arg", "A=1", "/b"],
               ["podman", "image", "exists", "localhost/modak/x:1"],
               ["podman", "image", "rm", "-f", "localhost/modak/x:1"]),
    "charliecloud": ("modak/x:1",
                     ["ch-image", "build", "--force", "-t", "modak/x:1", "-f", "/b/recipe",
                      "--build-arg", "A=1", "/b"],
                     ["ch-image", "list"], ["ch-image", "delete", "modak/x:1"]),
    "apptainer": ("/img/x_1.sif",
                  ["apptainer", "build", "--fakeroot", "--force", "--build-arg", "A=1",
                   "--build-arg", "WHEELHOUSE=wheels", "/img/x_1.sif.partial", "/b/recipe"],
                  ["test", "-s", "/img/x_1.sif"], ["rm", "-f", "/img/x_1.sif"]),
}


def test_every_runtime_with_images_has_a_row():
    assert set(WITH_IMAGES) == set(BUILDS)


@pytest.mark.parametrize("name", WITH_IMAGES)
def test_builder_commands(name):
    data = json.loads(json.dumps(RUNTIMES[name].builder(wheelhouse=True)))  # as in plan.json
    ref, build, exists, remove = BUILDS[name]
    cmds = image.builder_commands(data, ref, "/b/recipe", "/b", {"A": "1"})
    size = {"size": SIZES[name]} if name in SIZES else {}
    cache = {"cache_gc": CACHES[name]} if name in CACHES else {}
    assert cmds == {"build": build, "exists": exists, "remove": remove, **size, **cache}


class FakeModule:
    def __init__(self, out):
        self.out, self.calls = out, []

    def run_command(self, argv, **kwargs):
        self.calls.append(argv)
        return 0, self.out, ""


# what a failed build logged, as Podman 4 wrote it here (the registry's name and the resolver's
# address replaced): a base not in the store built with --pull=never, and one it tried to
# pull with --pull=missing (no registry reachable)
NOT_KNOWN = """STEP 1/16: FROM localhost/debian:bookworm
Error: creating build container: localhost/debian:bookworm: image not known
"""
NOT_PULLED = """STEP 1/2: FROM debian:trixie
Resolved "debian" as an alias (/etc/containers/registries.conf.d/shortnames.conf)
Trying to pull registry.example.org/library/debian:trixie...
Error: creating build container: initializing source docker://debian:trixie: pinging container \
registry registry.example.org: Get "https://registry.example.org/v2/": dial tcp: lookup \
registry.example.org on 192.0.2.53:53: no such host
"""
RUN_FAILED = """STEP 1/3: FROM localhost/debian:bookworm
STEP 2/3: RUN pip install nonesuch
ERROR: No matching distribution found for nonesuch (not found)
Error: building at STEP "RUN pip install nonesuch": exit status 1
"""


@pytest.mark.parametrize("recipe, log, base", [
    ("FROM localhost/debian:bookworm\nRUN true\n", NOT_KNOWN, "localhost/debian:bookworm"),
    ("# a comment\nFROM debian:trixie\n", NOT_PULLED, "debian:trixie"),
    ("Bootstrap: docker\nFrom: debian:trixie\n", NOT_PULLED, "debian:trixie"),
    ("FROM localhost/debian:bookworm\nRUN pip install nonesuch\n", RUN_FAILED, None),
    ("FROM localhost/other:1\n", NOT_KNOWN, None),
])
def test_a_build_that_failed_for_want_of_its_base_image_says_so(tmp_path, recipe, log, base):
    """A build that failed because its base image is neither in the front-end's store nor
    pullable names that image in its message (with what to do); a build that failed
    otherwise, its base named only on its FROM step, does not."""
    path = tmp_path / "recipe"
    path.write_text(recipe)
    assert image.base_unavailable(str(path), log) == base


def test_a_killed_podman_build_leaves_working_containers_that_are_found():
    rows = [
        {"Id": "a", "State": "storage", "Command": ["buildah"], "Created": 100,
         "Names": ["debian-working-container-4"]},
        {"Id": "b", "State": "storage", "Command": ["buildah"], "Created": 50,  # older
         "Names": ["debian-working-container"]},
        {"Id": "c", "State": "running", "Command": ["python3"], "Created": 100,  # a job
         "Names": ["train"]},
        {"Id": "d", "State": "storage", "Command": ["buildah"], "Created": 100,
         "Names": ["someone-elses-container"]},
    ]
    spec = RUNTIMES["podman"].builder()["leftovers"]
    module = FakeModule(json.dumps(rows))
    assert image.leftovers(module, {}, 99.5, spec) == ["a"]
    assert module.calls == [spec["argv"]]
    assert image.leftovers(FakeModule("not json"), {}, 0, spec) == []


# A stand-in `podman` for the job script's signal handling: `run` is slow to create its
# container (rootless Podman on vfs, under load): a TERM that comes meanwhile is honoured
# only once the container exists, CREATE_S later.  The containers are files in $FAKE_STATE
# (name: id, content: "label state").
FAKE_PODMAN = r"""#!/bin/bash
state=$FAKE_STATE
case $1 in
  run)
    label=""
    for a in "$@"; do case $a in --label=modak.job=*) label=${a#--label=modak.job=} ;; esac; done
    echo "$$" > "$state/launcher.pid"
    trap 'sleep "$CREATE_S"; echo "$label created" > "$state/c$$"; exit 143' TERM
    while :; do sleep 0.1; done ;;
  ps)
    all=0; want=""
    shift
    while [ $# -gt 0 ]; do
      case $1 in -a) all=1 ;; --filter) shift; want=${1#label=modak.job=} ;; esac; shift
    done
    for f in "$state"/c*; do
      [ -e "$f" ] || continue
      read -r label st < "$f"
      [ "$label" = "$want" ] || continue
      [ "$all" = 1 ] || [ "$st" = running ] && basename "$f"
    done ;;
  kill) for id in "${@: -1}"; do [ -e "$state/$id" ] && sed -i 's/ running$/ exited/' "$state/$id"; done ;;
  rm) shift; for id in "$@"; do case $id in -*) ;; *) rm -f "$state/$id" ;; esac; done ;;
esac
"""


def test_a_signal_stops_the_container_its_launcher_creates_late(tmp_path):
    """The scheduler's TERM reaches `podman run` while it is still creating the container,
    which it finishes (CREATE_S) after the stop's own 3 s wait: the job script waits for the
    launcher to end, then removes what it created.  Nothing of the job is left."""
    import os
    import signal
    import subprocess
    import time

    from modak_lib.render import render_job_script
    from modak_lib.shell import join

    runtime = RUNTIMES["podman"]
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "podman").write_text(FAKE_PODMAN)
    (bin_dir / "podman").chmod(0o755)
    script = render_job_script(
        directives=[], exports={}, source="b.yaml", chosen="stock", decided_by="test",
        run_id="r1", stop=runtime.stop(),
        launch=join(runtime.launch("localhost/modak/x:1", {}, 0) + ["python3", "t.py"]))
    (tmp_path / "job.sh").write_text(script)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_STATE=str(state),
               CREATE_S="4")
    job = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env,
                           start_new_session=True)
    for _ in range(100):
        if (state / "launcher.pid").exists():
            break
        time.sleep(0.05)
    assert (state / "launcher.pid").exists(), "the launcher did not start"
    os.killpg(job.pid, signal.SIGTERM)  # as the scheduler: the script and its launcher
    assert job.wait(timeout=30) == -signal.SIGTERM
    launcher = int((state / "launcher.pid").read_text())
    for _ in range(200):  # (what a launcher left behind is there once it has ended)
        if not Path(f"/proc/{launcher}").exists():
            break
        time.sleep(0.05)
    left = sorted(p.name for p in state.iterdir() if p.name.startswith("c"))
    assert left == [], left
