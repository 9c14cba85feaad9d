"""Argument types for the names and ids a command puts into a URL path (tenants, files,
fine-tuning jobs). They are checked before anything is sent, so a typed value names its
own resource only: a '/' or '..' in it could otherwise reach another route (httpx folds
``x/../../adapters/bot`` into ``/v1/adapters/bot``). Adapter names, user ids, versions and
key ids have theirs beside the commands that introduced them (``cli.policy``, ``cli.keys``).
"""

from __future__ import annotations

import argparse

from preft_serve.common.registry_client.contract import is_file_id, is_job_id, is_tenant_name
from preft_serve.common.text import shown

_SHOWN = 64


def tenant_name(text: str) -> str:
    if not is_tenant_name(text):
        raise argparse.ArgumentTypeError(
            f"tenant name {shown(text, _SHOWN)} is invalid: use 2-63 lowercase letters, "
            "digits or '-', starting with a letter or digit"
        )
    return text


def file_id(text: str) -> str:
    if not is_file_id(text):
        raise argparse.ArgumentTypeError(
            f"file id {shown(text, _SHOWN)} is invalid: file ids look like 'file-' and 24 "
            "letters or digits, as `preft files list` shows them"
        )
    return text


def job_id(text: str) -> str:
    if not is_job_id(text):
        raise argparse.ArgumentTypeError(
            f"job id {shown(text, _SHOWN)} is invalid: job ids look like 'ftjob-' and 24 "
            "letters or digits, as `preft fine-tune list` shows them"
        )
    return text
