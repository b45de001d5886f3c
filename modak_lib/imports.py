"""What a job's Python files import, against what its image installs: said at plan time.

A script that imports a package its image lacks fails in the job with ``ModuleNotFoundError``,
after the image's build and the queue's wait, and the next missing package only after the
next build.  Where the image installs its Python packages offline from a wheelhouse (a
catalogue variant with ``wheelhouse: true``), the wheels there are all it can install, so the
plan can name every such import at once, before anything is built:

* the imports of the files the run directory receives (``import a.b`` and ``from a.b import
  c`` name ``a``), read with :mod:`ast`, never run; an import inside a ``try`` that catches
  ``ImportError`` (an optional dependency) or under ``if TYPE_CHECKING`` is not required;
* less the standard library of the images' Python (``wheelhouse.IMAGE_PYTHON``), the
  modules the run directory holds (beside the script, or at its top), and the runtime;
* less the top-level modules of the wheels the image installs (each wheel's file list, read
  from its archive: regular packages, namespace packages, single modules and extension
  modules alike): the closure of its requirements over the wheels' ``Requires-Dist``, markers
  taken for the images' Python on Linux and the image's architecture, every version's
  requirements where the wheelhouse holds several (pip picks one of them). A wheel there that
  the image does not reach does not count: one wheelhouse serves several images.

The distributions the image installs (the catalogue's ``pip`` and the request's
``application.pip_packages``) are checked against the wheels' names too: pip installs offline,
and one without a wheel fails the build.  The user's modules that the files import from beside
the script, but that are not sent, are named for every image, or none.

An image installed from a package index, or no image (runtime ``none``), is not checked for
packages: what pip resolves there, or what the front-end's Python has, is not known here.
"""
from __future__ import annotations

import email
import functools
import importlib.metadata
import shlex
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# (the reader of the imports is the runtime's, which the job reads them with after a failed
# import: modak_runtime.imports)
from modak_runtime.imports import Import, required_imports
from .wheelhouse import IMAGE_PYTHON

# the modules of Python 3.11's standard library that a later Python (the controller's, whose
# sys.stdlib_module_names this extends) no longer has (PEP 594, PEP 632, imp)
REMOVED_SINCE_311 = frozenset({
    "aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils",
    "imghdr", "imp", "lib2to3", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
    "smtpd", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "tomllib",
})
STDLIB = frozenset(sys.stdlib_module_names) | REMOVED_SINCE_311
# what a venv has besides its standard library (Python 3.11's ensurepip: pip and
# setuptools), and what every run has
ALWAYS = frozenset({"pip", "setuptools", "pkg_resources", "_distutils_hack", "modak_runtime"})
# import names whose distribution is named otherwise, for the advice when this controller
# does not have the distribution installed to ask (importlib.metadata)
KNOWN_DISTRIBUTIONS = {
    "PIL": "pillow", "cv2": "opencv-python-headless", "sklearn": "scikit-learn",
    "skimage": "scikit-image", "yaml": "pyyaml", "bs4": "beautifulsoup4",
    "google": "protobuf", "attr": "attrs", "dateutil": "python-dateutil",
}
SHOWN = 8  # imports named in the warning; the rest are counted
MAX_METADATA_BYTES = 4 * 1024 * 1024  # a wheel's METADATA larger than this is not read


def local_modules(files: Iterable[tuple[str, str]], script: str) -> set[str]:
    """The top-level modules that the run directory's files give, at its top and beside the
    script (its directory is ``sys.path[0]`` in the job): a folder with files in it, a
    ``.py`` file, an extension module; not a data file (``data.csv`` is no ``data``)."""
    script_dir = script.rpartition("/")[0]
    names: set[str] = set()
    for _, dest in files:
        for rel in (dest, dest[len(script_dir) + 1:] if script_dir and dest.startswith(
                script_dir + "/") else None):
            if rel is None:
                continue
            first, _, rest = rel.partition("/")
            if rest:
                names.add(first)
            elif first.endswith(".py"):
                names.add(first[:-3])
            elif first.endswith((".so", ".pyd")):
                names.add(first.split(".", 1)[0])
    return names


