"""Typed data that flows between MODAK's stages.

readers -> :class:`JobRequest`; planner -> a decision (ranked :class:`Candidate` s);
pipeline -> :class:`Plan` and the rendered recipes and job script.
Every model forbids unknown keys, so a typo is an error with its field path.
"""
from __future__ import annotations

from enum import Enum
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PositiveInt,
                      field_validator, model_validator)

from .validate import (DatasetPath, Email, EnvName, HostName, JobName, MailEvents, NodeFeature,
                       OutputPath, PackageSpec, QuotedText, RelPath, SafePath, SchedName,
                       UserName, WallTime, check)

COMPILER_MODE = re.compile(r"[a-z][a-z0-9-]{0,47}")


def Count(most: int) -> type:  # noqa: N802 (a type)
    """A positive count with an upper bound (named in the error), so that no number a user
    writes renders as is however large it is."""
    return Annotated[int, Field(ge=1, le=most)]  # type: ignore[return-value]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Framework(str, Enum):
    pytorch = "pytorch"
    tensorflow = "tensorflow"
    keras = "keras"
    mxnet = "mxnet"
    cntk = "cntk"
    none = "none"


def _scheduler(name: str) -> str:
    """A scheduler MODAK has a backend for (``schedulers.SCHEDULERS``), or one of its other
    names (``torque`` is ``pbs``, ``none`` is ``local``)."""
    from .schedulers import scheduler_name  # (the backends import these models)
    return scheduler_name(name)


# a scheduler's name, checked against the registry of backends (modak_lib/schedulers/)
SchedulerName = Annotated[str, AfterValidator(_scheduler)]


class Runtime(str, Enum):
    apptainer = "apptainer"
    podman = "podman"
    charliecloud = "charliecloud"
    none = "none"


class Launcher(str, Enum):
    none = "none"
    srun = "srun"
    mpirun = "mpirun"
    torchrun = "torchrun"


class Compiler(str, Enum):
    """Graph compilers MODAK can switch on (the seed paper's XLA, nGraph, Glow, ...)."""
    xla = "xla"
    torch_compile = "torch.compile"
    glow = "glow"
    ngraph = "ngraph"


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Allocator(str, Enum):
    glibc = "glibc"
    tcmalloc = "tcmalloc"
    jemalloc = "jemalloc"


# ---------------------------------------------------------------------------
# target (the system description: kept apart from the workload)
class Accelerator(Strict):
    vendor: Literal["nvidia", "amd", "fpga"] = Field(description="accelerator vendor")
    model: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_. -]{1,64}$",
                                 description="e.g. V100, A100, H100")
    count: Count(64) = Field(1, description="accelerators per node")


class Frontend(Strict):
    host: HostName = Field("127.0.0.1", description="SSH front-end address")
    port: int = Field(22, ge=1, le=65535)
    user: Optional[UserName] = None
    work_dir: SafePath = Field("modak-runs", description="work directory on the front-end "
                               "(relative paths are under the user's home)")


class Target(Strict):
    """The system a job runs on: a cluster behind an SSH front-end, or one host."""
    name: SchedName = "local"
    scheduler: SchedulerName = "local"
    frontend: Frontend = Frontend()
    partitions: tuple[SchedName, ...] = ()
    cores_per_node: Count(4096) = Field(1, description="physical cores a job may use per node")
    nodes: Optional[Count(100_000)] = Field(None, description="nodes a job may use (its "
                                            "partition's); unchecked when unset")
    memory_gb: Optional[float] = Field(None, gt=0, le=1_000_000)
    cpu_arch: Literal["x86_64", "aarch64", "ppc64le"] = "x86_64"
    microarchitecture: str = Field("x86_64", pattern=r"^[a-z0-9_]{1,32}$",
                                   description="archspec name, e.g. skylake_avx512, zen4")
    cpu_features: tuple[str, ...] = Field((), description="extra CPU flags, e.g. avx512_bf16")
    accelerators: Optional[Accelerator] = None
    container_runtime: Optional[Runtime] = Field(
        None, description="default: apptainer on a cluster, none on a local target")
    image_dir: SafePath = Field("modak-images", description="where images live on the front-end")
    max_build_hours: float = Field(1.0, gt=0, description="longest image build MODAK may start "
                                   "on the front-end (a framework source build takes hours)")
    peak_gflops: Optional[float] = Field(None, gt=0, description="fp32 matrix GFLOP/s of a "
                                         "node, as `modak probe` measures it")
    peak_gflops_bf16: Optional[float] = Field(None, gt=0, description="bf16 matrix GFLOP/s "
                                              "(about 4x fp32 with native bf16, far less "
                                              "without)")
    memory_bandwidth_gbs: Optional[float] = Field(None, gt=0, description="memory bandwidth "
                                                  "of a node, GB/s")


