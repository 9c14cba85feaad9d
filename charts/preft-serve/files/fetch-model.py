"""preft-serve chart: fetch a Hugging Face model directory into a volume. The workers'
model-download init container runs it (python3 -c) in the worker image; the registry's runs
it with --config-only in the registry image. Both images have Python and boto3.

SOURCE is s3://bucket/prefix (every object under the prefix, copied like `aws s3 sync`: a
file already there with the same size is kept, so a restarted download resumes) or an
http(s):// URL of a tar archive (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz) holding the model
files at its root or under one top directory, streamed and unpacked with tarfile's "data"
filter, and checked against --sha256 when given.

Nothing is fetched when DEST/config.json exists. Files land in .DEST.partial-<pod> beside
DEST, renamed to DEST once complete: a half-done download is never taken for a model, and of
several pods filling one shared volume the first to finish wins.
"""

import argparse
import hashlib
import os
import shutil
import socket
import sys
import tarfile
import time
import urllib.request
from pathlib import Path, PurePosixPath

CONFIG = "config.json"


def log(message):
    print(f"fetch-model: {message}", flush=True)


def fail(message):
    sys.exit(f"fetch-model: {message}")


def relative(name):
    """A path inside the model directory; refuses absolute paths and '..'."""
    path = PurePosixPath(name)
    if not path.parts or path.is_absolute() or ".." in path.parts:
        fail(f"refusing the file name {name!r}")
    return Path(*path.parts)


def fetch_s3(source, work, config_only, endpoint_url, region):
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    client = boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region or None)
    try:
        if config_only:
            objects = [(prefix + CONFIG, None)]
        else:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            objects = [
                (o["Key"], o["Size"])
                for page in pages
                for o in page.get("Contents", [])
                if not o["Key"].endswith("/")
            ]
        if not objects:
            fail(f"no objects under {source}")
        fetched = kept = 0
        for key, size in objects:
            target = work / relative(key[len(prefix) :])
            if size is not None and target.is_file() and target.stat().st_size == size:
                kept += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            client.download_file(bucket, key, str(part))
            part.replace(target)
            fetched += target.stat().st_size
        log(
            f"{len(objects)} files from {source}: {kept} already there, "
            f"{fetched / 1e9:.2f} GB fetched"
        )
    except (BotoCoreError, ClientError) as exc:
        fail(f"cannot read {source}: {exc}")


class Hashing:
    """A readable stream that hashes what passes through it."""

    def __init__(self, raw):
        self.raw, self.sha256, self.size = raw, hashlib.sha256(), 0

    def read(self, size=-1):
        data = self.raw.read(size)
        self.sha256.update(data)
        self.size += len(data)
        return data


def fetch_archive(source, work, config_only, sha256):
    if not hasattr(tarfile, "data_filter"):
        fail("this Python has no safe tar extraction (tarfile filters: 3.11.4 or later)")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        with urllib.request.urlopen(source, timeout=60) as response:
            stream = Hashing(response)
            with tarfile.open(fileobj=stream, mode="r|*") as archive:
                if config_only:
                    for member in archive:
                        parts = PurePosixPath(member.name).parts
                        if member.isfile() and parts[-1:] == (CONFIG,) and len(parts) <= 2:
                            member.name = CONFIG
                            archive.extract(member, work, filter="data")
                            log(f"{CONFIG} from {source}")
                            return
                    fail(f"no {CONFIG} in {source}")
                archive.extractall(work, filter="data")
            while stream.read(1 << 20):
                pass
    except (OSError, tarfile.TarError) as exc:
        fail(f"cannot fetch or unpack {source}: {exc}")
    if sha256 and stream.sha256.hexdigest() != sha256.lower():
        shutil.rmtree(work, ignore_errors=True)
        fail(f"{source} has sha256 {stream.sha256.hexdigest()}, expected {sha256.lower()}")
    log(f"unpacked {source} ({stream.size / 1e9:.2f} GB)")


def model_root(work, source):
    """The directory holding config.json: the archive's root or its one top directory."""
    if (work / CONFIG).is_file():
        return work
    entries = [e for e in work.iterdir() if not e.name.endswith(".part")]
    if len(entries) == 1 and (entries[0] / CONFIG).is_file():
        return entries[0]
    fail(f"{source} holds no {CONFIG} at its root or under one top directory")


def main():
    parser = argparse.ArgumentParser(prog="fetch-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="s3://bucket/prefix or an http(s):// tar archive URL")
    parser.add_argument("dest", help="the model directory to fill (model.path)")
    parser.add_argument("--config-only", action="store_true", help=f"fetch {CONFIG} alone")
    parser.add_argument("--sha256", default="", help="expected sha256 of the archive")
    parser.add_argument("--s3-endpoint-url", default="")
    parser.add_argument("--s3-region", default="")
    args = parser.parse_args()

    s3 = args.source.startswith("s3://")
    if not s3 and not args.source.startswith(("http://", "https://")):
        fail(f"unsupported source {args.source!r}: s3://bucket/prefix or an http(s):// URL")
    dest = Path(args.dest)
    if (dest / CONFIG).is_file():
        log(f"{dest} already holds a model ({CONFIG}); nothing to fetch")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.partial-{socket.gethostname()}"
    work.mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        if s3:
            fetch_s3(args.source, work, args.config_only, args.s3_endpoint_url, args.s3_region)
        else:
            fetch_archive(args.source, work, args.config_only, args.sha256)
        root = model_root(work, args.source)
    except SystemExit:
        if not s3:  # an S3 copy resumes where it stopped; an archive starts over
            shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        os.rename(root, dest)
    except OSError:
        if not (dest / CONFIG).is_file():
            fail(f"{dest} exists, is not empty and holds no {CONFIG}: empty or remove it")
        log(f"another pod filled {dest} first; keeping its copy")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"{dest} ready in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
