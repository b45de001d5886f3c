"""What every container runtime provides: its recipe format, image names, launch words."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional

from ..shell import Raw, Word

# the label every image MODAK builds carries (its variant; render.py writes it first, so a
# build's every layer after its base has it): what a prune of a builder's cache is kept to
IMAGE_LABEL = "org.modak.variant"

WORKDIR = "/work"  # where the job's work directory is mounted inside the container
BIND = Raw('"$PWD"')  # the job's work directory on the host, expanded at run time


class RuntimeSpec(ABC):
    name: str
    recipe_format: Optional[str]  # key of RECIPE_FORMATS, None for no container
    # whether it binds the host paths that ``launch`` is given read-only (what else: the
    # job's login's own permissions on them, as for the job script itself)
    read_only_binds: bool = True

    def base_reference(self, base: str) -> str:
        """How this runtime's recipe names a catalogue base image."""
        return base

    @abstractmethod
    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        """How the job script refers to the image that the recipe builds."""

    @abstractmethod
    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        """Words that run a command inside ``image``, with ``env`` set inside it and the
        variables ``passed`` (a name, or a prefix ending in ``*``) as they are where it is
        started: those that a launcher (srun, mpirun) sets for each rank it starts; and the
        host's paths ``data`` (checked absolute paths: ``validate.check_dataset``) bound at
        the same paths inside it (read-only where ``read_only_binds``; onto the image's own
        directories where ``mount_points`` names them)."""

    def mount_points(self, data: tuple[str, ...]) -> tuple[str, ...]:
        """Of the host paths ``data`` that ``launch`` binds, those the image itself must have
        as directories (made by its recipe), where this runtime cannot make a mount point in
        the image when it starts the container."""
        return ()

    def builder(self, wheelhouse: bool = False) -> Optional[dict[str, Any]]:
        """What the front-end runs to build, find and remove this runtime's images, as data
        (JSON) that ``modak_image`` executes; None without images.  Placeholders:
        ``{image}``, ``{recipe}``, ``{context}``, ``{partial}`` (the image file while it is
        built), ``{build_args}`` (each as ``build_arg`` NAME=VALUE words).  Keys:

        - ``exists``: {``argv``, ``listed``: the image is there when its reference is a
          word of the output (else: when the command succeeds)};
        - ``build``: {``argv``, ``cwd``: ``context`` or ``recipe_dir``};
        - ``remove``: {``argv``};
        - ``size`` (optional): {``argv``} printing the image's size in bytes (a file
          image's is the file's), for ``modak_images``' listing;
        - ``build_arg``: the option that passes one build argument;
        - ``build_args``: the arguments the recipe needs ({NAME: VALUE});
        - ``file``: the image is a file (relative: under the login's home), built into
          ``{partial}`` and renamed when complete;
        - ``leftovers`` (optional): what a killed build leaves, found in a JSON listing
          (``argv``, ``where``: {field: value}, ``name_field``, ``name_pattern``,
          ``created_field``, ``id_field``) and removed with ``remove`` + their ids; ``what``
          names them in the message.
        """
        return None

    def exports(self, env: dict[str, str]) -> dict[str, str]:
        """Variables the job script itself exports (the runtime passes the rest)."""
        return {}

    def stop(self) -> Optional[str]:
        """Shell commands that stop what ``launch`` started outside the job's own processes
        (``$MODAK_JOB_TAG`` names this job's containers), run by the job script when the
        scheduler cancels it or its time runs out; None where the job's processes are all
        there is (the scheduler's signals reach them)."""
        return None
