"""Container runtimes by name: adding one is adding a file and a line here."""
from __future__ import annotations

from .apptainer import Apptainer
from .base import WORKDIR, RuntimeSpec
from .charliecloud import Charliecloud
from .none import NoRuntime
from .podman import Podman

RUNTIMES: dict[str, RuntimeSpec] = {r.name: r for r in (Apptainer(), Podman(), Charliecloud(),
                                                        NoRuntime())}

__all__ = ["RUNTIMES", "RuntimeSpec", "WORKDIR"]
