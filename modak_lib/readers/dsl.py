"""The MODAK optimisation DSL: the JSON document ``{"job": {...}}`` SODALITE users have.

The old service accepted only the TensorFlow and MPI branches; every branch
below is accepted.  Keys marked "MODAK extension" are new; every other key is
the old DSL's.  Unknown keys are errors with their path.
"""
from __future__ import annotations

import shlex
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from ..errors import InputError
from ..models import (Allocator, Build, Compiler, Framework, JobRequest, SchedulerName, Target,
                      one_length)
from ..validate import DatasetPath, EnvName, MailEvents, WallTime
from .common import validate


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class DslJobOptions(_M):
    job_name: str = "modak-job"
    queue: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = Field(None, description="MODAK extension")
    wall_time_limit: Optional[WallTime] = None
    node_count: PositiveInt = 1
    core_count: Optional[PositiveInt] = None
    process_count_per_node: PositiveInt = 1
    request_gpus: Optional[int] = Field(None, ge=0)
    memory_gb: Optional[float] = Field(None, gt=0, description="MODAK extension")
    standard_output_file: Optional[str] = None
    standard_error_file: Optional[str] = None
    combine_stdout_stderr: bool = True
    request_event_notification: MailEvents = ()
    email_address: Optional[str] = None
    copy_environment: bool = False
    copy_environment_variable: Union[list[EnvName], EnvName, None] = None
    request_specific_nodes: Optional[str] = None


class DslTarget(_M):
    job_scheduler_type: Optional[SchedulerName] = None
    name: Optional[str] = None


class DslBuild(_M):
    src: str
    build_command: str
    build_parallelism: PositiveInt = 1


class DslApplication(_M):
    app_tag: Optional[str] = None
    app_type: Optional[Literal["python", "mpi", "hpc", "ai_training"]] = None
    executable: str = "python3"
    arguments: Union[str, list[str], None] = None
    container_runtime: Optional[str] = Field(
        None, description="a runtime name (apptainer, singularity, podman, docker, charliecloud, "
        "none) or, as in the old service, an image reference")
    mpi_ranks: PositiveInt = 1
    threads: Optional[PositiveInt] = None
    build: Optional[DslBuild] = None
    files: list[str] = []  # MODAK extension: what the run directory receives
    outputs: list[str] = []  # MODAK extension: what the deploy fetches back
    data_paths: list[str] = []  # MODAK extension: further data the job reads


class DslOptBuild(_M):
    cpu_type: Optional[Literal["x86", "arm", "amd", "power"]] = None
    acc_type: Optional[Literal["nvidia", "amd", "fpga"]] = None


class DslTensorflow(_M):
    version: Optional[str] = None
    xla: bool = False
    ngraph: bool = False


class DslPytorch(_M):
    version: Optional[str] = None
    glow: bool = False
    compile: Union[bool, list[str]] = Field(
        False, description="MODAK extension: consider torch.compile (true, or a list of modes)")


class DslKeras(_M):
    version: Optional[str] = None
    backend: Optional[Literal["tensorflow", "jax", "torch"]] = None
    jit_compile: bool = Field(False, description="MODAK extension: consider XLA (jit_compile)")


class DslVersionOnly(_M):
    version: Optional[str] = None


class DslAiConfig(_M):
    ai_framework: Literal["tensorflow", "pytorch", "keras", "mxnet", "cntk"]
    type: Optional[Literal["image_classification", "object_detection", "translation",
                           "recommendation", "reinforcement_learning"]] = None
    distributed_training: bool = False
    layers: Optional[PositiveInt] = None
    parameters: Optional[PositiveInt] = None
    model: Optional[str] = Field(None, description="MODAK extension: model name (mnist-cnn)")
    batch_size: Optional[PositiveInt] = Field(None, description="MODAK extension")
    steps: Optional[int] = Field(
        None, gt=0, le=10_000_000_000, description="MODAK extension: the optimizer steps the "
        "job runs (a compiler's warm-up and a search's budget are weighed against them)")
    epochs: Optional[int] = Field(
        None, gt=0, le=10_000_000, description="MODAK extension: the epochs the job runs, "
        "instead of its steps (as many steps as an epoch of the script makes, as measured)")
    allow_reduced_precision: bool = Field(False, description="MODAK extension: allow bf16")

    @model_validator(mode="after")
    def _one_length(self) -> "DslAiConfig":
        one_length(self.steps, self.epochs)  # (named here, where the file states them)
        return self


class DslEtl(_M):
    prefetch: Optional[PositiveInt] = None
    cache: bool = False


class DslAiData(_M):
    location: Optional[DatasetPath] = None  # (application.dataset)
    basedata: Optional[Literal["imagenet", "cifar", "mnist", "custom"]] = None
    size: Optional[Literal["small", "medium", "large"]] = None
    count: Optional[PositiveInt] = None
    etl: Optional[DslEtl] = None


