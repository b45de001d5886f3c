"""The wheelhouse: the Python wheels an image installs from when its front-end has no package
index (air-gapped; a catalogue variant with ``wheelhouse: true``).  The deploy copies the
directory into the build context as ``wheels/``, and only when it builds: an image that
exists on the front-end needs none.

``modak wheelhouse`` fills it (``scripts/wheelhouse`` in the source tree calls it): ``pip
download`` of binary wheels for the images' Python and platform, not this host's.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from .catalogue import Catalogue, Variant, load_catalogue
from .errors import ModakError
from .paths import user_dir

IMAGE_PYTHON = "3.11"  # the images' Python: Debian 12's (their base image)


def default_dir() -> Path:
    """Where the deploy looks for it when ``modak_wheelhouse`` is not set."""
    return user_dir("wheelhouse")


def variant(image: Optional[str] = None, catalogue: Optional[Catalogue] = None) -> Variant:
    """The catalogue's wheelhouse image ``image`` (by id), by default its first one."""
    cat = catalogue or load_catalogue()
    found = [v for v in cat.variants if v.wheelhouse]
    for v in found:
        if image in (None, v.id):
            return v
    raise ModakError(f"--image {image}: not an image of the catalogue that installs from a "
                     f"wheelhouse ({', '.join(v.id for v in found) or 'none does'})")


def download_command(directory: Path, reqs: Sequence[str], arch: str,
                     python: str = sys.executable) -> list[str]:
    """pip's command that downloads ``reqs`` (and their dependencies) as binary wheels for
    the images' Python on ``arch`` into ``directory``."""
    platforms = [f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}",
                 "any"]
    return [python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--implementation", "cp",
            *(a for p in platforms for a in ("--platform", p)), "-d", str(directory), *reqs]


def fill(directory: Path, reqs: Sequence[str], arch: str) -> int:
    """Download into ``directory`` (created); pip's exit status."""
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.run(download_command(directory, reqs, arch)).returncode