@dataclass
class Wheelhouse:
    """The wheels of a directory: what each distribution (by its canonical name) provides to
    import, and what it requires (its ``Requires-Dist``, of all its versions there)."""
    directory: Path
    provides: dict[str, set[str]] = field(default_factory=dict)
    requires: dict[str, set[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)  # each distribution's wheels

    @property
    def distributions(self) -> set[str]:
        return set(self.provides)

    @classmethod
    def read(cls, directory: "str | Path") -> "Wheelhouse":
        """The wheels of ``directory``, read once while none of them changes (a plan asks
        for its warning and for its image's wheels; each read opens every wheel): the same
        object, which callers do not change."""
        try:
            wheels = sorted(Path(directory).glob("*.whl"))
            seen = tuple((w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in wheels)
        except OSError:
            wheels, seen = [], ()
        return _read(cls, str(directory), seen)

    @classmethod
    def _read(cls, directory: str, wheels: list[Path]) -> "Wheelhouse":
        house = cls(Path(directory))
        for wheel in wheels:
            dist = canonicalize_name(wheel.name.split("-", 1)[0])
            try:
                with zipfile.ZipFile(wheel) as z:
                    names = z.namelist()
                    meta = [n for n in names if n.count("/") == 1
                            and n.endswith(".dist-info/METADATA")]
                    if meta and z.getinfo(meta[0]).file_size > MAX_METADATA_BYTES:
                        raise zipfile.BadZipFile("metadata too large")
                    requires = email.message_from_bytes(z.read(meta[0])).get_all(
                        "Requires-Dist", []) if meta else []
            except (OSError, zipfile.BadZipFile, KeyError):
                house.unreadable.append(wheel.name)
                continue
            house.provides.setdefault(dist, set()).update(_wheel_modules(names))
            house.requires.setdefault(dist, set()).update(requires)
            house.files.setdefault(dist, []).append(wheel.name)
        return house

    def wheels_for(self, requirements: Iterable[str], arch: str = "x86_64"
                   ) -> Optional[list[str]]:
        """The wheel files that pip may install for ``requirements`` from here (every
        version of each distribution of :meth:`installed`), which are all an image's build
        needs of the wheelhouse; None where that is not known for sure: a requirement
        without a wheel here (pip's error names it), or a wheel that could not be read."""
        requirements = [*requirements]
        names = [requirement_name(r) for r in requirements]
        if self.unreadable or not names or any(n is None or n not in self.provides
                                               for n in names):
            return None
        return sorted(f for d in self.installed(requirements, arch) for f in self.files[d])

    def installed(self, requirements: Iterable[str], arch: str = "x86_64") -> set[str]:
        """The distributions that pip installs for ``requirements`` from here: their closure
        over ``Requires-Dist``, with markers taken for the images' Python on Linux on
        ``arch`` (every version's requirements: what pip picks is among them)."""
        env = {"python_version": IMAGE_PYTHON, "python_full_version": f"{IMAGE_PYTHON}.0",
               "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
               "platform_machine": arch, "implementation_name": "cpython",
               "platform_python_implementation": "CPython"}
        todo = [r for r in map(_requirement, requirements) if r is not None]
        seen: set[tuple[str, frozenset]] = set()
        found: set[str] = set()
        while todo:
            req = todo.pop()
            name, extras = canonicalize_name(req.name), frozenset(req.extras)
            if (name, extras) in seen or name not in self.provides:
                continue
            seen.add((name, extras))
            found.add(name)
            for dep in map(_requirement, self.requires.get(name, ())):
                if dep is not None and (dep.marker is None or any(
                        _holds(dep.marker, {**env, "extra": e}) for e in extras | {""})):
                    todo.append(dep)
        return found


@functools.lru_cache(maxsize=4)
def _read(cls, directory: str, seen: tuple) -> Wheelhouse:
    """``Wheelhouse.read``'s read, for the wheels ``seen`` (name, size, time of change)."""
    return cls._read(directory, [Path(directory, name) for name, _, _ in seen])


def _requirement(text: str) -> Optional[Requirement]:
    try:
        return Requirement(str(text))
    except InvalidRequirement:
        return None


def _holds(marker, env: dict) -> bool:
    try:
        return marker.evaluate(env)
    except Exception:  # a marker this packaging cannot evaluate: taken, as pip may
        return True


def _wheel_modules(names: list[str]) -> set[str]:
    """The top-level import names of a wheel's files (``.data/purelib`` and ``platlib``
    included; metadata, scripts and headers not)."""
    found: set[str] = set()
    for name in names:
        parts = name.split("/")
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            parts = parts[2:]
        if parts[0].endswith(".dist-info") or not parts[0]:
            continue
        if len(parts) > 1:
            module = parts[0]
        elif parts[0].endswith(".py"):
            module = parts[0][:-3]
        elif parts[0].endswith((".so", ".pyd")):
            module = parts[0].split(".", 1)[0]
        else:
            continue
        if module.isidentifier():
            found.add(module)
    return found


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    try:
        return importlib.metadata.packages_distributions()
    except Exception:  # a broken installed distribution's metadata
        return {}


def distribution_for(module: str) -> Optional[str]:
    """The distribution that provides ``module`` as this controller knows it, else a
    well-known one, else None."""
    here = _installed().get(module)
    if here:
        return canonicalize_name(here[0])
    return KNOWN_DISTRIBUTIONS.get(module)


@dataclass
class Check:
    """What the plan says of the job's imports and the recipe's distributions."""
    missing_imports: list[Import]  # imports that no wheel provides
    missing_distributions: list[str]  # distributions the recipe installs, without a wheel
    unsent_modules: list[Import] = field(default_factory=list)  # beside the script, not sent
    # the image's own distributions (the catalogue's pip), which `modak wheelhouse --image`
    # downloads without being named
    own: frozenset[str] = frozenset()

    def warning(self, image: str, wheelhouse: Path, default: bool) -> Optional[str]:
        """One line for a plan's warnings (None: nothing is missing): what is missing, and
        the command that downloads it (``--dir`` where the wheelhouse is not the default)."""
        said = []
        if self.unsent_modules:
            shown = ", ".join(f"{i.module!r} ({i.file} line {i.line})"
                              for i in self.unsent_modules[:SHOWN])
            said.append(f"the job imports {shown} from beside the script here, which the run "
                        "directory does not receive: list "
                        + ("them" if len(self.unsent_modules) > 1 else "it")
                        + " (with the script) in application.files")
        if not self.missing_imports and not self.missing_distributions:
            return "; ".join(said) or None
        if self.missing_imports:
            shown = ", ".join(f"{i.module!r} ({i.file} line {i.line})"
                              for i in self.missing_imports[:SHOWN])
            more = len(self.missing_imports) - SHOWN
            shown += f" and {more} more" if more > 0 else ""
            said.append(f"the job imports {shown}, which image {image} would not have (it "
                        f"installs its Python packages from the wheelhouse {wheelhouse} only, "
                        "and none of the wheels it installs provides them): list the "
                        "distribution of each in application.pip_packages")
        if self.missing_distributions:
            listed = ", ".join(repr(d) for d in self.missing_distributions)
            said.append(f"the image installs {listed}, which the wheelhouse {wheelhouse} "
                        "holds no wheel of (its build would fail)")
        known = [d for d in self.missing_distributions if d not in self.own]
        unknown = []
        for imp in self.missing_imports:
            dist = distribution_for(imp.module)
            if dist is None:
                unknown.append(repr(imp.module))
            elif dist not in known:
                known.append(dist)
        command = ["modak", "wheelhouse", "--image", image,
                   *([] if default else ["--dir", str(wheelhouse)]), *known]
        said.append(f"download them with `{shlex.join(command)}`" + (
            f", adding the distribution that provides {', '.join(unknown)}" if unknown else ""))
        return "; ".join(said)


def _package(path: Path) -> bool:
    """A directory that Python imports by its name: with modules in it."""
    try:
        return path.is_dir() and not path.is_symlink() and any(path.glob("*.py"))
    except OSError:
        return False


def requirement_name(requirement: str) -> Optional[str]:
    """A requirement's distribution, by its canonical name (None: not a requirement)."""
    req = _requirement(requirement)
    return canonicalize_name(req.name) if req is not None else None


def check(files: list[tuple[str, str]], script: str, requirements: Iterable[str],
          house: Optional[Wheelhouse], own: Iterable[str] = (), arch: str = "x86_64"
          ) -> Check:
    """The job's imports and the recipe's ``requirements`` (the image's ``own``, the
    catalogue's ``pip``, and the request's ``pip_packages``) against ``house``; without one
    (what the image has is not known), only the user's modules that are not sent."""
    local = local_modules(files, script)
    imports = [i for i in required_imports(files)
               if i.module not in STDLIB and i.module not in ALWAYS and i.module not in local
               and not i.module.startswith("__")]
    # the user's own modules beside the script here, not sent with it
    src = dict((dest, s) for s, dest in files).get(script)
    here = Path(src).parent if src else None
    unsent = [i for i in imports if here is not None and (
        (here / f"{i.module}.py").is_file() or _package(here / i.module))]
    if house is None:
        return Check([], [], unsent)
    own, requirements = [*own], [*requirements]
    have = set().union(*(house.provides[d] for d in house.installed(own + requirements, arch)))
    missing = [i for i in imports if i not in unsent and i.module not in have]
    wanted: list[str] = []
    for name in map(requirement_name, own + requirements):
        if name and name not in house.distributions and name not in wanted:
            wanted.append(name)
    # an import whose distribution the image asks for is said once, as that distribution
    missing = [i for i in missing if canonicalize_name(i.module) not in wanted
               and distribution_for(i.module) not in wanted]
    return Check(missing, wanted, unsent, frozenset(filter(None, map(requirement_name, own))))


def _image_house(runtime: str, image: dict, wheelhouse: "str | Path"
                 ) -> tuple[Optional[Wheelhouse], tuple[str, ...], str]:
    """The wheelhouse a plan's ``image`` (its JSON: ``variant``, ``wheelhouse``) installs
    from (None: not one, or no wheels there), and the image's own distributions (the
    catalogue's pip) and architecture."""
    house = None
    if runtime != "none" and image.get("wheelhouse"):
        house = Wheelhouse.read(wheelhouse)
        house = house if house.distributions else None
    own: tuple[str, ...] = ()
    arch = "x86_64"
    if house is not None:
        from .catalogue import load_catalogue

        try:
            variant = load_catalogue().variant(image.get("variant"))
            own, arch = variant.pip, variant.arch
        except KeyError:
            pass
    return house, own, arch


def image_wheels(runtime: str, image: dict, wheelhouse: "str | Path") -> Optional[list[str]]:
    """The wheels of ``wheelhouse`` that a plan's ``image`` (its JSON) installs
    (``Wheelhouse.wheels_for`` its own distributions and the request's ``pip_packages``):
    the deploy copies these to its build, not a wheelhouse that serves other images too.
    None: copy it all."""
    house, own, arch = _image_house(runtime, image, wheelhouse)
    if house is None or not own:
        return None
    return house.wheels_for([*own, *image.get("pip_packages", ())], arch)


def plan_warning(plan, request, files: list[tuple[str, str]], wheelhouse: "str | Path",
                 default: bool = True) -> Optional[str]:
    """The plan's warning about what its job would lack (None: nothing to say): the user's
    modules not sent, for every plan; and, for an image that installs from a wheelhouse, the
    imports and distributions that no wheel there provides (not known for an image from a
    package index, or none; nor for a wheelhouse without wheels, which the deploy stops on
    by itself before it builds)."""
    house, own, arch = _image_house(plan.runtime, plan.image.model_dump(), wheelhouse)
    found = check(files, request.application.script, plan.image.pip_packages, house, own, arch)
    return found.warning(plan.image.variant, Path(wheelhouse), default)
