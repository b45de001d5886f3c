"""Apptainer (formerly Singularity): a SIF file per image, ``apptainer exec``.

Apptainer is not installable on MODAK's development machines: its recipes and
command lines are rendered and tested exactly (golden files), not executed.
"""
from __future__ import annotations

from typing import Any

from ..shell import Raw, Word
from .base import BIND, WORKDIR, RuntimeSpec

# the build context's wheel folder (the roles copy the wheelhouse there), which the recipe's
# %files reads through its WHEELHOUSE argument
WHEELHOUSE = "wheels"


class Apptainer(RuntimeSpec):
    name = "apptainer"
    recipe_format = "apptainer"

    def base_reference(self, base: str) -> str:
        # a local base (podman/debootstrap import) is a SIF file next to the recipe
        if base.startswith("localhost/"):
            return base.split("/", 1)[1].replace("/", "-").replace(":", "-") + ".sif"
        return base

    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        file = f"{name.replace('/', '_')}_{tag}.sif"
        return file if image_dir == "." else f"{image_dir}/{file}"

    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        words: list[Word] = ["apptainer", "exec"]
        if gpus:
            words.append("--nv")
        # --cleanenv: the host's environment (its PYTHONPATH, its modules') stays out; but it
        # would keep out what a launcher sets for each rank too, and --env takes no prefix:
        # a rank the launcher starts keeps the environment it is started in
        if not passed:
            words.append("--cleanenv")
        words += ["--bind", Raw(f'{BIND}:{WORKDIR}'), "--pwd", WORKDIR]
        for path in data:  # (its underlay makes the mount point)
            words += ["--bind", f"{path}:{path}:ro"]
        for key, value in env.items():
            if "," not in value:  # --env splits its value on commas: see exports()
                words += ["--env", f"{key}={value}"]
        image_word: Word = image if image.startswith("/") else Raw(f'"$HOME"/{_q(image)}')
        return words + [image_word]


    def builder(self, wheelhouse: bool = False) -> dict[str, Any]:
        # built into a partial file, renamed when complete; %files paths are relative to
        # the recipe's directory
        return {
            "exists": {"argv": ["test", "-s", "{image}"]},
            "build": {"argv": ["apptainer", "build", "--fakeroot", "--force", "{build_args}",
                               "{partial}", "{recipe}"], "cwd": "recipe_dir"},
            "remove": {"argv": ["rm", "-f", "{image}"]},
            "build_arg": "--build-arg",
            "build_args": {"WHEELHOUSE": WHEELHOUSE} if wheelhouse else {},
            "file": True,
        }

    def exports(self, env: dict[str, str]) -> dict[str, str]:
        """Values with a comma reach the container as APPTAINERENV_NAME (kept whole, also
        under --cleanenv); ``--env`` would split them into several variables."""
        return {f"APPTAINERENV_{k}": v for k, v in env.items() if "," in v}


def _q(path: str) -> str:
    import shlex
    return shlex.quote(path)
