"""Strict patterns for every user value that reaches a script or a recipe.

A value that ends up unquoted (a ``#SBATCH`` directive, a file name, an image
tag) must match one of these patterns; anything else that reaches a shell is
quoted with :func:`shlex.quote` by the renderers.  The patterns are
deliberately narrow: a job name with a newline, ``$(...)``, a backtick or a
``../`` is rejected, not escaped.
"""
from __future__ import annotations

import posixpath
import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SCHED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # partition, queue, account
# A relative or absolute path without shell metacharacters, spaces or "..".
# "%" is allowed so that scheduler patterns such as %j (job id) work.
PATH = re.compile(r"[A-Za-z0-9_./%+-]{1,255}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
IMAGE_NAME = re.compile(r"[a-z0-9]+([._/-][a-z0-9]+)*")
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
NODE_FEATURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,&|-]{0,127}")  # Slurm --constraint expression
PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*([<>=!~]=?[A-Za-z0-9.*+!-]+)?")


def check(pattern: re.Pattern[str], what: str, value: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    if pattern.fullmatch(value) is None:
        raise ValueError(f"invalid {what} {value!r}: must match {pattern.pattern}")
    return value


def check_path(value: str, what: str = "path") -> str:
    value = check(PATH, what, value)
    if value.startswith("-"):
        raise ValueError(f"invalid {what} {value!r}: must not start with '-'")
    if ".." in value.split("/"):
        raise ValueError(f"invalid {what} {value!r}: '..' is not allowed")
    return value


def check_relative(value: str, what: str = "path") -> str:
    """A path relative to the request file's directory (the script, ``application.files``):
    what the run directory receives from it.  An absolute one was taken for a name in that
    directory (``/etc/passwd`` made the whole request directory, a home perhaps, the run
    directory's files, and the job ran the front-end's file of that name)."""
    value = check_path(value, what)
    if value.startswith("/"):
        raise ValueError(f"{what} {value!r} must be relative to the request file's directory "
                         "(the run directory receives it from there), not an absolute path")
    # (``./train.py`` was read as the directory ``.``, which went to the run directory whole)
    norm = posixpath.normpath(value)
    if norm == ".":
        raise ValueError(f"{what} {value!r} names the request file's directory itself: name "
                         "the script, or the files and folders the job needs")
    return norm


def check_output(value: str, what: str = "output") -> str:
    """A path in the run directory (the script's working directory) that the job writes and
    the deploy fetches back (``application.outputs``): relative to it, no ``..``, not the
    run directory itself, nothing of MODAK's own there (``modak_runtime``, ``.modak*``)."""
    value = check_path(value, what)
    norm = posixpath.normpath(value)
    if value.startswith("/") or norm == ".":
        raise ValueError(f"{what} {value!r} must name a file or folder in the run directory, "
                         "relative to it (the script's working directory)")
    top = norm.split("/", 1)[0]
    if top == "modak_runtime" or top.startswith(".modak"):
        raise ValueError(f"{what} {value!r} is MODAK's own, not the script's output")
    return norm


# where a dataset bound into the container cannot be: the container's own system (a bind
# there would shadow it), the job's work directory inside it (runtimes.base.WORKDIR), and
# credentials (a blueprint from someone else must not hand the login's keys to its script)
SYSTEM_DIRS = ("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root",
               "run", "sbin", "sys", "usr", "work")
SECRET_DIRS = (".ssh", ".gnupg")
# what MODAK's recipes install the framework into (render.recipe_spec): a dataset bound
# there, or over a directory above it (/opt), would hide the framework from the job
IMAGE_DIRS = ("/opt/venv",)


def check_dataset(value: str) -> str:
    """A dataset's directory (or file) on the target's nodes: an absolute path, bound into
    the container at that same path, so that a script's own arguments naming it work."""
    value = check_path(value, "dataset path")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if not value.startswith("/"):
        raise ValueError(f"dataset path {value!r} must be absolute (a path on the target's "
                         "nodes; the run directory's own files are in application.files)")
    if not parts or parts[0] in SYSTEM_DIRS:
        raise ValueError(f"dataset path {value!r} is the container's own system or work "
                         "directory: the data must lie elsewhere (not /" +
                         ", /".join(SYSTEM_DIRS) + ")")
    path = "/" + "/".join(parts)
    for own in IMAGE_DIRS:
        if (own + "/").startswith(path + "/") or path.startswith(own + "/"):
            raise ValueError(f"dataset path {value!r} would hide the image's own {own} "
                             "(its framework) from the job: the data must lie elsewhere")
    if set(parts) & set(SECRET_DIRS):
        raise ValueError(f"dataset path {value!r} holds credentials "
                         f"({', '.join(SECRET_DIRS)}), not data")
    return path


def _pattern(pattern: re.Pattern[str], what: str):
    return AfterValidator(lambda v: check(pattern, what, v))


JobName = Annotated[str, _pattern(JOB_NAME, "job name")]
SchedName = Annotated[str, _pattern(SCHED_NAME, "name")]
SafePath = Annotated[str, AfterValidator(check_path)]
RelPath = Annotated[str, AfterValidator(check_relative)]
OutputPath = Annotated[str, AfterValidator(check_output)]
DatasetPath = Annotated[str, AfterValidator(check_dataset)]
# Names a shell, the dynamic loader or Python act on at start-up: a value of one of them runs
# as a command (BASH_ENV, ENV, PROMPT_COMMAND, BASH_FUNC_*), loads code into every process
# (LD_PRELOAD, LD_AUDIT, ...) or changes how every later line is parsed (IFS, SHELLOPTS).
# MODAK sets the allocator's LD_PRELOAD itself (optimisation option allocator).
STARTUP_ENV = re.compile(r"(BASH_ENV|ENV|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|IFS|CDPATH|"
                         r"GLOBIGNORE|BASH_FUNC_.*|LD_.*|PYTHONSTARTUP|PYTHONHOME|PYTHONINSPECT|"
                         r"PERL5OPT|RUBYOPT|NODE_OPTIONS)")


def check_env_name(value: str) -> str:
    value = check(ENV_NAME, "environment variable name", value)
    if STARTUP_ENV.fullmatch(value):
        raise ValueError(f"{value} is read by the shell, the dynamic loader or an interpreter "
                         "at start-up and is refused (an allocator is chosen with the "
                         "optimisation's allocator option)")
    return value


EnvName = Annotated[str, AfterValidator(check_env_name)]
Email = Annotated[str, _pattern(EMAIL, "e-mail address")]
HostName = Annotated[str, _pattern(HOST, "host name")]
UserName = Annotated[str, _pattern(USER, "user name")]
NodeFeature = Annotated[str, _pattern(NODE_FEATURE, "node constraint")]
PackageSpec = Annotated[str, _pattern(PACKAGE, "package specifier")]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("NUL characters are not allowed")
    return value


# Free text that is always shell-quoted where it is used (arguments, env values).
QuotedText = Annotated[str, AfterValidator(_no_nul)]

# ---------------------------------------------------------------------------
# wall time
# Slurm's and PBS's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_CLOCK = re.compile(r"(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?")
_ISO = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?", re.IGNORECASE
)


