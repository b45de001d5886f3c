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

    # ch-run (0.31) binds onto a directory the image has: it cannot make one in the image,
    # which it mounts read-only ("can't mkdir: ... Read-only file system"); the recipe makes
    # the dataset's (so an image per dataset path, from the same build cache).  Nor can it
    # make a bind read-only: the job's login's own permissions apply to the data.  ch-run
    # binds the node's /tmp itself: a path under it needs no mount point (a RUN of
    # ch-image build would make it in the front-end's /tmp, not in the image)
    read_only_binds = False

    def mount_points(self, data: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(path for path in data if not (path + "/").startswith("/tmp/"))

    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        # bare --set-env applies the image's own ENV (its PATH); --env-no-expand keeps ch-run
        # from expanding $ in MODAK's values (the shell quoting already made them literal);
        # ch-run keeps the environment it is started in, ``passed`` included
        words: list[Word] = ["ch-run", "--bind", Raw(f"{BIND}:{WORKDIR}")]
        for path in data:  # (onto the image's own directory: mount_points)
            words += ["--bind", f"{path}:{path}"]
        words += ["--cd", WORKDIR, "--env-no-expand", "--set-env"]
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
            # (the build cache keeps every state built: its garbage collection drops those
            # no image reaches and packs the rest; 4 GiB to 934 MiB here, in 50 s)
            "cache_gc": {"argv": ["ch-image", "build-cache", "--gc"]},
            # bytes of the image's directory in the builder's storage (ch-image 0.31 names it
            # IMAGE with '/' as '%' and ':' as '+'; its list says no size)
            "size": {"argv": ["sh", "-c", 'd=$(ch-image gestalt storage-path) && du -sb '
                              '"$d/img/$(printf %s "$1" | tr "/:" "%+")" | cut -f1',
                              "sh", "{image}"]},
            "build_arg": "--build-arg", "build_args": {},
        }
