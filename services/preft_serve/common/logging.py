"""One logging setup for every preft-serve process.

Modules log through ``logging.getLogger(__name__)`` with lazy ``%s`` arguments; a service
calls :func:`setup_logging` once at start-up. Output is plain text for humans or one JSON
object per line for log collectors (``json_output=True``). A :class:`RedactingFilter` on
the handler scrubs bearer tokens, ``Authorization`` values and API keys from every record
(including ones from uvicorn and libraries), so a secret that reaches a log call by
accident never reaches the log.

Processes we do not start ourselves (vLLM's API server and engine processes in a worker)
take the same handler as a ``logging.config.dictConfig`` dictionary, :func:`dict_config`:
the worker launcher writes it to the file ``VLLM_LOGGING_CONFIG_PATH`` names, which vLLM
applies in each of its processes and hands to uvicorn as its log config.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import re
import sys
from typing import IO, Any

import orjson

REDACTED = "***"
_HANDLER_MARK = "_preft_handler"

# Attributes every LogRecord has; anything else came in through ``extra=``
# (uvicorn's ANSI-coloured duplicate of each message is dropped too).
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "color_message",
}

_SENSITIVE_NAMES = re.compile(r"(?i)(authorization|api[_-]?key|token|secret|password|credential)")
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # preft API keys: keep the public key id, drop the secret.
    (re.compile(r"\b(pft_[A-Za-z0-9]+)\.[A-Za-z0-9_\-]+"), rf"\1.{REDACTED}"),
    # "Authorization: Bearer xyz", "authorization=xyz", JSON-ish "authorization": "xyz"
    (
        re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(bearer\s+|basic\s+)?[^\s'\",;]+"),
        rf"\1\2{REDACTED}",
    ),
    # (trailing stars: a key already redacted above collapses, so redaction is idempotent)
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]+\**"), rf"\1{REDACTED}"),
    (
        re.compile(
            r"(?i)\b((?:x-)?api[_-]?key|access[_-]?token|secret(?:[_-]access)?[_-]?key|"
            r"admin[_-]?token|password)(['\"]?\s*[:=]\s*['\"]?)[^\s'\",;&]+"
        ),
        rf"\1\2{REDACTED}",
    ),
)


# Every pattern above needs one of these words: one search rules out most text (an access
# log line, say) without running the four substitutions. ASCII text is searched
# case-folded with a plain pattern (~3 us on an access line; the case-insensitive search
# took ~15): for ASCII the two agree. Other text takes the case-insensitive search, which
# also matches what case-folding does not map to ASCII letters as the substitutions do
# ("apı_key", "APİ_KEY").
_WORDS = (
    r"pft_|authorization|bearer|api[_-]?key|access[_-]?token|secret|admin[_-]?token|"
    r"password"
)
_MAY_HOLD_SECRET = re.compile(_WORDS)
_MAY_HOLD_SECRET_ANY_CASE = re.compile("(?i)" + _WORDS)


def may_hold_secret(text: str) -> bool:
    """Whether ``text`` has a word that any redaction pattern needs (false: leave it be)."""
    if text.isascii():
        return _MAY_HOLD_SECRET.search(text.lower()) is not None
    return _MAY_HOLD_SECRET_ANY_CASE.search(text) is not None


def redact(text: str) -> str:
    """Scrub tokens and keys out of free text."""
    if not may_hold_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=4096)
def _sensitive_name(name: str) -> bool:
    """Whether a field called ``name`` holds a secret whatever its value says. Field names
    come from code (``extra=`` keys), so the cache stays small; it saves a regex search
    per field per record (the access log has ~13 fields a line)."""
    return _SENSITIVE_NAMES.search(name) is not None


def _redact_value(name: str, value: Any) -> Any:
    # A number is a count, not a credential ("prompt_tokens": 5 stays readable); None and
    # booleans say nothing either.
    if value is None or isinstance(value, int | float):
        return value
    if _sensitive_name(name):
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # e.g. header pairs: ("authorization", "Bearer x")
        first = value[0] if value else None
        if isinstance(first, bytes):
            first = first.decode("latin-1")
        items = (
            [value[0], REDACTED]
            if len(value) == 2 and isinstance(first, str) and _sensitive_name(first)
            else [_redact_value(name, v) for v in value]
        )
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, bytes | bytearray):
        return redact(value.decode("utf-8", "replace"))
    return value


class RedactingFilter(logging.Filter):
    """Rewrites each record so its message and ``extra`` fields carry no secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a broken format string must not lose the record)
            message = str(record.msg)
        record.args = None
        fields = record.__dict__
        extras = [(key, fields[key]) for key in fields.keys() - _STANDARD_ATTRS]
        # One search over the message and every text field rules out most records (an
        # access line has ~10 of them); none of the words spans a newline, so a hit in the
        # joined text is a hit in one part. Fields are redacted one by one only then, or
        # when a field is not plain text (exact types: a str or int subclass takes the
        # slow path) or its name says it holds a secret.
        texts = [message]
        plain = True
        for key, value in extras:
            kind = type(value)
            if kind is str:
                texts.append(value)
                plain = plain and not _sensitive_name(key)
            elif not (value is None or kind is int or kind is float or kind is bool):
                plain = False
        if plain and not may_hold_secret("\n".join(texts)):
            record.msg = message
            return True
        record.msg = redact(message)
        for key, value in extras:
            setattr(record, key, _redact_value(key, value))
        return True