class DslAiTraining(_M):
    config: DslAiConfig
    data: DslAiData = DslAiData()
    tensorflow: Optional[DslTensorflow] = Field(None, alias="ai_framework-tensorflow")
    pytorch: Optional[DslPytorch] = Field(None, alias="ai_framework-pytorch")
    keras: Optional[DslKeras] = Field(None, alias="ai_framework-keras")
    mxnet: Optional[DslVersionOnly] = Field(None, alias="ai_framework-mxnet")
    cntk: Optional[DslVersionOnly] = Field(None, alias="ai_framework-cntk")

    @model_validator(mode="after")
    def _section_for_framework(self) -> "DslAiTraining":
        fw = self.config.ai_framework
        if getattr(self, fw) is None:
            raise ValueError(f"section 'ai_framework-{fw}' is required for ai_framework '{fw}'")
        for other in ("tensorflow", "pytorch", "keras", "mxnet", "cntk"):
            if other != fw and getattr(self, other) is not None:
                raise ValueError(f"section 'ai_framework-{other}' does not match "
                                 f"ai_framework '{fw}'")
        return self


class DslHpcConfig(_M):
    parallelisation: Literal["mpi", "openmp", "opencc", "opencl"]


class DslMpi(_M):
    library: str
    version: str


class DslHpc(_M):
    config: DslHpcConfig
    data: dict[str, Any] = {}
    mpi: Optional[DslMpi] = Field(None, alias="parallelisation-mpi")

    @model_validator(mode="after")
    def _mpi_section(self) -> "DslHpc":
        if self.config.parallelisation == "mpi" and self.mpi is None:
            raise ValueError("section 'parallelisation-mpi' is required for parallelisation 'mpi'")
        return self


class DslAutotuning(_M):
    tuner: str
    input: str


class DslOptimisation(_M):
    enable_opt_build: bool = True
    enable_autotuning: bool = False
    app_type: Literal["ai_training", "hpc"]
    opt_build: Optional[DslOptBuild] = None
    ai_training: Optional[DslAiTraining] = Field(None, alias="app_type-ai_training")
    hpc: Optional[DslHpc] = Field(None, alias="app_type-hpc")
    autotuning: Optional[DslAutotuning] = None
    allocators: list[Allocator] = Field([], description="MODAK extension")

    @model_validator(mode="after")
    def _section_for_app_type(self) -> "DslOptimisation":
        if getattr(self, self.app_type) is None:
            raise ValueError(f"section 'app_type-{self.app_type}' is required for "
                             f"app_type '{self.app_type}'")
        if self.ai_training is not None and self.hpc is not None:
            raise ValueError("'app_type-ai_training' and 'app_type-hpc' are mutually exclusive")
        return self


class DslJob(_M):
    job_options: DslJobOptions = DslJobOptions()
    target: Optional[DslTarget] = None
    application: DslApplication = DslApplication()
    optimisation: Optional[DslOptimisation] = None
    environment: dict[EnvName, str] = Field({}, description="MODAK extension")


class DslDocument(_M):
    """A MODAK optimisation-DSL request."""
    model_config = ConfigDict(extra="forbid", title="MODAK optimisation DSL")
    job: DslJob


_RUNTIME_NAMES = {"apptainer": "apptainer", "singularity": "apptainer", "podman": "podman",
                  "docker": "podman", "charliecloud": "charliecloud", "none": "none"}


