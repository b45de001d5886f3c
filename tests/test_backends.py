"""Every registered container runtime's image commands, as modak_image (the front-end's
stdlib-only module) executes them from the runtime backend's data, and what it finds to
clean after a killed build.  Adding a runtime with images = its file, its registry line and
its row in BUILDS."""
import json
import sys

import pytest
from conftest import ROOT

from modak_lib.runtimes import RUNTIMES

sys.path.insert(0, str(ROOT / "build/collections"))
image = pytest.importorskip("ansible_collections.modak.modak.plugins.modules.modak_image")
sys.path.pop(0)

WITH_IMAGES = sorted(name for name, r in RUNTIMES.items() if r.builder() is not None)

# runtime -> (image reference, build argv, exists argv, remove argv), for the recipe
# /b/recipe, the context /b and the build argument A=1
BUILDS = {
    "podman": ("localhost/modak/x:1",
               ["podman", "build", "--pull=never", "--network=host", "--layers=true", "-f",
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
    assert cmds == {"build": build, "exists": exists, "remove": remove}


class FakeModule:
    def __init__(self, out):
        self.out, self.calls = out, []

    def run_command(self, argv, **kwargs):
        self.calls.append(argv)
        return 0, self.out, ""


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