class VllmRequestIdFilter(logging.Filter):
    """Copies the request id out of a vLLM message (``chatcmpl-<id>``, ``cmpl-<id>``, the
    gateway's ``X-Request-Id`` after the prefix, perhaps with vLLM's internal suffix) into
    a ``request_id`` field, so a worker's JSON lines can be found by the id in the
    gateway's access log. Records that carry a ``request_id`` already keep theirs."""

    # The id runs to the last letter or digit (a sentence's full stop is not part of it).
    _ID = re.compile(r"\b((?:chatcmpl|cmpl)-[\w.:~-]*[A-Za-z0-9])")

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            try:
                found = self._ID.search(record.getMessage())
            except Exception:  # noqa: BLE001  (a broken format string must not lose the record)
                found = None
            if found:
                record.request_id = found.group(1)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack_info"] = redact(record.stack_info)
        try:  # orjson: ~5x faster than json on an access line
            return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # what orjson refuses (an int over 64 bits, say) json writes
            return json.dumps(entry, default=str, separators=(",", ":"))


class _TextFormatter(logging.Formatter):
    """Plain text; the whole line (tracebacks included) passes through :func:`redact`,
    since another handler may already have cached an unredacted ``exc_text``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(
    level: str | int = "INFO", *, json_output: bool = False, stream: IO[str] | None = None
) -> logging.Handler:
    """Install the one root handler (idempotent: a second call replaces the first).

    uvicorn's loggers are pointed at the root handler too, so access logs get the same
    format and redaction.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(
        JsonFormatter()
        if json_output
        else _TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
    return handler


def dict_config(
    level: str = "INFO", *, json_output: bool = True, stream: str = "ext://sys.stderr"
) -> dict[str, Any]:
    """The :func:`setup_logging` handler as a ``dictConfig`` dictionary (JSON-serialisable),
    for processes that configure logging themselves: every logger, ``vllm.*`` and
    ``uvicorn.*`` included, propagates to the one root handler with the redacting filter.
    Existing loggers stay enabled (vLLM creates its loggers before it applies a config)."""
    module = __name__
    formatter: dict[str, Any] = (
        {"()": f"{module}.JsonFormatter"}
        if json_output
        else {
            "()": f"{module}._TextFormatter",
            "format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        }
    )
    level = level.upper()
    propagating = {"handlers": [], "level": level, "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": f"{module}.VllmRequestIdFilter"},
            "redact": {"()": f"{module}.RedactingFilter"},
        },
        "formatters": {"preft": formatter},
        "handlers": {
            "preft": {
                "class": "logging.StreamHandler",
                "stream": stream,
                "formatter": "preft",
                "filters": ["request_id", "redact"],
            }
        },
        "loggers": {
            name: dict(propagating)
            for name in ("vllm", "uvicorn", "uvicorn.error", "uvicorn.access")
        },
        "root": {"handlers": ["preft"], "level": level},
    }