# ---------------------------------------------------------------------------
# the workload
class Build(Strict):
    src: QuotedText
    build_command: QuotedText
    build_parallelism: Count(1024) = 1


MAX_DATA_PATHS = 16  # application.data_paths: each is a bind and a check on the front-end


class Application(Strict):
    framework: Framework = Framework.none
    framework_version: Optional[str] = Field(
        None, pattern=r"^[0-9A-Za-z.*<>=!~, ]{1,64}$",
        description="version or specifier: '2.1' matches 2.1.x but never 2.10")
    keras_backend: Optional[Literal["tensorflow", "jax", "torch"]] = None
    executable: SafePath = "python3"
    script: Optional[RelPath] = None
    arguments: tuple[QuotedText, ...] = ()
    model: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    dataset: Optional[DatasetPath] = Field(
        None, description="the data the script reads, a directory (or file) on the target's "
        "nodes: an absolute path, bound into the container at that same path, read-only "
        "(Podman, Apptainer) or as the login may write (Charliecloud: a directory, which its "
        "image has); MODAK_DATASET names it; the job stops if a node lacks it")
    app_type: Literal["ai_training", "hpc"] = "ai_training"
    mpi_ranks: Count(1_000_000) = 1
    threads: Optional[Count(4096)] = None
    batch_size: Optional[Count(10_000_000)] = None
    steps: Optional[Count(10_000_000_000)] = Field(
        None, description="optimizer steps the job will run, if known: a compiler's warm-up "
        "is weighed against them (default: as many as the wall time holds)")
    epochs: Optional[Count(10_000_000)] = Field(
        None, description="epochs the job will run, if known, instead of its steps: as many "
        "steps as an epoch of the script makes, as its runs measured them (a pass over its "
        "training data loader or tf.data dataset, Keras fit's steps per epoch)")
    build: Optional[Build] = None
    user_image: Optional[str] = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,255}$",
        description="image the user named (old MODAK 'container_runtime')")
    pip_packages: tuple[PackageSpec, ...] = ()
    files: tuple[RelPath, ...] = Field(
        (), description="files or directories, relative to the request file, that the run "
        "directory receives with the script (default: the script's directory)")
    outputs: tuple[OutputPath, ...] = Field(
        (), description="files or directories the script writes in the run directory (its "
        "working directory), relative to it: after the job, completed or not, the deploy "
        "fetches them with the job's output (results/RUN/outputs/)")
    data_paths: tuple[DatasetPath, ...] = Field(
        (), max_length=MAX_DATA_PATHS, description="further data the script reads besides "
        "dataset (pretrained weights, a second dataset): absolute paths on the target's "
        "nodes, each bound into the container at its own path and checked as dataset is")

    @field_validator("framework_version", mode="after")
    @classmethod
    def _version(cls, value: Optional[str]) -> Optional[str]:
        """A version (2.13, 2.1.0) or a specifier (>=2.1,<3), checked where it is read so
        that the error names the file and the field."""
        if value is None or value.strip() in ("", "*", "latest"):
            return value
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
        text = value.strip()
        try:
            if text[0].isdigit() and not any(c in text for c in "<>=!~,"):
                Version(text)
            else:
                SpecifierSet(text)
        except (InvalidVersion, InvalidSpecifier):
            raise ValueError(f"invalid version {value!r}: a version such as 2.13 or a "
                             "specifier such as >=2.1,<3") from None
        return value

    @model_validator(mode="after")
    def _one_length(self) -> "Application":
        one_length(self.steps, self.epochs)
        return self

    @field_validator("data_paths", mode="after")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        seen = set()
        for path in value:
            if path.rstrip("/") in seen:
                raise ValueError(f"{path!r} is named twice")
            seen.add(path.rstrip("/"))
        return value

    @model_validator(mode="after")
    def _not_the_dataset(self) -> "Application":
        if self.dataset and self.dataset.rstrip("/") in {p.rstrip("/") for p in self.data_paths}:
            raise ValueError(f"data_paths names the dataset {self.dataset!r} again")
        return self

    @property
    def data(self) -> tuple[str, ...]:
        """Every path of the target's that the job reads: the dataset, then data_paths."""
        return ((self.dataset,) if self.dataset else ()) + self.data_paths


