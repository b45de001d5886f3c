"""Errors that MODAK reports to users.

A user mistake is an :class:`InputError`: it names the file and the field path
(``job.job_options.wall_time_limit``) and the command line turns it into one
message and exit status 2, never a traceback.
"""
from __future__ import annotations


def shorten(text: object, most: int = 200) -> str:
    """A value fit for a one-line message: control characters (newlines, ESC) escaped, at
    most ``most`` characters."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))
    return text if len(text) <= most else text[:most - 20] + f"... ({len(text)} chars)"


class ModakError(Exception):
    """Base class of every error MODAK raises on purpose."""


class InputError(ModakError):
    """Bad user input: one or more problems, each with its field path."""

    def __init__(self, problems: list[tuple[str, str]] | str, source: str | None = None):
        if isinstance(problems, str):
            problems = [("", problems)]
        self.problems = list(problems)
        self.source = source
        super().__init__(self.format())

    def with_source(self, source: str) -> "InputError":
        """Return the same problems, attributed to ``source`` when none is set yet."""
        return self if self.source else InputError(self.problems, source)

    def with_prefix(self, prefix: str) -> "InputError":
        """Prefix every field path (``node 'train'.properties`` + ``.framework``)."""
        joined = [(f"{prefix}.{p}" if p else prefix, m) for p, m in self.problems]
        return InputError(joined, self.source)

    def format(self) -> str:
        """One line per problem: control characters escaped (a value cannot clear the
        screen or fake a line of its own), long values cut."""
        head = f"{shorten(self.source, 300)}: " if self.source else ""
        lines = [f"{head}{shorten(path, 300) + ': ' if path else ''}{shorten(msg, 500)}"
                 for path, msg in self.problems]
        return "\n".join(lines)


class NoMatchingImage(ModakError):
    """The image catalogue holds no variant for the request."""


class CatalogueError(ModakError):
    """The image catalogue data file is malformed (a project bug, not a user one)."""
