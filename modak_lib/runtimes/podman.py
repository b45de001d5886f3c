"""Podman (or Docker): images in the user's container storage, ``podman run``."""
from __future__ import annotations

from ..shell import Raw, Word
from .base import BIND, WORKDIR, RuntimeSpec


class Podman(RuntimeSpec):
    name = "podman"
    recipe_format = "containerfile"

    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        return f"localhost/{name}:{tag}"

    def launch(self, image: str, env: dict[str, str], gpus: int) -> list[Word]:
        words: list[Word] = ["podman", "run", "--rm", "--pull=never", "--network=host",
                             "--volume", Raw(f"{BIND}:{WORKDIR}"), "--workdir", WORKDIR]
        if gpus:
            words += ["--device", "nvidia.com/gpu=all"]
        for key, value in env.items():
            words += ["--env", f"{key}={value}"]
        return words + [image]
