"""One logging setup: text or JSON, secrets redacted wherever they appear."""

from __future__ import annotations

import io
import json
import logging

import pytest

from preft_serve.common.logging import redact, setup_logging

KEY = "pft_0a1b2c3d4e5f.Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5"


@pytest.fixture
def capture():
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level

    def setup(json_output: bool) -> io.StringIO:
        setup_logging("DEBUG", json_output=json_output, stream=stream)
        return stream

    yield setup
    for handler in list(root.handlers):
        if getattr(handler, "_preft_handler", False):
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Authorization: Bearer abc.def-123", "Authorization: Bearer ***"),
        ("headers={'authorization': 'Bearer abc'}", "headers={'authorization': 'Bearer ***'}"),
        ("got bearer sk-live-123 from client", "got bearer *** from client"),
        (f"key {KEY} used", "key pft_0a1b2c3d4e5f.*** used"),
        ("url?api_key=s3cr3t&x=1", "url?api_key=***&x=1"),
        ('{"admin_token": "hunter2hunter2"}', '{"admin_token": "***"}'),
        ("aws secret_access_key=AKIAXYZ", "aws secret_access_key=***"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_redact(text, expected):
    assert redact(text) == expected


def test_text_output_redacts_args_and_exceptions(capture):
    stream = capture(json_output=False)
    log = logging.getLogger("preft_serve.test")
    log.info("auth header %s for %s", f"Bearer {KEY}", "acme")
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        log.exception("failed")
    out = stream.getvalue()
    assert KEY not in out and KEY.split(".")[1] not in out
    assert "auth header Bearer *** for acme" in out
    assert "preft_serve.test" in out and "INFO" in out
    assert "ValueError: bad key pft_0a1b2c3d4e5f.***" in out


def test_json_output_with_extras(capture):
    stream = capture(json_output=True)
    log = logging.getLogger("preft_serve.test")
    log.warning(
        "upload %s",
        "bot",
        extra={"tenant": "acme", "api_key": KEY, "headers": {"Authorization": "Bearer x"}},
    )
    entry = json.loads(stream.getvalue().strip())
    assert entry["message"] == "upload bot"
    assert entry["level"] == "WARNING" and entry["logger"] == "preft_serve.test"
    assert entry["tenant"] == "acme"
    assert entry["api_key"] == "***"
    assert entry["headers"] == {"Authorization": "***"}
    assert "ts" in entry
    logging.getLogger("uvicorn.error").info("x", extra={"color_message": "\x1b[36mx\x1b[0m"})
    assert "color_message" not in json.loads(stream.getvalue().strip().splitlines()[-1])


def test_counts_under_token_like_names_stay_numbers(capture):
    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info(
        "done",
        extra={"prompt_tokens": 5, "completion_tokens": 3, "access_token": "abc", "token_id": "7"},
    )
    entry = json.loads(stream.getvalue().strip())
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (5, 3)
    assert entry["access_token"] == entry["token_id"] == "***"


def test_setup_is_idempotent(capture):
    capture(json_output=False)
    capture(json_output=True)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_preft_handler", False)]
    assert len(ours) == 1
    assert logging.getLogger("uvicorn.access").propagate


@pytest.mark.parametrize(
    "fields",
    [
        {"user": f"me {KEY}", "route": "/v1/chat/completions", "status": 200},  # secret last
        {"model": "Bearer sk-live-9", "user": "u1", "latency_ms": 1.5},  # secret first
        {"worker": "http://w1", "adapter": None, "note": "password=hunter2"},
    ],
)
def test_access_line_fields_are_redacted_wherever_the_secret_is(capture, fields):
    """The filter rules a line out with one search over all its text fields; a secret in
    any one of them must still be caught, and the clean fields left as they were."""
    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info("POST /v1/chat/completions 200", extra=fields)
    entry = json.loads(stream.getvalue().strip())
    out = json.dumps(entry)
    assert "sk-live-9" not in out and "hunter2" not in out and KEY not in out
    for key, value in fields.items():
        if not isinstance(value, str) or value in ("u1", "/v1/chat/completions", "http://w1"):
            assert entry[key] == value


def test_a_clean_access_line_is_left_alone(capture):
    stream = capture(json_output=True)
    fields = {
        "request_id": "r-1",
        "tenant": "acme",
        "user": "u1",
        "model": "bot",
        "adapter": "bot",
        "adapter_version": 3,
        "worker": "http://w1:8000",
        "prompt_tokens": 5,
        "latency_ms": 1.2,
        "api_key_id": None,
    }
    logging.getLogger("preft_serve.test").info("POST /v1/completions 200", extra=fields)
    entry = json.loads(stream.getvalue().strip())
    assert {k: entry[k] for k in fields} == fields
    assert entry["message"] == "POST /v1/completions 200"


def test_secrets_inside_lists_tuples_and_bytes_are_redacted(capture):
    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info(
        "forwarding",
        extra={
            "headers": [("authorization", "Bearer abc123"), ("x-request-id", "r-1")],
            "raw": b"Authorization: Bearer abc123",
            "notes": ["key " + KEY, 5],
        },
    )
    entry = json.loads(stream.getvalue().strip())
    out = json.dumps(entry)
    assert "abc123" not in out and KEY not in out
    assert entry["headers"] == [["authorization", "***"], ["x-request-id", "r-1"]]
    assert entry["notes"][1] == 5


@pytest.mark.parametrize(
    "text",
    [
        "AUTHORIZATION: BEARER sk-live-9",
        "Api-Key=sk-live-9",
        "x-API_KEY: sk-live-9",
        "PassWord=sk-live-9",
        # Letters that case-folding does not map to ASCII but a case-insensitive match does:
        "apı_key=sk-live-9",
        "APİ_KEY=sk-live-9",
        "AUTHORİZATİON: sk-live-9",
        "ſecret_key=sk-live-9",
    ],
)
def test_the_screen_is_case_insensitive(text):
    """The one search that rules text out runs on case-folded text: any case still gets
    to the (case-insensitive) substitutions."""
    assert "sk-live-9" not in redact(text)


def test_a_str_subclass_field_is_still_redacted(capture):
    """Fields of exact types take the one-search path; anything else (a str enum, say) is
    redacted field by field."""

    class Note(str):
        pass

    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info("x", extra={"note": Note(f"key {KEY}")})
    entry = json.loads(stream.getvalue().strip())
    assert entry["note"] == "key pft_0a1b2c3d4e5f.***"


def test_json_lines_keep_what_orjson_refuses(capture):
    """Ints over 64 bits, non-string keys and unknown objects still make a JSON line."""

    class Thing:
        def __str__(self) -> str:
            return "thing-1"

    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info(
        "x", extra={"big": 2**70, "by_id": {7: "seven"}, "thing": Thing()}
    )
    line = stream.getvalue().strip()
    entry = json.loads(line)
    assert entry["big"] == 2**70 and '"level":"INFO"' in line  # compact, as orjson's
    assert entry["by_id"] == {"7": "seven"} and entry["thing"] == "thing-1"
    logging.getLogger("preft_serve.test").info("y", extra={"by_id": {7: "seven"}, "thing": Thing()})
    entry = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert entry["by_id"] == {"7": "seven"} and entry["thing"] == "thing-1"


def test_non_ascii_text_survives_a_json_line(capture):
    stream = capture(json_output=True)
    logging.getLogger("preft_serve.test").info("grüße %s", "日本", extra={"user": "zoë"})
    entry = json.loads(stream.getvalue().strip())
    assert entry["message"] == "grüße 日本" and entry["user"] == "zoë"
