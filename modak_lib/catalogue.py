"""The image catalogue (``data/catalogue.yaml``) and typed image selection.

Selection never matches strings: versions compare as versions (a request for
``2.1`` matches 2.1.x and never 2.10), CPU compatibility comes from archspec's
microarchitecture graph, and the best variant is chosen by an explicit score
whose breakdown the plan reports.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .errors import CatalogueError, InputError, NoMatchingImage
from .models import Allocator, Compiler, JobRequest, Precision
from .validate import IMAGE_NAME, IMAGE_TAG

DATA = Path(__file__).parent / "data" / "catalogue.yaml"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceBuild(_M):
    package: str
    version: str


class Variant(_M):
    id: str
    framework: Literal["pytorch", "tensorflow", "keras", "mxnet", "cntk"]
    version: str
    arch: Literal["x86_64", "aarch64", "ppc64le"]
    min_microarch: str
    accelerator: Literal["none", "nvidia", "amd"] = "none"
    cuda_archs: tuple[str, ...] = ()
    flavour: Literal["pip", "source", "vendor"]
    compilers: tuple[Compiler, ...] = ()
    backends: tuple[str, ...] = ()
    allocators: dict[Allocator, str] = {}
    precisions: tuple[Precision, ...] = (Precision.fp32,)
    base: str
    bootstrap: Literal["docker", "localimage"] = "docker"
    system_packages: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    wheelhouse: bool = False
    source_build: Optional[SourceBuild] = None
    build_hours: float = 0.1  # rough build time on a 16-core front-end
    venv: bool = False  # install pip packages into /opt/venv (Debian's python is externally managed)
    gcc_version: str = "12.2.0"  # the image's compiler, for source-build flags

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if IMAGE_NAME.fullmatch(v) is None:
            raise ValueError(f"variant id {v!r} is not a valid image name")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        Version(v)
        if IMAGE_TAG.fullmatch(v) is None:
            raise ValueError(f"version {v!r} is not a valid image tag")
        return v

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)


class Gpu(_M):
    vendor: Literal["nvidia", "amd"]
    cuda_arch: Optional[str] = None


class EnvOptions(_M):
    compilers: dict[str, dict[str, dict[str, str]]]
    threads: dict[str, dict[str, str]]
    precision: dict[str, dict[str, str]]
    allocator: dict[str, dict[str, str]]
    allocator_settings: dict[str, dict[str, str]] = {}  # allocator -> its tuning
    keras_backend: dict[str, dict[str, str]]


class Catalogue(_M):
    variants: tuple[Variant, ...]
    gpus: dict[str, Gpu] = {}
    options: EnvOptions

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        raise KeyError(variant_id)


@functools.lru_cache(maxsize=4)
def load_catalogue(path: Path = DATA) -> Catalogue:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader",
                                                                          yaml.SafeLoader))
        cat = Catalogue.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError, InvalidVersion) as exc:
        raise CatalogueError(f"{path}: invalid image catalogue: {exc}") from None
    ids = [v.id for v in cat.variants]
    if len(ids) != len(set(ids)):
        raise CatalogueError(f"{path}: duplicate variant ids")
    return cat


# ---------------------------------------------------------------------------
# version requests
def version_matcher(spec: str | None):
    """Return (kind, predicate): kind is 'any', 'exact', 'prefix' or 'specifier'.

    A bare version matches by release components: ``2.1`` matches 2.1.0 and 2.1.4,
    never 2.10.0; ``2.1.0`` matches only 2.1.0.
    """
    if spec is None or spec.strip() in ("", "*", "latest"):
        return "any", lambda v: True
    text = spec.strip()
    if text[0].isdigit() and not any(c in text for c in "<>=!~,"):
        try:
            want = Version(text)
        except InvalidVersion:
            raise InputError([("application.framework_version",
                               f"invalid version {spec!r}")]) from None
        n = len(want.release)

        def prefix(v: Version) -> bool:
            return v.release[:n] == want.release and (want.pre is None or v.pre == want.pre)
        return ("exact" if n >= 3 else "prefix"), prefix
    try:
        spec_set = SpecifierSet(text)
    except InvalidSpecifier:
        raise InputError([("application.framework_version",
                           f"invalid version specifier {spec!r}")]) from None
    return "specifier", lambda v: spec_set.contains(v, prereleases=True)


# ---------------------------------------------------------------------------
# microarchitectures
def _targets():
    import archspec.cpu
    return archspec.cpu.TARGETS


def known_microarch(name: str) -> bool:
    return name in _targets()


def microarch_runs_on(min_name: str, target_name: str) -> bool:
    """True when binaries built for ``min_name`` run on ``target_name``."""
    targets = _targets()
    if min_name == target_name:
        return True
    if min_name not in targets or target_name not in targets:
        return False
    return targets[min_name] < targets[target_name]


def microarch_depth(name: str) -> int:
    targets = _targets()
    return len(targets[name].ancestors) if name in targets else 0


# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    variant: Variant
    score: float
    breakdown: tuple[tuple[str, float], ...]


@dataclass
class _Check:
    variant: Variant
    failures: list[str] = field(default_factory=list)
    points: list[tuple[str, float]] = field(default_factory=list)


def wanted_accelerator(request: JobRequest) -> str:
    acc = request.target.accelerators
    if acc is None or request.job.request_gpus == 0:
        return "none"
    return acc.vendor


def select_images(request: JobRequest, catalogue: Catalogue | None = None) -> list[Match]:
    """All variants that fit the request, best first; NoMatchingImage lists the nearest."""
    cat = catalogue or load_catalogue()
    app, opt, target = request.application, request.optimisation, request.target
    if app.framework.value == "none":
        raise InputError([("application.framework",
                           "a framework is required to choose an image")], request.source)
    if not known_microarch(target.microarchitecture):
        raise InputError([("target.microarchitecture",
                           f"unknown microarchitecture {target.microarchitecture!r} "
                           "(use an archspec name such as x86_64_v3, skylake_avx512, zen4)")],
                         request.source)
    kind, version_ok = version_matcher(app.framework_version)
    accel = wanted_accelerator(request)
    gpu = cat.gpus.get(target.accelerators.model) if (accel != "none" and target.accelerators
                                                      and target.accelerators.model) else None

    checks = []
    for v in cat.variants:
        c = _Check(v)
        checks.append(c)
        if v.framework != app.framework.value:
            c.failures.append(f"framework {v.framework}")
            continue  # other frameworks are never 'near'
        if version_ok(v.parsed_version):
            c.points.append((f"version {v.version} {kind} match of "
                             f"{app.framework_version or 'any'}",
                             {"exact": 30, "prefix": 20}.get(kind, 10)))
        else:
            c.failures.append(f"version {v.version} does not match {app.framework_version}")
        if v.arch != target.cpu_arch:
            c.failures.append(f"built for {v.arch}, target is {target.cpu_arch}")
        elif not microarch_runs_on(v.min_microarch, target.microarchitecture):
            c.failures.append(f"needs {v.min_microarch}, target is {target.microarchitecture}")
        elif opt.enable_opt_build:
            depth = microarch_depth(v.min_microarch)
            if depth:
                c.points.append((f"built for {v.min_microarch}", 3.0 * depth))
        if v.accelerator != accel:
            c.failures.append(f"accelerator {v.accelerator}, target wants {accel}")
        elif gpu is not None and gpu.cuda_arch:
            if gpu.cuda_arch in v.cuda_archs:
                c.points.append((f"supports {target.accelerators.model} "
                                 f"(sm {gpu.cuda_arch})", 5))
            else:
                c.failures.append(f"no build for {target.accelerators.model} "
                                  f"(sm {gpu.cuda_arch})")
        if v.build_hours > target.max_build_hours:
            c.failures.append(f"build takes ~{v.build_hours:g} h, over the target's "
                              f"max_build_hours {target.max_build_hours:g}")
        if v.flavour == "source" and not opt.enable_opt_build:
            c.failures.append("source build needs enable_opt_build")
        elif opt.enable_opt_build:
            c.points.append((f"flavour {v.flavour}",
                             {"vendor": 20, "source": 15, "pip": 10}[v.flavour]))
        else:
            c.points.append((f"flavour {v.flavour} (prebuilt)", 10))
        if app.framework.value == "keras" and app.keras_backend and \
                app.keras_backend not in v.backends:
            c.failures.append(f"no keras backend {app.keras_backend}")
        for comp in opt.compilers:
            if comp in v.compilers:
                c.points.append((f"supports requested {comp.value}", 10))

    ok = [c for c in checks if not c.failures]
    if not ok:
        near = sorted((c for c in checks if c.variant.framework == app.framework.value),
                      key=lambda c: (len(c.failures), -sum(p for _, p in c.points)))[:3]
        wanted = (f"{app.framework.value} {app.framework_version or '(any version)'} for "
                  f"{target.cpu_arch}/{target.microarchitecture}"
                  f"{' + ' + accel if accel != 'none' else ''}")
        if near:
            lines = "; ".join(f"{c.variant.id} ({', '.join(c.failures)})" for c in near)
            raise NoMatchingImage(f"no image variant for {wanted}. Nearest: {lines}")
        raise NoMatchingImage(f"no image variant for {wanted}: the catalogue has no "
                              f"{app.framework.value} image")

    # newer versions among the matches get up to 5 points
    versions = sorted({c.variant.parsed_version for c in ok})
    for c in ok:
        if len(versions) > 1:
            rank = versions.index(c.variant.parsed_version) / (len(versions) - 1)
            c.points.append(("newer version", round(5 * rank, 2)))
    matches = [Match(c.variant, sum(p for _, p in c.points), tuple(c.points)) for c in ok]
    matches.sort(key=lambda m: (-m.score, m.variant.id))
    return matches