def one_length(steps: Optional[int], epochs: Optional[int]) -> None:
    """A job's length is stated once: in steps or in epochs (each reader checks it where its
    file states them, so that the error names that field)."""
    if steps and epochs:
        raise ValueError("steps and epochs both state the job's length: state one")


MAX_COMPILER_MODES = 8  # each mode multiplies the candidates
CompilerMode = Annotated[str, AfterValidator(
    lambda v: check(COMPILER_MODE, "torch.compile mode", v))]


class Optimisation(Strict):
    enable_opt_build: bool = True
    enable_autotuning: bool = False
    cpu_type: Optional[Literal["x86", "arm", "amd", "power"]] = None
    acc_type: Optional[Literal["nvidia", "amd", "fpga"]] = None
    compilers: tuple[Compiler, ...] = Field(
        (), description="graph compilers the user asks MODAK to consider")
    compiler_modes: tuple[CompilerMode, ...] = Field(
        (), max_length=MAX_COMPILER_MODES,
        description=f"torch.compile modes to consider (at most {MAX_COMPILER_MODES}; "
                    "repeats are dropped)")
    allow_reduced_precision: bool = False
    allocators: tuple[Allocator, ...] = Field(
        (), description="allocators to consider (default: every one the image provides)")

    @field_validator("compiler_modes", "compilers", "allocators", mode="after")
    @classmethod
    def _unique(cls, values: tuple) -> tuple:
        return tuple(dict.fromkeys(values))  # repeats dropped, order kept


class JobOptions(Strict):
    job_name: JobName = "modak-job"
    queue: Optional[SchedName] = None
    partition: Optional[SchedName] = None
    account: Optional[SchedName] = None
    wall_time_limit: Optional[WallTime] = None
    node_count: Count(100_000) = 1
    core_count: Optional[Count(10_000_000)] = None
    process_count_per_node: Count(4096) = 1
    request_gpus: Optional[int] = Field(None, ge=0, le=64)
    memory_gb: Optional[float] = Field(None, gt=0, le=1_000_000)
    standard_output_file: Optional[SafePath] = None
    standard_error_file: Optional[SafePath] = None
    combine_stdout_stderr: bool = True
    mail_events: MailEvents = ()
    email_address: Optional[Email] = None
    copy_environment: bool = False
    copy_environment_variable: tuple[EnvName, ...] = ()
    request_specific_nodes: Optional[NodeFeature] = None

    @model_validator(mode="after")
    def _consistent(self) -> "JobOptions":
        if self.mail_events and not self.email_address:
            raise ValueError("email_address is required when event notification is requested")
        if not self.combine_stdout_stderr and not self.standard_error_file:
            raise ValueError("standard_error_file is required unless combine_stdout_stderr is true")
        return self


