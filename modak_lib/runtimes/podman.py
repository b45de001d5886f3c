"""Podman (or Docker): images in the user's container storage, ``podman run``."""
from __future__ import annotations

from typing import Any

from ..shell import Raw, Word
from .base import BIND, IMAGE_LABEL, WORKDIR, RuntimeSpec


LABEL = "modak.job"  # the job's containers carry LABEL=$MODAK_JOB_TAG

# Rootless Podman's container lives under conmon, outside the job's processes and cgroup:
# the scheduler's SIGTERM/SIGKILL end `podman run` but not the training.  The job script
# stops the labelled containers itself: SIGTERM (the runtime records and exits), then, 3 s
# later, removes by force what is left, including one that `podman run` created as it was
# being killed.  Only the containers on the node that runs the job script are reached.
_LIST = f'podman ps -a -q --filter "label={LABEL}=$MODAK_JOB_TAG" 2>/dev/null'
_STOP = f"""\
  local -a ids
  mapfile -t ids < <(podman ps -q --filter "label={LABEL}=$MODAK_JOB_TAG" 2>/dev/null)
  [ "${{#ids[@]}}" -eq 0 ] || podman kill --signal TERM "${{ids[@]}}" >/dev/null 2>&1
  for _ in 1 2 3 4 5 6; do
    [ -z "$({_LIST})" ] && return 0
    sleep 0.5
  done
  mapfile -t ids < <({_LIST})
  [ "${{#ids[@]}}" -eq 0 ] || podman rm --force --time 0 --ignore "${{ids[@]}}" >/dev/null 2>&1"""


# /dev/shm as large as the node's own (half its memory, tmpfs's default; a limit, not a
# reservation), where Podman gives a container 64 MB: a DataLoader with worker processes
# hands each batch over in shared memory, and a user's 64-image batches of 224x224 failed
# in the container ("unable to allocate shared memory(shm) ... No space left on device")
# where they ran on the host.  Apptainer and Charliecloud use the host's /dev/shm; Podman's
# --ipc=host would too, but fails where the host has no /dev/mqueue (this project's)
SHM_SIZE = '--shm-size="$(( $(getconf _PHYS_PAGES) * $(getconf PAGE_SIZE) / 2 ))"'


class Podman(RuntimeSpec):
    name = "podman"
    recipe_format = "containerfile"

    def image_reference(self, name: str, tag: str, image_dir: str) -> str:
        return f"localhost/{name}:{tag}"

    def launch(self, image: str, env: dict[str, str], gpus: int,
               passed: tuple[str, ...] = (), data: tuple[str, ...] = ()) -> list[Word]:
        words: list[Word] = ["podman", "run", "--rm", "--pull=never", "--network=host",
                             Raw(SHM_SIZE), Raw(f'--label={LABEL}="$MODAK_JOB_TAG"'),
                             "--volume", Raw(f"{BIND}:{WORKDIR}"), "--workdir", WORKDIR]
        for path in data:  # (podman creates the mount point)
            words += ["--volume", f"{path}:{path}:ro"]
        if gpus:
            words += ["--device", "nvidia.com/gpu=all"]
        for key, value in env.items():
            words += ["--env", f"{key}={value}"]
        for name in passed:  # (a name alone: its value where podman runs, if set there;
            words += ["--env", name]  # NAME*: every variable whose name starts so)
        return words + [image]

    def stop(self) -> str:
        return _STOP

    def builder(self, wheelhouse: bool = False) -> dict[str, Any]:
        return {
            "exists": {"argv": ["podman", "image", "exists", "{image}"]},
            "build": {"argv": ["podman", "build", "--pull=missing", "--network=host",
                               "--layers=true", "-f", "{recipe}", "-t", "{image}",
                               "{build_args}", "{context}"], "cwd": "context"},
            "remove": {"argv": ["podman", "image", "rm", "-f", "{image}"]},
            # (`image rm` takes an image's own layers with it; a failed or killed build's
            # stay, untagged: those carrying MODAK's label are cleared by a prune)
            "cache_gc": {"argv": ["podman", "image", "prune", "--force", "--filter",
                                  f"label={IMAGE_LABEL}"]},
            "size": {"argv": ["podman", "image", "inspect", "--format", "{{.Size}}", "{image}"]},
            "build_arg": "--build-arg", "build_args": {},
            # a killed `podman build` leaves buildah's working containers (in storage only,
            # each holding a copy of a layer), named IMAGE-working-container[-N]
            "leftovers": {"argv": ["podman", "ps", "--all", "--external", "--format", "json"],
                          "where": {"State": "storage", "Command": ["buildah"]},
                          "name_field": "Names", "name_pattern": r"-working-container(-\d+)?$",
                          "created_field": "Created", "id_field": "Id",
                          "what": "working container(s) of the builder",
                          "remove": ["podman", "rm", "--force"]},
        }
