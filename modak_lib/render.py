"""Renderers: typed data in, text out, through a sandboxed Jinja2 environment.

Templates are MODAK's own files; user values reach them only as data, and
every value that lands in a shell context goes through the ``q`` filter
(:func:`shlex.quote`) or was validated against a strict pattern first.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modak_runtime.launched import PORT_BASE, PORT_SPAN

from . import __version__
from .catalogue import Variant
from .cpu import target_flags
from .runtimes.base import IMAGE_LABEL
from .shell import comment_safe
from .validate import IMAGE_DIRS, PACKAGE

VENV = IMAGE_DIRS[0]  # where a recipe with a venv installs the framework (a dataset cannot be)

TEMPLATES = Path(__file__).parent / "templates"

# recipe format -> (template, file name written by `modak plan`)
RECIPE_FORMATS: dict[str, tuple[str, str]] = {
    "apptainer": ("recipes/apptainer.j2", "apptainer.def"),
    "containerfile": ("recipes/containerfile.j2", "Containerfile"),
    "charliecloud": ("recipes/charliecloud.j2", "Dockerfile.charliecloud"),
}


@functools.lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["comment"] = comment_safe
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(modak_version=__version__, **context)


# ---------------------------------------------------------------------------
# recipes
@dataclass(frozen=True)
class RecipeSpec:
    """One image description, rendered to each recipe format."""
    variant: str
    base: str
    bootstrap: str
    labels: dict[str, str]
    run_lines: tuple[str, ...]      # system setup (apt), before the wheelhouse is copied
    install_lines: tuple[str, ...]  # Python packages
    env: dict[str, str] = field(default_factory=dict)
    wheelhouse: bool = False
    wheelhouse_dir: str = "wheels"
    ca_certs: bool = False
    workdir: str = "/work"
    # empty directories the image has for the runtime to bind host paths onto (a dataset's,
    # where the runtime cannot make its mount point: runtimes.base.RuntimeSpec.mount_points)
    mount_points: tuple[str, ...] = ()


def _apt_line(packages: tuple[str, ...], ca_certs: bool) -> Optional[str]:
    pkgs = list(packages) + (["ca-certificates"] if ca_certs else [])
    if not pkgs:
        return None
    line = ("apt-get update && apt-get install -y --no-install-recommends "
            + " ".join(shlex.quote(p) for p in pkgs))
    if ca_certs:
        line += " && update-ca-certificates"
    return line + " && rm -rf /var/lib/apt/lists/*"


def recipe_spec(variant: Variant, microarch: str, base: str, *, ca_certs: bool = False,
                cuda_arch: Optional[str] = None, extra_pip: tuple[str, ...] = (),
                mount_points: tuple[str, ...] = ()) -> RecipeSpec:
    """Describe the image for ``variant`` built for a target of ``microarch``;
    ``mount_points``: checked absolute paths (``validate.check_dataset``) made in it."""
    for pkg in variant.pip + extra_pip:
        if PACKAGE.fullmatch(pkg) is None:
            raise ValueError(f"invalid package specifier {pkg!r}")
    labels = {IMAGE_LABEL: variant.id, "org.modak.framework": variant.framework,
              "org.modak.framework-version": variant.version,
              "org.modak.flavour": variant.flavour, "org.modak.arch": variant.arch,
              "org.modak.min-microarch": variant.min_microarch}
    run_lines = [line for line in [_apt_line(variant.system_packages, ca_certs)] if line]
    install: list[str] = []
    env: dict[str, str] = {}
    python = "python3"
    if variant.venv:
        install.append(f"python3 -m venv {VENV}")
        python = f"{VENV}/bin/python3"
        env["PATH"] = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    pip = f"{python} -m pip install --no-cache-dir"
    if variant.wheelhouse:
        pip += " --no-index --find-links /opt/modak-wheels"
    packages = list(variant.pip) + list(extra_pip)
    if packages:
        install.append(f"{pip} " + " ".join(shlex.quote(p) for p in packages))
    if variant.source_build:
        flags, used = target_flags(microarch, "gcc", variant.gcc_version)
        labels["org.modak.target-microarch"] = used
        labels["org.modak.cflags"] = flags
        sb = variant.source_build
        build_env = f"CFLAGS={shlex.quote(flags)} CXXFLAGS={shlex.quote(flags)}"
        if cuda_arch:
            build_env += f" TORCH_CUDA_ARCH_LIST={shlex.quote(cuda_arch)}"
        install.append(f"{build_env} {pip} --no-binary {shlex.quote(sb.package)} "
                       f"{shlex.quote(sb.package + '==' + sb.version)}")
    if variant.wheelhouse:
        # not under /tmp: Charliecloud's RUN sees the host's /tmp, not the image's
        install.append("rm -rf /opt/modak-wheels")
    return RecipeSpec(variant=variant.id, base=base, bootstrap=variant.bootstrap, labels=labels,
                      run_lines=tuple(run_lines), install_lines=tuple(install), env=env,
                      wheelhouse=variant.wheelhouse, ca_certs=ca_certs,
                      mount_points=tuple(mount_points))


def render_recipe(fmt: str, spec: RecipeSpec) -> str:
    template, _ = RECIPE_FORMATS[fmt]
    return render(template, r=spec)


def content_hash(text: str, extra: dict[str, Any] | None = None) -> str:
    h = hashlib.sha256(text.encode())
    if extra:
        h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------
# job scripts
def render_job_script(*, directives: list[str], exports: dict[str, str], launch: str,
                      source: str, chosen: str, decided_by: str, run_id: str,
                      job_id_vars: tuple[str, ...] = (), submit_dir_vars: tuple[str, ...] = (),
                      app_digest: str = "", stop: str | None = None, probe: str = "",
                      rendezvous: bool = False, data: tuple[tuple[str, str], ...] = ()
                      ) -> str:
    """``job_id_vars``/``submit_dir_vars``: the scheduler's variables naming the job and the
    directory it was submitted from (the first set wins), where it has them: a job that has
    them prints its id first (``{"modak": "job-start", ...}``, what the job control finds a
    job by when its record was lost); ``probe``: the command that measures the target first
    (empty: its figures are known); ``rendezvous``: the job sets where a PyTorch job's ranks
    meet (``MASTER_ADDR``: this node, the job's first; ``MASTER_PORT``: from the job's
    number), unless its environment does; ``data``: the data the application reads
    (checked absolute paths, each with the request's field that names it), which the job
    checks is on its node before it starts."""
    return render("jobs/job.sh.j2", directives=directives, exports=exports, launch=launch,
                  source=source, chosen=chosen, decided_by=decided_by, run_id=run_id,
                  job_id=_first_set(job_id_vars, "$$"),
                  started_as=_first_set(job_id_vars, "") if job_id_vars else None,
                  submit_dir=_first_set(submit_dir_vars, "$PWD") if submit_dir_vars else None,
                  app_digest=app_digest, stop=stop, probe=probe, rendezvous=rendezvous,
                  data=data,
                  # (the runtime's port where no job script gives one: the same in both)
                  port_base=PORT_BASE, port_span=PORT_SPAN)


def _first_set(names: tuple[str, ...], otherwise: str) -> str:
    """``${A:-${B:-otherwise}}`` (the names are the scheduler's own, checked here)."""
    expr = otherwise
    for name in reversed(names):
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ValueError(f"not a variable name: {name!r}")
        expr = f"${{{name}:-{expr}}}"
    return expr
