"""Shell words: literal values are quoted, a few pre-quoted fragments are not."""
from __future__ import annotations

import shlex
from typing import Iterable, Union


class Raw(str):
    """Shell text MODAK wrote itself (e.g. ``"$PWD":/work``): emitted as is."""


Word = Union[str, Raw]


def quote(word: Word) -> str:
    return word if isinstance(word, Raw) else shlex.quote(word)


def join(words: Iterable[Word]) -> str:
    return " ".join(quote(w) for w in words)


def comment_safe(text: object) -> str:
    """A value that is only ever shown in a ``#`` comment: no line breaks, no control chars."""
    return "".join(c if c.isprintable() else "?" for c in str(text))
