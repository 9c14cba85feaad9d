"""S3 (or any S3-protocol server: MinIO, Ceph, moto) object store through boto3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from preft_serve.common.objectstore.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreKind,
    StoreUnavailable,
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}  # the key; a missing bucket is an outage
_NO_BUCKET = {"NoSuchBucket"}
_DENIED = {
    "403",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AccountProblem",
}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _failure(exc: ClientError | BotoCoreError, detail: str) -> ObjectStoreError:
    """An S3 failure other than a missing key: :class:`StoreUnavailable` when the store as
    a whole cannot be used (no bucket, denied, unreachable, overloaded), else
    :class:`ObjectStoreError`. ``detail`` (bucket, key, boto's text) goes to the log only."""
    if isinstance(exc, NoCredentialsError):
        return StoreUnavailable("no credentials for the object store", f"{detail}: {exc}")
    if isinstance(exc, BotoCoreError):  # connection refused, timeouts, DNS ...
        return StoreUnavailable("the object store is not reachable", f"{detail}: {exc}")
    code = _code(exc)
    if code in _NO_BUCKET:
        return StoreUnavailable("the object store bucket does not exist", f"{detail}: {exc}")
    if code in _DENIED:
        return StoreUnavailable("access to the object store is denied", f"{detail}: {exc}")
    if _status(exc) >= 500 or code in {"SlowDown", "ServiceUnavailable", "InternalError"}:
        return StoreUnavailable("the object store is unavailable", f"{detail}: {exc}")
    return ObjectStoreError(f"{detail}: {exc}")


class S3ObjectStore(ObjectStore):
    """Objects under ``s3://bucket/prefix/``; large files go up as multipart uploads.

    S3 makes a PUT (and a completed multipart upload) visible all at once, which is the
    atomicity the content-addressed layout needs. boto3 clients are thread-safe, so one
    instance serves a whole process.
    """

    kind = ObjectStoreKind.S3

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        create_bucket: bool = False,
        multipart_threshold: int = 64 << 20,
    ) -> None:
        if not bucket:
            raise ValueError("S3 object store needs a bucket: s3://BUCKET[/prefix]")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                s3={"addressing_style": "path" if endpoint_url else "auto"},
            ),
        )
        self._transfer = TransferConfig(multipart_threshold=multipart_threshold)
        self.endpoint_url = endpoint_url
        if create_bucket:
            self._create_bucket(region)

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}{where})"

    def _create_bucket(self, region: str | None) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**kwargs)
        except ClientError as exc:
            if _code(exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise _failure(exc, f"S3 create bucket {self.bucket}") from exc
        except BotoCoreError as exc:
            raise _failure(exc, f"S3 create bucket {self.bucket}") from exc

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _call(self, what: str, key: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise ObjectNotFound(key) from None
            raise _failure(exc, f"S3 {what} {self.bucket}/{self._key(key)}") from exc
        except BotoCoreError as exc:
            raise _failure(exc, f"S3 {what} {self.bucket}/{self._key(key)}") from exc
        except (S3UploadFailedError, RetriesExceededError) as exc:  # boto3's transfer wrappers
            cause = getattr(exc, "last_exception", None) or exc.__context__
            detail = f"S3 {what} {self.bucket}/{self._key(key)}"
            if isinstance(cause, (ClientError, BotoCoreError)):
                raise _failure(cause, detail) from exc
            raise StoreUnavailable("the object store is unavailable", f"{detail}: {exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        self._call(
            "upload",
            key,
            self._client.upload_file,
            Filename=str(path),
            Bucket=self.bucket,
            Key=self._key(key),
            Config=self._transfer,
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            "put", key, self._client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data
        )

    def get_bytes(self, key: str) -> bytes:
        resp = self._call(
            "get", key, self._client.get_object, Bucket=self.bucket, Key=self._key(key)
        )
        body: bytes = resp["Body"].read()
        return body

    def download_file(self, key: str, dest: Path) -> None:
        self._call(
            "download",
            key,
            self._client.download_file,
            Bucket=self.bucket,
            Key=self._key(key),
            Filename=str(dest),
            Config=self._transfer,
        )

    def exists(self, key: str) -> bool:
        try:
            self._call(
                "head", key, self._client.head_object, Bucket=self.bucket, Key=self._key(key)
            )
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        self._call(
            "delete", key, self._client.delete_object, Bucket=self.bucket, Key=self._key(key)
        )

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for obj in page.get("Contents", []):
                    yield obj["Key"][len(self.prefix) :]
        except (ClientError, BotoCoreError) as exc:
            raise _failure(exc, f"S3 list {self.bucket}/{self._key(prefix)}") from exc

    def check(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            failure = _failure(exc, f"S3 head bucket {self.bucket}")
            if _code(exc) in _NOT_FOUND:  # HEAD has no body: a bare 404 is the bucket
                failure = StoreUnavailable("the object store bucket does not exist", failure)
            elif not isinstance(failure, StoreUnavailable):
                failure = StoreUnavailable("the object store is unavailable", failure)
            raise failure from exc
        except BotoCoreError as exc:
            raise _failure(exc, f"S3 head bucket {self.bucket}") from exc
