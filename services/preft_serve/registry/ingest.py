"""Turning an upload's file parts into an unpacked adapter directory for validation.

Accepts either the two adapter files as separate parts or a single archive. Every byte is
copied with a running size check, so the bounds hold however the client described its parts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import IO

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.text import clip
from preft_serve.registry.archives import copy_bounded, extract_archive, file_role, is_archive
from preft_serve.registry.validation import UploadBounds


@dataclasses.dataclass(frozen=True)
class UploadedFile:
    """One multipart file part: the client's file name and a seekable stream."""

    filename: str
    stream: IO[bytes]


@dataclasses.dataclass(frozen=True)
class StagedAdapter:
    config_path: Path
    weights_path: Path


def _basename(filename: str) -> str:
    # Browsers and curl send bare names; some tools send full client paths.
    return PureWindowsPath(PurePosixPath(filename).name).name


def stage_upload(files: list[UploadedFile], dest: Path, bounds: UploadBounds) -> StagedAdapter:
    """Copy (or extract) the upload into ``dest``; reject anything that is not an adapter."""
    if not files:
        raise InvalidRequest(
            f"no files in the upload: send {CONFIG_FILE} and {WEIGHTS_FILE} as "
            "'files' parts, or one .tar.gz/.zip archive of the adapter folder"
        )
    names = [_basename(f.filename or "") for f in files]
    archives = [n for n in names if is_archive(n)]
    if archives:
        if len(files) != 1:
            raise InvalidRequest(
                "send either one archive or the two adapter files, not both "
                f"(got {clip(', '.join(names))})"
            )
        found = extract_archive(files[0].stream, names[0], dest, bounds)
    else:
        found = {}
        for name, upload in zip(names, files):
            role = file_role(name)
            if role in found:
                raise InvalidRequest(f"{role} was sent more than once")
            limit = bounds.max_config_bytes if role == CONFIG_FILE else bounds.max_weights_bytes
            copy_bounded(upload.stream, dest / role, limit, role)
            found[role] = dest / role
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if f not in found]
    if missing:
        raise InvalidRequest(
            f"the upload lacks {' and '.join(missing)}; an adapter is exactly "
            f"{CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    return StagedAdapter(found[CONFIG_FILE], found[WEIGHTS_FILE])