class JobRequest(Strict):
    """What every reader produces: the same request from TOSCA or the MODAK DSL."""
    source: str = Field(description="file the request was read from")
    source_format: Literal["tosca", "modak-dsl"]
    job: JobOptions = JobOptions()
    application: Application = Application()
    optimisation: Optimisation = Optimisation()
    target: Target = Target()
    environment: dict[EnvName, QuotedText] = Field(default_factory=dict)


# ---------------------------------------------------------------------------
# the plan
def _compiler_id(value: str) -> str:
    kind, sep, mode = value.partition(":")
    if kind not in {c.value for c in Compiler} or (sep and kind != Compiler.torch_compile.value):
        raise ValueError(f"unknown graph compiler {value!r} (one of "
                         f"{', '.join(c.value for c in Compiler)}; torch.compile:MODE)")
    if sep:
        check(COMPILER_MODE, "torch.compile mode", mode)
    return value


# a compiler as plans, the results store and the runtime's variables write it: the kind, and
# for torch.compile its mode ("torch.compile:max-autotune"); read it through compiler_kind
# and compiler_mode, write it with compiler_id()
CompilerId = Annotated[str, AfterValidator(_compiler_id)]


def compiler_id(kind: Compiler, mode: Optional[str] = None) -> str:
    return f"{kind.value}:{mode}" if mode else kind.value


class Configuration(Strict):
    """One point of the optimisation space."""
    image: str = Field(description="catalogue variant id")
    compiler: Optional[CompilerId] = Field(None, description="graph compiler, off when null")
    threads: PositiveInt
    allocator: Allocator = Allocator.glibc
    precision: Precision = Precision.fp32

    @property
    def compiler_kind(self) -> Optional[Compiler]:
        return Compiler(self.compiler.partition(":")[0]) if self.compiler else None

    @property
    def compiler_mode(self) -> Optional[str]:
        """torch.compile's mode ("default" when the id names none); None for other kinds."""
        if self.compiler_kind != Compiler.torch_compile:
            return None
        return self.compiler.partition(":")[2] or "default"

    def label(self) -> str:
        return (f"{self.image} compiler={self.compiler or 'off'} threads={self.threads} "
                f"alloc={self.allocator.value} prec={self.precision.value}")


class StepLosses(Strict):
    """The losses of a configuration's runs that made ``steps`` optimizer steps (medians)."""
    steps: int
    loss: Optional[float] = Field(None, description="the loss they ended with")
    end_loss: Optional[float] = Field(None, description="their mean loss over their second "
                                      "half")
    start_loss: Optional[float] = Field(None, description="their first sampled loss")


class Prediction(Strict):
    seconds: float
    low: float
    high: float
    source: str = Field(description="what made the prediction (model id, measurements)")
    measured: bool = Field(False, description="the median of this configuration's own runs "
                           "(not a model's estimate)")
    warmup_s: Optional[float] = Field(None, description="measured: the warm-up's excess "
                                      "(compilation), paid once per job")
    compiling_s: Optional[float] = Field(None, description="how long a trial of this workload "
                                         "with this compiler here ran before its time cap "
                                         "stopped it still compiling (the compilation takes "
                                         "at least that): a search does not cap it shorter")
    loss: Optional[float] = Field(None, description="measured: the median loss its runs "
                                  "ended with (compared with stock's after the same steps "
                                  "where either has no end_loss)")
    end_loss: Optional[float] = Field(None, description="measured: the median of its runs' "
                                      "mean losses over their second half (compared with "
                                      "stock's after the same steps)")
    start_loss: Optional[float] = Field(None, description="measured: the median of its runs' "
                                        "first sampled losses (how far stock's run lowered "
                                        "its loss sets the scale of the comparison)")
    steps: Optional[int] = Field(None, description="measured: the steps its runs made")
    rounds: Optional[int] = Field(None, description="measured beside stock: the interleaved "
                                  "rounds the two ran side by side (its gain over them must "
                                  "be more than the trials' scatter)")
    losses: list[StepLosses] = Field(default_factory=list, description="measured: its runs' "
                                     "losses by the steps they made, each compared with "
                                     "stock's after as many (where empty: loss, end_loss "
                                     "and start_loss after steps)")