MAX_WALLTIME_S = 365 * 86400


def parse_walltime(value: object) -> int:
    """Seconds from ``3600``, ``"HH:MM[:SS]"``, ``"D-HH:MM:SS"`` or ISO 8601 ``"P1DT6H"``."""
    if isinstance(value, bool):
        raise ValueError("wall time must be seconds or a duration string, not a boolean")
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
    elif isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 40:
            raise ValueError(f"invalid wall time {text[:40]!r}...: too long")
        if text.isdigit():
            seconds = int(text)
        elif (m := _CLOCK.fullmatch(text)) and (m["b"] or m["d"]):
            days, a, b, c = int(m["d"] or 0), int(m["a"]), m["b"], m["c"]
            if m["d"] or c is not None:  # D-HH[:MM[:SS]] or HH:MM:SS
                h, mi, sec, bounded = a, int(b or 0), int(c or 0), (b, c)
            else:  # MM:SS, as Slurm and PBS read two fields
                h, mi, sec, bounded = 0, a, int(b), (b,)
            if any(x is not None and int(x) > 59 for x in bounded):
                raise ValueError(f"invalid wall time {value!r}: minutes and seconds are 0-59")
            seconds = days * 86400 + h * 3600 + mi * 60 + sec
        elif (m := _ISO.fullmatch(text)) and text.upper() not in ("P", "PT"):
            seconds = (int(m["d"] or 0) * 86400 + int(m["h"] or 0) * 3600
                       + int(m["m"] or 0) * 60 + int(m["s"] or 0))
        else:
            raise ValueError(
                f"invalid wall time {value!r}: use seconds, HH:MM:SS, D-HH:MM:SS or ISO 8601 (PT2H)")
    else:
        raise ValueError(f"invalid wall time {value!r}")
    if seconds <= 0:
        raise ValueError(f"wall time must be positive, got {value!r}")
    if seconds > MAX_WALLTIME_S:
        raise ValueError(f"wall time {str(value)[:40]!r} is over the limit of "
                         f"{MAX_WALLTIME_S // 86400} days")
    return seconds


WallTime = Annotated[int, BeforeValidator(parse_walltime), WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
    "description": "seconds, MM:SS, HH:MM:SS, D-HH:MM:SS or ISO 8601 (PT2H)"})]


def slurm_walltime(seconds: int) -> str:
    """Slurm's ``D-HH:MM:SS`` (a day or more) or ``HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    clock = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}-{clock}" if days else clock


def pbs_walltime(seconds: int) -> str:
    """PBS's ``HH:MM:SS`` with hours past 24 (``30:00:00``)."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


# ---------------------------------------------------------------------------
# mail events
_PBS_LETTERS = {"a": "fail", "b": "begin", "e": "end"}
_WORDS = {"begin": "begin", "end": "end", "fail": "fail", "abort": "fail",
          "all": "all", "none": "none", "n": "none"}


def parse_mail_events(value: object) -> tuple[str, ...]:
    """Normalise PBS letters (``abe``) or Slurm words (``BEGIN,END``) to event names."""
    if value is None or value is False:
        return ()
    if value is True:
        return ("begin", "end", "fail")
    if isinstance(value, (list, tuple)):  # already events (or a list of words)
        value = ",".join(str(v) for v in value) or "none"
    if not isinstance(value, str):
        raise ValueError(f"invalid notification {value!r}")
    text = value.strip().lower()
    if text in ("", "n", "none"):
        return ()
    if re.fullmatch(r"[abe]+", text):
        events = {_PBS_LETTERS[c] for c in text}
    else:
        events = set()
        for word in re.split(r"[,\s]+", text):
            if word not in _WORDS:
                raise ValueError(
                    f"invalid notification event {word!r}: use PBS letters (abe) or "
                    "BEGIN, END, FAIL, ALL, NONE")
            events.add(_WORDS[word])
        if "all" in events:
            events = {"begin", "end", "fail"}
        events.discard("none")
    order = ("begin", "end", "fail")
    return tuple(e for e in order if e in events)


MailEvents = Annotated[tuple[str, ...], BeforeValidator(parse_mail_events), WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "boolean"},
              {"type": "array", "items": {"enum": ["begin", "end", "fail"]}}],
    "description": "PBS letters (abe) or Slurm words (BEGIN,END,FAIL,ALL,NONE)"})]
