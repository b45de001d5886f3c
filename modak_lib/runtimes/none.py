"""No container: the job runs on the node's own software; the script exports the env."""
from __future__ import annotations

from ..shell import Word
from .base import RuntimeSpec


class NoRuntime(RuntimeSpec):
    name = "none"
    recipe_format = None

    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        return ""

    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        return []  # (the program runs in the launcher's environment, ``data`` where it is)

    def exports(self, env: dict[str, str]) -> dict[str, str]:
        return dict(env)
