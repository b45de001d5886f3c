"""From a request to a plan and its files: decide, then render.

``make_plan`` is what ``modak plan`` and the Ansible action plugin call.  It
returns the :class:`Plan` and the text of every file to write; writing them is
the caller's business.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from . import __version__, workload
from .catalogue import Catalogue, Variant, load_catalogue
from .errors import InputError
from .models import Configuration, Framework, ImageInfo, JobRequest, Launcher, Plan, Target
from .readers.common import validate
from .readers.infra import merge_target
from .planner import Decision, Predictor, decide
from .render import RECIPE_FORMATS, content_hash, recipe_spec, render_job_script, render_recipe
from .runs import new_run_id
from .runtimes import RUNTIMES
from .schedulers import SCHEDULERS
from .shell import Word, join

JOB_SCRIPT = "job.sh"
RUNTIME_MODULE = "modak_runtime"  # shipped into the run directory next to the job script
PROBE_SECONDS = 6  # the in-job probe of a target whose figures are unknown (about 8 s in all)


def probe_needed(target) -> bool:
    """Whether the job should measure its target first: neither its infrastructure file
    nor an earlier probe gave its GFLOP/s and bandwidth."""
    from .perf.probe import target_figures
    figures = target_figures(target)
    return not (figures.get("gflops_fp32") and figures.get("bandwidth_gbs"))
FORMAT_RUNTIME = {"apptainer": "apptainer", "containerfile": "podman",
                  "charliecloud": "charliecloud"}


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    files: dict[str, str]  # file name -> text, including plan.json
    decision: Decision


def option_environment(cfg: Configuration, variant: Variant, request: JobRequest,
                       cat: Catalogue) -> dict[str, str]:
    """Environment variables that carry the chosen configuration to the workload."""
    opts = cat.options
    fw = request.application.framework.value
    specific = f"{fw}@{variant.accelerator}"
    env: dict[str, str] = {}

    def add(tables: dict[str, dict[str, str]], **values: object) -> None:
        # "all" always applies; "FRAMEWORK@ACCELERATOR" replaces "FRAMEWORK"
        for name in ("all", specific if specific in tables else fw):
            for key, value in tables.get(name, {}).items():
                env[key] = value.format(**values)

    add(opts.threads, threads=cfg.threads)
    if cfg.compiler_kind:
        add(opts.compilers.get(cfg.compiler_kind.value, {}), mode=cfg.compiler_mode or "default")
    if cfg.allocator.value != "glibc":
        add(opts.allocator, path=variant.allocators[cfg.allocator], allocator=cfg.allocator.value)
        env.update(opts.allocator_settings.get(cfg.allocator.value, {}))
    add(opts.precision, precision=cfg.precision.value)
    if request.application.keras_backend:
        add(opts.keras_backend, backend=request.application.keras_backend)
    return env


def _launcher_words(launcher: Launcher, ranks: int, per_node: int) -> list[Word]:
    if launcher == Launcher.srun:
        return ["srun"]
    if launcher == Launcher.mpirun:
        # -n: Open MPI's, MPICH's and Intel MPI's mpirun take it (and -np), and so does
        # Torque's mpiexec over Slurm (which takes no -np)
        return ["mpirun", "-n", str(ranks)]
    if launcher == Launcher.torchrun:
        # --no-python and --: the program (python3) is the first word after torchrun's own
        # options, so that none of the user's words can be read as one of them
        return ["torchrun", "--standalone", f"--nproc-per-node={per_node}", "--no-python", "--"]
    return []


# what a scheduler's launcher sets in the environment of each rank it starts (the runtime
# reads a rank's place from them, and gives it torchrun's variables: launched.py), which a
# container must be given; a name ending in * stands for every name that starts so.  (A
# PBS or LSF site's mpirun may be Open MPI's, MPICH's or one over srun.)
RANK_VARIABLES: dict[Launcher, tuple[str, ...]] = {
    Launcher.srun: ("SLURM_*",),
    Launcher.mpirun: ("OMPI_*", "PMIX_*", "PMI_*", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                      "SLURM_*"),
}
# where the ranks of a PyTorch job meet (torchrun's env:// rendezvous): the job script sets
# them where its launcher is mpirun (the runtime finds them itself in a Slurm step)
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")


def with_target(request: JobRequest, overrides: dict[str, Any]) -> JobRequest:
    """The request on another target: ``overrides`` (e.g. an inventory's scheduler, runtime,
    front-end) replace the target's fields, validated like an infrastructure file."""
    if not overrides:
        return request
    base = request.target.model_dump(exclude_none=True)
    target = validate(Target, merge_target(base, overrides), "target overrides")
    return request.model_copy(update={"target": target})