class Candidate(Strict):
    configuration: Configuration
    rank: int
    score: float = Field(description="prior score (higher is better); used without predictions")
    prediction: Optional[Prediction] = None
    reason: str = Field(description="why it was chosen, or why it lost")


class ImageInfo(Strict):
    variant: str
    name: str
    tag: str
    reference: str = Field(description="how the runtime refers to the built image")
    base: str
    flavour: str
    recipe_file: str = Field(description="the recipe the chosen runtime builds")
    recipes: dict[str, str] = Field(description="format -> file name")
    content_hash: str
    wheelhouse: bool = Field(description="the recipe installs Python packages from ./wheels")
    pip_packages: tuple[str, ...] = Field(
        (), description="the request's pip_packages, which the recipe installs besides the "
        "image's own (a wheelhouse must hold them too)")
    ca_certs: bool = Field(description="the recipe copies ./certs into the image")
    builder: Optional[dict[str, Any]] = Field(
        None, description="what the front-end runs to build, find and remove the image (the "
        "runtime backend's data, for modak_image); null without a container")
    score_breakdown: tuple[tuple[str, float], ...]


class Plan(Strict):
    request: str
    modak_version: str
    chosen: Configuration
    candidates: tuple[Candidate, ...]
    decided_by: Literal["prior", "model", "autotune"]
    image: ImageInfo
    scheduler: SchedulerName
    runtime: Runtime
    launcher: Launcher
    environment: dict[str, str]
    job_script: str
    job_control: dict[str, Any] = Field(
        description="what the front-end runs to submit, query and cancel the job, and how it "
        "reads the answers (the scheduler backend's data, for modak_jobctl)")
    target: Target
    run_id: str
    run_name: str = Field(description="the run directory's name on the front-end "
                          "(JOB_NAME-RUN_ID, under the deployment's work directory)")
    stdout: str = Field(description="the job's output file, in the run directory")
    stderr: Optional[str] = Field(None, description="its error file; null: in stdout")
    walltime_s: Optional[int] = Field(None, description="the job's wall-time limit")
    steps: Optional[int] = Field(None, description="the optimizer steps the job will run: "
                                 "as the application states (its ``steps``), else "
                                 "its ``epochs`` times the steps an epoch makes as measured; "
                                 "else as its last full run under the same script and "
                                 "arguments made; null: none of these")
    epochs: Optional[int] = Field(None, description="the epochs the application states (a "
                                  "search whose plan knows no steps takes the job's length "
                                  "from the steps an epoch made in stock's trial)")
    autotune: tuple[Configuration, ...] = Field(
        (), description="candidates a short autotuning trial should measure")
    search: bool = Field(
        False, description="the deploy runs the budgeted search over ``autotune`` before the "
        "job: autotuning is enabled and the model cannot settle the choice (a workload or "
        "target it cannot speak for, or top candidates within its uncertainty)")
    app_files: tuple[str, ...] = Field(
        (), description="the user's files the run directory receives (with modak_runtime/)")
    dataset: Optional[str] = Field(
        None, description="the data the application reads on the target's nodes "
        "(application.dataset), bound into the container at that path; the "
        "deploy checks the front-end has it before it stages anything")
    outputs: tuple[str, ...] = Field(
        (), description="what the deploy fetches from the run directory after the job "
        "(application.outputs)")
    data_paths: tuple[str, ...] = Field(
        (), description="further data the application reads on the target's nodes "
        "(application.data_paths), bound and checked as the dataset is")
    notes: tuple[str, ...] = ()
