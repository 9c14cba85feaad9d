"""Fine-tuning files: bounded upload, line-by-line validation, content-addressed storage.

The body is copied to a private staging file with a running size check, then checked
with the trainer's own checker (``training.data.check_conversations``), so a file accepted
here is one ``preft train`` accepts, and a refusal names every bad line (up to 10) the
way ``preft train`` does. Content goes to the object store under ``files/<sha256>``
(identical uploads share it); metadata goes to Redis. Nothing is stored on a refusal.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from preft_serve.common.domain_errors import Conflict, InvalidRequest, NotFound, QuotaExceeded
from preft_serve.common.finetune_wire import (
    FINE_TUNE_PURPOSE,
    RESULTS_PURPOSE,
    FileList,
    FileObject,
)
from preft_serve.common.objectstore import ObjectStore
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.text import clip, shown
from preft_serve.registry.archives import copy_bounded
from preft_serve.registry.finetune.ids import check_file_id, new_file_id
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.training.data import (
    DataError,
    FileCheck,
    check_conversations,
)

logger = logging.getLogger(__name__)
MAX_FILENAME = 256


def blob_key(sha256: str) -> str:
    return f"files/{sha256}.jsonl"


def _safe_filename(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    clean = "".join(c for c in base if c.isprintable())[:MAX_FILENAME]
    return clean or "upload.jsonl"


def copy_file_bounded(src: IO[bytes], dest: Path, limit: int) -> str:
    """Copy ``src`` to ``dest``; 413 past ``limit`` bytes. Returns the content's sha256."""
    digest = hashlib.sha256()
    copy_bounded(
        src,
        dest,
        limit,
        "the file",
        digest=digest,
        param="file",
        too_large=f"the file exceeds this registry's {limit}-byte limit for "
        "fine-tuning files; split it into smaller files",
    )
    return digest.hexdigest()


def validate_jsonl(path: Path, max_examples: int) -> FileCheck:
    """Conversations and longest line; 400 naming the bad lines (``invalid_file_format``).

    One streaming pass in bounded memory (``training.data.check_conversations``): the
    largest file the size cap allows costs a registry no more memory than a small one.
    """
    try:
        return check_conversations(path, max_examples)
    except DataError as exc:
        message = str(exc).replace(str(path), "the file")
        raise InvalidRequest(
            clip(message, 4000), param="file", code="invalid_file_format"
        ) from None