def default_run_id(script_without_id: str) -> str:
    return "r" + hashlib.sha256(script_without_id.encode()).hexdigest()[:11]


def make_plan(request: JobRequest, predictor: Optional[Predictor] = None, *,
              run_id: Optional[str] = None, ca_certs: bool = False,
              catalogue: Optional[Catalogue] = None,
              force: Optional[Configuration] = None,
              app_files: tuple[str, ...] = (), app_digest: str = "",
              new_run: bool = False) -> PlanResult:
    """Decide and render; ``app_files`` (read by ``readers.appfiles``) are recorded in the
    plan as what the run directory receives, and their digest in the job script (so that
    an edited script is a new run).  ``new_run``: the run id (given or the default) with the
    time appended (runs.new_run_id), so that the same request is submitted again."""
    cat = catalogue or load_catalogue()
    try:
        decision = decide(request, predictor, cat, force=force)
    except InputError as exc:  # found while deciding: still the request's file
        raise exc.with_source(request.source) from None
    cfg, res = decision.chosen, decision.resources
    variant = cat.variant(cfg.image)
    target = request.target
    runtime = RUNTIMES[decision.runtime.value]
    scheduler = SCHEDULERS[target.scheduler]
    dataset = request.application.dataset
    data = request.application.data  # the host paths the job's container binds

    # recipes: one description, every format
    cuda_arch = None
    if target.accelerators and target.accelerators.model in cat.gpus:
        cuda_arch = cat.gpus[target.accelerators.model].cuda_arch
    files: dict[str, str] = {}
    hashes: dict[str, str] = {}
    recipe_files: dict[str, str] = {}
    for fmt, (_, filename) in RECIPE_FORMATS.items():
        fmt_runtime = RUNTIMES[FORMAT_RUNTIME[fmt]]
        spec = recipe_spec(variant, target.microarchitecture,
                           fmt_runtime.base_reference(variant.base), ca_certs=ca_certs,
                           cuda_arch=cuda_arch, extra_pip=request.application.pip_packages,
                           mount_points=fmt_runtime.mount_points(data))
        text = render_recipe(fmt, spec)
        files[filename] = text
        recipe_files[fmt] = filename
        hashes[fmt] = content_hash(text, {"wheelhouse": spec.wheelhouse})
    fmt = runtime.recipe_format or "containerfile"
    digest = hashes[fmt]
    name, tag = f"modak/{variant.id}", digest[:12]
    reference = runtime.image_reference(name, tag, target.image_dir)

    # environment: MODAK's choices, then what the user set explicitly (the user wins)
    app = request.application
    env = option_environment(cfg, variant, request, cat)
    env.update(MODAK_WORKLOAD=workload.label(app), MODAK_WORKLOAD_KEY=workload.key(app))
    if dataset:
        env["MODAK_DATASET"] = dataset
    env.update(request.environment)

    ranks = res.nodes * res.tasks_per_node
    # the ranks a scheduler's launcher starts, each a container of its own, get what the
    # launcher sets for each (and where a PyTorch job's ranks meet)
    passed: tuple[str, ...] = ()
    rendezvous = False
    if ranks > 1 and decision.launcher in RANK_VARIABLES:
        rendezvous = (decision.launcher == Launcher.mpirun
                      and app.framework == Framework.pytorch)
        passed = RANK_VARIABLES[decision.launcher] + tuple(
            name for name in RENDEZVOUS_VARIABLES if name not in env)
    words: list[Word] = _launcher_words(decision.launcher, ranks, res.tasks_per_node)
    words += runtime.launch(reference, env, res.gpus_per_node, passed, data)
    words += _launcher_words(decision.inner_launcher, ranks, res.tasks_per_node)
    # the program (a checked path that never starts with "-"): every launcher and runtime
    # (srun, mpirun, podman run IMAGE, apptainer exec IMAGE, ch-run IMAGE --) stops reading
    # its own options at it, so the user's words after it are the program's
    words.append(app.executable)
    if workload.wrappable(app):
        # the runtime applies the knobs to the unmodified script and measures it
        words += ["-m", RUNTIME_MODULE, "--"]
    if app.script:
        words.append(app.script)
    words += list(app.arguments)

    # a target whose figures are unknown is probed once, by the job, in its image
    probe = ""
    if workload.wrappable(app) and probe_needed(target):
        probe = join(runtime.launch(reference, {}, res.gpus_per_node)
                     + [app.executable, "-m", f"{RUNTIME_MODULE}.probe", "--seconds",
                        str(PROBE_SECONDS)])

    chosen_label = cfg.label()

    def script_for(rid: str) -> str:
        return render_job_script(
            directives=scheduler.directives(request.job, res, run_id=rid),
            exports=runtime.exports(env),
            launch=join(words), source=request.source.rsplit("/", 1)[-1], chosen=chosen_label,
            decided_by=decision.decided_by, run_id=rid, app_digest=app_digest,
            job_id_vars=scheduler.job_id_vars, submit_dir_vars=scheduler.submit_dir_vars,
            stop=runtime.stop(), probe=probe, rendezvous=rendezvous,
            data=tuple((path, "application.dataset" if path == dataset
                        else "application.data_paths") for path in data))

    # the default run id is the script's own hash: the same script is the same run (never
    # submitted twice); anything that changes the script (another image, another choice)
    # makes a new run
    run_id = run_id or default_run_id(script_for(""))
    if new_run:
        run_id = new_run_id(run_id)
    script = script_for(run_id)
    files[JOB_SCRIPT] = script

    image = ImageInfo(variant=variant.id, name=name, tag=tag, reference=reference,
                      base=variant.base, flavour=variant.flavour,
                      recipe_file=recipe_files[fmt], recipes=recipe_files,
                      content_hash=digest, wheelhouse=variant.wheelhouse, ca_certs=ca_certs,
                      pip_packages=tuple(map(str, request.application.pip_packages)),
                      builder=runtime.builder(wheelhouse=variant.wheelhouse),
                      score_breakdown=decision.match.breakdown)
    plan = Plan(request=request.source, modak_version=__version__, chosen=cfg,
                candidates=decision.candidates, decided_by=decision.decided_by, image=image,
                scheduler=target.scheduler, runtime=decision.runtime,
                launcher=decision.launcher if decision.inner_launcher == Launcher.none
                else decision.inner_launcher,
                environment=env, job_script=JOB_SCRIPT,
                job_control=scheduler.job_control(),
                target=target, notes=decision.notes, run_id=run_id,
                run_name=f"{request.job.job_name}-{run_id}", stdout=res.stdout,
                stderr=res.stderr, walltime_s=res.walltime_s,
                steps=decision.known_steps, epochs=request.application.epochs,
                autotune=decision.autotune, search=decision.search,
                app_files=tuple(app_files), dataset=dataset,
                data_paths=request.application.data_paths,
                outputs=request.application.outputs)
    files["plan.json"] = json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"
    return PlanResult(plan=plan, files=files, decision=decision)
