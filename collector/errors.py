"""The one small error family parsers raise, and the record of a refused input.

A parser raises :class:`ParseError` (a ``ValueError``) that names where the bad input is and
quotes it. Parsers that can keep going past a bad line instead return the good rows together
with a list of :class:`Problem` so that a scrape with one broken line still keeps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

_QUOTE_MAX = 120


def quote(text: str | bytes, limit: int = _QUOTE_MAX) -> str:
    """A short, printable quote of ``text`` for an error message."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    text = text.replace("\n", "\\n")
    return repr(text if len(text) <= limit else text[:limit] + "…")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none), for a one-line error."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Problem:
    """One refused piece of input: where (``line 12``, ``span 3``) and why."""

    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


class ParseError(ValueError):
    """Input that cannot be read; the message names the source, the location and quotes it."""

    def __init__(self, message: str, *, source: str = "", location: str = "", snippet: str | bytes = ""):
        self.source = source
        self.location = location
        self.snippet = quote(snippet) if snippet else ""
        where = ": ".join(p for p in (source, location) if p)
        text = f"{where}: {message}" if where else message
        if self.snippet:
            text += f" (got {self.snippet})"
        super().__init__(text)