class FileService:
    def __init__(
        self,
        client: Any,
        keys: RegistryKeys,
        store: ObjectStore,
        settings: FinetuneSettings,
        staging_dir: Path | None,
        jobs_using: Callable[[str, str], list[str]],
    ) -> None:
        """``jobs_using(tenant, file_id)``: the tenant's queued or running jobs that read a
        file (``JobStore.using_file``); a file they read cannot be deleted."""
        self.redis, self.keys, self.store = client, keys, store
        self.settings, self.staging_dir = settings, staging_dir
        self.jobs_using = jobs_using

    def upload(self, tenant: str, filename: str, purpose: str, stream: IO[bytes]) -> FileObject:
        if purpose != FINE_TUNE_PURPOSE:
            raise InvalidRequest(
                f"purpose {shown(purpose)} is not supported here; use '{FINE_TUNE_PURPOSE}'",
                param="purpose",
            )
        if self.room(tenant) <= 0:
            raise QuotaExceeded(
                f"this tenant already has {self.settings.tenant_max_files} "
                "files; delete some with DELETE /v1/files/{id}",
                param="file",
            )
        with tempfile.TemporaryDirectory(dir=self.staging_dir, prefix="preft-file-") as tmp:
            path = Path(tmp) / "upload.jsonl"
            sha256 = copy_file_bounded(stream, path, self.settings.max_file_bytes)
            checked = validate_jsonl(path, self.settings.max_examples)
            size = path.stat().st_size
            if not self.store.exists(blob_key(sha256)):
                self.store.put_file(blob_key(sha256), path)
        record = self._commit(
            tenant,
            _safe_filename(filename),
            purpose,
            sha256,
            size,
            checked.conversations,
            checked.longest_line_bytes,
            checked.shortest_prompt_bytes,
        )
        logger.info(
            "tenant %s file %s: %d bytes, %d examples",
            tenant,
            record.id,
            size,
            checked.conversations,
        )
        return record

    def room(self, tenant: str) -> int:
        """How many more files the tenant may keep."""
        held = int(self.redis.zcard(self.keys.tenant_files(tenant)))
        return self.settings.tenant_max_files - held

    def put_result(self, tenant: str, filename: str, data: bytes) -> FileObject | None:
        """Store a job's result file (its metrics) as a file the tenant can download; None
        when the tenant has no room left for it (``TENANT_MAX_FILES`` holds for the files
        the registry makes too)."""
        if self.room(tenant) <= 0:
            return None
        sha256 = hashlib.sha256(data).hexdigest()
        key = blob_key(sha256)
        if not self.store.exists(key):
            self.store.put_bytes(key, data)
        return self._commit(tenant, filename, RESULTS_PURPOSE, sha256, len(data), 0)

    def _commit(
        self,
        tenant: str,
        filename: str,
        purpose: str,
        sha256: str,
        size: int,
        examples: int,
        longest_line: int = 0,
        shortest_prompt: int | None = None,
    ) -> FileObject:
        record = FileObject(
            id=new_file_id(),
            bytes=size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            self.keys.file(record.id),
            mapping={
                **{k: str(v) for k, v in record.model_dump().items() if v is not None},
                "tenant": tenant,
                "sha256": sha256,
                "examples": str(examples),
                "longest_line": str(longest_line),
                **(
                    {"shortest_prompt": str(shortest_prompt)} if shortest_prompt is not None else {}
                ),
            },
        )
        pipe.zadd(self.keys.tenant_files(tenant), {record.id: time.time_ns() // 1000})
        pipe.sadd(self.keys.file_blob_refs(sha256), record.id)
        pipe.execute()
        return record

    def info(self, tenant: str, file_id: str, param: str | None = None) -> dict[str, str]:
        """The file's stored record (object fields plus tenant, sha256, examples,
        longest_line and shortest_prompt bytes); 404 for another tenant's file."""
        check_file_id(file_id, param)
        raw: dict[str, str] = self.redis.hgetall(self.keys.file(file_id))
        if not raw or raw.get("tenant") != tenant:  # another tenant's file does not exist
            raise NotFound(
                f"no file {file_id!r} in this tenant", code="file_not_found", param=param
            )
        return raw

    def get(self, tenant: str, file_id: str, param: str | None = None) -> FileObject:
        return FileObject.model_validate(
            {
                k: v
                for k, v in self.info(tenant, file_id, param).items()
                if k in FileObject.model_fields
            }
        )

    def sha256(self, tenant: str, file_id: str, param: str | None = None) -> str:
        return self.info(tenant, file_id, param)["sha256"]

    def content(self, tenant: str, file_id: str) -> bytes:
        return self.store.get_bytes(blob_key(self.sha256(tenant, file_id)))

    def list(self, tenant: str, limit: int, after: str | None, purpose: str | None) -> FileList:
        ids: list[str] = self.redis.zrevrange(self.keys.tenant_files(tenant), 0, -1)
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        pipe = self.redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(self.keys.file(file_id))
        items = [
            FileObject.model_validate(
                {k: v for k, v in raw.items() if k in FileObject.model_fields}
            )
            for raw in pipe.execute()
            if raw
        ]
        if purpose is not None:
            items = [f for f in items if f.purpose == purpose]
        page = items[:limit]
        return FileList(
            data=page,
            has_more=len(items) > limit,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )

    def delete(self, tenant: str, file_id: str) -> None:
        """Metadata first; the blob goes when no other file (of any tenant) references it.
        A file a queued or running job still reads is refused (409)."""
        sha256 = self.info(tenant, file_id)["sha256"]
        if jobs := self.jobs_using(tenant, file_id):
            raise Conflict(
                f"file {file_id} is read by fine-tuning job {jobs[0]}, which has "
                "not finished; cancel it or wait for it to end, then delete the "
                "file",
                code="file_in_use",
            )
        refs = self.keys.file_blob_refs(sha256)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.file(file_id))
        pipe.zrem(self.keys.tenant_files(tenant), file_id)
        pipe.srem(refs, file_id)
        pipe.scard(refs)
        if pipe.execute()[-1] == 0:
            self.store.delete(blob_key(sha256))
