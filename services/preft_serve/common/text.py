"""Quoting tenant-controlled text in error messages without echoing it unbounded.

Names, archive entries, config values and library error texts can be as long as a request
allows (a tar header once carried a 100 MiB name, which came back as a 100 MiB error body).
Every message (registry, adapter formats) that quotes such text goes through :func:`shown`
(or :func:`clip` for text that is already a sentence), so an error body stays small
whatever was uploaded.
"""

from __future__ import annotations

SHOWN_CHARS = 100  # characters of a quoted value kept in a message
CLIPPED_CHARS = 300  # characters of a library's error text kept in a message


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr`` of ``value`` for a message, cut to ``limit`` characters.

    Short strings read exactly like ``f"{value!r}"``; a longer one keeps its first
    ``limit`` characters, an ellipsis and its length: ``'aaaa…' (104857600 characters)``.
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        quoted = repr(value[:limit])
        return f"{quoted[:-1]}…{quoted[-1]} ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def clip(text: str, limit: int = CLIPPED_CHARS) -> str:
    """``text`` (an exception's message, say) cut to ``limit`` characters plus an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "…"