def _split(text: str, where: str, source: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise InputError([(where, f"cannot split into words: {exc}")], source) from None


def read_dsl(data: Any, source: str, base_target: Target | None = None) -> JobRequest:
    doc = validate(DslDocument, data, source)
    job = doc.job
    app, opt = job.application, job.optimisation

    # executable: the old service took "python3 train.py" as one string
    words = _split(app.executable, "job.application.executable", source)
    if not words:
        raise InputError([("job.application.executable", "must not be empty")], source)
    executable, script, rest = words[0], None, words[1:]
    if rest and not rest[0].startswith("-"):
        script, rest = rest[0], rest[1:]
    if isinstance(app.arguments, str):
        rest += _split(app.arguments, "job.application.arguments", source)
    elif app.arguments:
        rest += app.arguments

    runtime, user_image = None, None
    if app.container_runtime:
        name = app.container_runtime.strip()
        if name.lower() in _RUNTIME_NAMES:
            runtime = _RUNTIME_NAMES[name.lower()]
        else:  # an image reference, as the old service used it
            user_image = name.split("://", 1)[-1]

    fw, fw_version, keras_backend, compilers, modes = Framework.none, None, None, [], []
    model = batch = steps = epochs = dataset = None
    reduced = False
    if opt is not None and opt.ai_training is not None:
        ai = opt.ai_training
        dataset = ai.data.location
        fw = Framework(ai.config.ai_framework)
        section = getattr(ai, ai.config.ai_framework)
        fw_version = section.version
        model, batch, reduced = ai.config.model, ai.config.batch_size, ai.config.allow_reduced_precision
        steps, epochs = ai.config.steps, ai.config.epochs
        if isinstance(section, DslTensorflow):
            compilers += [Compiler.xla] if section.xla else []
            compilers += [Compiler.ngraph] if section.ngraph else []
        elif isinstance(section, DslPytorch):
            compilers += [Compiler.glow] if section.glow else []
            if section.compile:
                compilers.append(Compiler.torch_compile)
                modes = section.compile if isinstance(section.compile, list) else []
        elif isinstance(section, DslKeras):
            keras_backend = section.backend
            compilers += [Compiler.xla] if section.jit_compile else []

    target = base_target or Target()
    changes: dict[str, Any] = {}
    jo = job.job_options
    if base_target is None:
        # no infrastructure file: the request's own numbers are all we know of the nodes
        per_node = -(-(jo.core_count or 1) // jo.node_count)
        changes["cores_per_node"] = max(per_node, jo.process_count_per_node * (app.threads or 1))
        if jo.request_gpus:
            changes["accelerators"] = {"vendor": (opt.opt_build.acc_type if opt and opt.opt_build
                                                  and opt.opt_build.acc_type else "nvidia"),
                                       "count": jo.request_gpus}
    if job.target is not None:
        if job.target.job_scheduler_type:
            changes["scheduler"] = job.target.job_scheduler_type
        if job.target.name:
            changes["name"] = job.target.name
    if runtime:
        changes["container_runtime"] = runtime
    if opt is not None and opt.opt_build is not None:
        if opt.opt_build.acc_type and target.accelerators is None and "accelerators" not in changes:
            changes["accelerators"] = {"vendor": opt.opt_build.acc_type, "count": 1}
        if opt.opt_build.cpu_type in ("arm",) and target.cpu_arch == "x86_64":
            changes["cpu_arch"], changes["microarchitecture"] = "aarch64", "aarch64"
        if opt.opt_build.cpu_type == "power" and target.cpu_arch == "x86_64":
            changes["cpu_arch"], changes["microarchitecture"] = "ppc64le", "ppc64le"
    target_data = {**target.model_dump(exclude_none=True), **changes}

    copy_vars = jo.copy_environment_variable
    request = {
        "source": source,
        "source_format": "modak-dsl",
        "job": {
            "job_name": jo.job_name, "queue": jo.queue, "partition": jo.partition,
            "account": jo.account, "wall_time_limit": jo.wall_time_limit,
            "node_count": jo.node_count, "core_count": jo.core_count,
            "process_count_per_node": jo.process_count_per_node,
            "request_gpus": jo.request_gpus, "memory_gb": jo.memory_gb,
            "standard_output_file": jo.standard_output_file,
            "standard_error_file": jo.standard_error_file,
            "combine_stdout_stderr": jo.combine_stdout_stderr,
            "mail_events": jo.request_event_notification, "email_address": jo.email_address,
            "copy_environment": jo.copy_environment,
            "copy_environment_variable": ([copy_vars] if isinstance(copy_vars, str)
                                          else copy_vars or []),
            "request_specific_nodes": jo.request_specific_nodes,
        },
        "application": {
            "framework": fw, "framework_version": fw_version, "keras_backend": keras_backend,
            "executable": executable, "script": script, "arguments": rest,
            "model": model, "batch_size": batch, "steps": steps,
            "epochs": epochs,
            "app_type": opt.app_type if opt else "ai_training",
            "mpi_ranks": app.mpi_ranks, "threads": app.threads,
            "build": Build(**app.build.model_dump()) if app.build else None,
            "user_image": user_image, "files": app.files, "outputs": app.outputs,
            "dataset": dataset, "data_paths": app.data_paths,
        },
        "optimisation": {
            "enable_opt_build": opt.enable_opt_build if opt else False,
            "enable_autotuning": opt.enable_autotuning if opt else False,
            "cpu_type": opt.opt_build.cpu_type if opt and opt.opt_build else None,
            "acc_type": opt.opt_build.acc_type if opt and opt.opt_build else None,
            "compilers": compilers, "compiler_modes": modes,
            "allow_reduced_precision": reduced,
            "allocators": opt.allocators if opt else [],
        },
        "target": target_data,
        "environment": job.environment,
    }
    req = _to_request(request, source)
    return req


# where each JobRequest field came from in the DSL, for error messages
_DSL_PATHS = {
    "job.job_name": "job.job_options.job_name",
    "job.mail_events": "job.job_options.request_event_notification",
    "job": "job.job_options",
    "application.executable": "job.application.executable",
    "application.script": "job.application.executable",
    "application.arguments": "job.application.arguments",
    "application.user_image": "job.application.container_runtime",
    "application.dataset": "job.optimisation.app_type-ai_training.data.location",
    "application.framework_version": "job.optimisation.app_type-ai_training.ai_framework-*.version",
    "application": "job.application",
    "optimisation": "job.optimisation",
    "target": "job.target",
    "environment": "job.environment",
}


def _to_request(data: dict[str, Any], source: str) -> JobRequest:
    try:
        return validate(JobRequest, data, source)
    except InputError as exc:
        raise InputError([(_dsl_path(p), m) for p, m in exc.problems], source) from None


def _dsl_path(path: str) -> str:
    """Translate a JobRequest field path back to the DSL key the user wrote."""
    for internal, dsl in _DSL_PATHS.items():
        if path == internal:
            return dsl
        if path.startswith((internal + ".", internal + "[")):
            return dsl + path[len(internal):]
    return path
