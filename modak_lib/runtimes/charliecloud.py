"""Charliecloud: unprivileged ``ch-image build`` and ``ch-run`` from its image storage."""
from __future__ import annotations

from typing import Any

from ..shell import Raw, Word
from .base import BIND, WORKDIR, RuntimeSpec


class Charliecloud(RuntimeSpec):
    name = "charliecloud"
    recipe_format = "charliecloud"

    def base_reference(self, base: str) -> str:
        # ch-image names an imported base without a registry host
        return base.split("/", 1)[1] if base.startswith("localhost/") else base

    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        return f"{name}:{tag}"

    # ch-run (0.31) binds onto a directory the image has: it cannot create one in the image
    # it mounts read-only ("can't mkdir: ... Read-only file system"), nor make a bind
    # read-only; MODAK's images are built once per recipe, for any job's data
    no_data_binds = ("ch-run cannot bind a host directory where the image has none (it "
                     "mounts the image read-only), nor read-only: use podman or apptainer, "
                     "or give the data to the run directory (application.files)")

    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        if data:
            raise ValueError(self.no_data_binds)
        # bare --set-env applies the image's own ENV (its PATH); --env-no-expand keeps ch-run
        # from expanding $ in MODAK's values (the shell quoting already made them literal);
        # ch-run keeps the environment it is started in, ``passed`` included
        words: list[Word] = ["ch-run", "--bind", Raw(f"{BIND}:{WORKDIR}"), "--cd", WORKDIR,
                             "--env-no-expand", "--set-env"]
        for key, value in env.items():
            words.append(f"--set-env={key}={value}")
        return words + [image, "--"]

    def builder(self, wheelhouse: bool = False) -> dict[str, Any]:
        return {
            # `ch-image list REF` also asks the image's registry: list local storage only
            "exists": {"argv": ["ch-image", "list"], "listed": True},
            "build": {"argv": ["ch-image", "build", "--force", "-t", "{image}", "-f",
                               "{recipe}", "{build_args}", "{context}"], "cwd": "context"},
            "remove": {"argv": ["ch-image", "delete", "{image}"]},
            "build_arg": "--build-arg", "build_args": {},
        }
