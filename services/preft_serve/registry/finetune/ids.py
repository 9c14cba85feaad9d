"""Ids of files, jobs and events (OpenAI's prefixes) and their checks, before any key is
built from one."""

from __future__ import annotations

import secrets
import string

from preft_serve.common.domain_errors import InvalidRequest, NotFound
from preft_serve.common.registry_client.contract import is_file_id, is_job_id
from preft_serve.common.text import shown

_ALPHABET = string.ascii_letters + string.digits


def _token() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(24))


def new_file_id() -> str:
    return f"file-{_token()}"


def new_job_id() -> str:
    return f"ftjob-{_token()}"


def check_file_id(file_id: str, param: str | None = None) -> str:
    """A malformed id cannot name anything: 404, like an unknown one (no probing by shape)."""
    if not is_file_id(file_id):
        raise NotFound(
            f"no file {shown(file_id)}: file ids look like 'file-' and 24 letters "
            "or digits, as POST /v1/files returns them",
            code="file_not_found",
            param=param,
        )
    return file_id


def check_job_id(job_id: str) -> str:
    if not is_job_id(job_id):
        raise NotFound(
            f"no fine-tuning job {shown(job_id)}: job ids look like 'ftjob-' and "
            "24 letters or digits",
            code="job_not_found",
        )
    return job_id


def event_id(stream_id: str) -> str:
    """A stream id ``ms-seq`` as an OpenAI-style event id."""
    return f"ftevent-{stream_id}"


def stream_id(event: str) -> str:
    """The stream id of an event id (the ``after`` cursor of list_events)."""
    raw = event.removeprefix("ftevent-")
    ms, _, seq = raw.partition("-")
    # Redis stream ids are two unsigned 64-bit numbers; anything else is the tenant's typo,
    # never a reason to ask Redis (whose error would read as an outage).
    if not (
        ms.isascii()
        and ms.isdigit()
        and seq.isascii()
        and seq.isdigit()
        and len(raw) <= 41
        and int(ms) < 1 << 64
        and int(seq) < 1 << 64
    ):
        raise InvalidRequest(f"after={shown(event)} is not an event id of this job", param="after")
    return raw
