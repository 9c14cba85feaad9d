"""S3 (or any S3-protocol server: MinIO, Ceph, moto) object store through boto3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from preft_serve.common.objectstore.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreKind,
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


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
                raise ObjectStoreError(f"cannot create bucket {self.bucket}: {exc}") from exc

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _call(self, what: str, key: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise ObjectNotFound(key) from None
            raise ObjectStoreError(f"S3 {what} {self.bucket}/{self._key(key)}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"S3 {what} {self.bucket}/{self._key(key)}: {exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        self._call(
            "upload", key, self._client.upload_file,
            Filename=str(path), Bucket=self.bucket, Key=self._key(key), Config=self._transfer,
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
            "download", key, self._client.download_file,
            Bucket=self.bucket, Key=self._key(key), Filename=str(dest), Config=self._transfer,
        )

    def exists(self, key: str) -> bool:
        try:
            self._call("head", key, self._client.head_object, Bucket=self.bucket,
                       Key=self._key(key))
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
            raise ObjectStoreError(f"S3 list {self.bucket}/{self._key(prefix)}: {exc}") from exc

    def check(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise ObjectStoreError(f"S3 bucket {self.bucket} is not reachable: {exc}") from exc
