"""Argument types for the names and ids a command puts into a URL path (tenants, adapters,
users, files, fine-tuning jobs). They are checked before anything is sent, so a typed value
names its own resource only: a '/' or '..' in it could otherwise reach another route (httpx
folds ``x/../../adapters/bot`` into ``/v1/adapters/bot``). The rules are the registry's own
(``registry_client.contract``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from preft_serve.common.registry_client.contract import (
    is_adapter_name,
    is_file_id,
    is_job_id,
    is_tenant_name,
    is_user_id,
)
from preft_serve.common.text import shown

_SHOWN = 64


def checked(is_valid: Callable[[str], bool], what: str, rule: str) -> Callable[[str], str]:
    """An argparse type: ``text`` as it is when ``is_valid``, else '<what> '<text>' is
    invalid: <rule>' (the text cut to 64 characters)."""

    def check(text: str) -> str:
        if not is_valid(text):
            raise argparse.ArgumentTypeError(f"{what} {shown(text, _SHOWN)} is invalid: {rule}")
        return text

    check.__name__ = what.replace(" ", "_")
    return check


tenant_name = checked(
    is_tenant_name,
    "tenant name",
    "use 2-63 lowercase letters, digits or '-', starting with a letter or digit",
)
adapter_name = checked(
    is_adapter_name,
    "adapter name",
    "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
)
file_id = checked(
    is_file_id,
    "file id",
    "file ids look like 'file-' and 24 letters or digits, as `preft files list` shows them",
)
job_id = checked(
    is_job_id,
    "job id",
    "job ids look like 'ftjob-' and 24 letters or digits, as `preft fine-tune list` shows them",
)
_user_id = checked(
    is_user_id, "user id", "use 1-128 letters, digits or '.', '_', '@', '+', '=', '-'"
)


def user_id(text: str) -> str:
    if text in (".", ".."):  # valid ids, but a URL path cannot name them
        raise argparse.ArgumentTypeError(
            f"user id {text!r} cannot be named in a URL path: bind users with other ids"
        )
    return _user_id(text)
