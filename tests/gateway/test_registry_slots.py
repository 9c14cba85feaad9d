"""Files and fine-tuning calls through the gateway, against a real registry (in-process over
loopback HTTP, on the suite's Redis): no tenant's slow or stalled uploads take the
registry connections other tenants need. A tenant over its share of uploads gets 429 naming
its own limit, every other tenant is still served, and a body that stops arriving (or
trickles) is cut off with 408, which frees its slot and stores nothing."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from preft_serve.common.errors import ServiceUnavailable, TooManyRequests
from preft_serve.gateway.app import create_app as gateway_app
from preft_serve.gateway.registry_slots import RegistrySlots
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as registry_app
from tests.finetune.conftest import Api, chat_jsonl, registry_settings
from tests.support.gateway import Workers
from tests.support.inprocess import serving

BOUNDARY = "b0undary"
HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
    f'fine-tune\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
    'filename="slow.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
).encode()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model's config.json, all a registry reads of it (no trainer runs here)."""
    directory = tmp_path_factory.mktemp("slots-model") / "tiny-llama"
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "vocab_size": 320,
                "max_position_embeddings": 4096,
                "torch_dtype": "float32",
            }
        )
    )
    return directory


class Stack:
    def __init__(self, registry: str, gateway: str) -> None:
        self.registry, self.gateway = Api(registry), gateway

    def call(self, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.gateway}{path}",
            timeout=30,
            headers={"Authorization": f"Bearer {key}"},
            **kwargs,
        )

    def upload(self, key: str, name: str = "facts.jsonl") -> httpx.Response:
        return self.call(
            key,
            "POST",
            "/v1/files",
            data={"purpose": "fine-tune"},
            files={"file": (name, chat_jsonl(), "application/jsonl")},
        )

    def files(self, key: str) -> list[str]:
        listed = self.call(key, "GET", "/v1/files")
        assert listed.status_code == 200, listed.text
        return [f["filename"] for f in listed.json()["data"]]

    def open_uploads(self) -> float:
        for line in httpx.get(f"{self.gateway}/metrics").text.splitlines():
            if line.startswith('preft_gateway_registry_calls{kind="upload"}'):
                return float(line.split()[-1])
        raise AssertionError("no preft_gateway_registry_calls gauge")

    def wait_uploads(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while self.open_uploads() != count:
            assert time.monotonic() < deadline, f"uploads in progress != {count}"
            time.sleep(0.02)

    def stalled_upload(self, key: str, sent: bytes = b"") -> socket.socket:
        """An upload that declares 100 kB, sends ~200 bytes of it, then nothing."""
        url = urlsplit(self.gateway)
        sock = socket.create_connection((url.hostname, url.port))
        body = HEAD + sent + b"{" * max(0, 200 - len(HEAD) - len(sent))
        sock.sendall(
            (
                "POST /v1/files HTTP/1.1\r\nHost: gateway\r\n"
                f"Authorization: Bearer {key}\r\n"
                f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                "Content-Length: 100000\r\n\r\n"
            ).encode()
            + body
        )
        return sock


def reply(sock: socket.socket, timeout: float) -> tuple[int, dict[str, Any]]:
    sock.settimeout(timeout)
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer.status, json.loads(answer.read())


@pytest.fixture
def stack(redis_server: str, model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """A registry and a gateway in front of it (keyword arguments: the gateway's settings)."""
    with ExitStack() as stop:

        def start(**gateway: Any) -> Stack:
            namespace = f"slots{time.monotonic_ns() % 10**9}"
            settings = registry_settings(redis_server, namespace, model_dir, tmp_path, poll_s=60)
            registry_url = stop.enter_context(serving(registry_app(settings)))
            app = gateway_app(
                GatewaySettings(
                    worker_urls=["http://w1:8000"],
                    redis_url=redis_server,
                    namespace=namespace,
                    base_model_name="tiny-llama",
                    registry_url=registry_url,
                    limits_cache_s=0,
                    **gateway,
                ),
                transport=httpx.MockTransport(Workers()),
            )
            return Stack(registry_url, stop.enter_context(serving(app)))

        yield start


def test_a_tenant_over_its_upload_share_gets_429_and_other_tenants_are_served(
    stack: Callable[..., Stack], caplog: pytest.LogCaptureFixture
) -> None:
    s = stack(
        registry_connections=4,
        registry_uploads=3,
        registry_upload_reserve=1,
        registry_tenant_uploads=2,
        upload_idle_timeout_s=20,
    )
    a, b, c = (s.registry.tenant(name) for name in ("acme", "globex", "initech"))
    with ExitStack() as stop:
        for _ in range(2):
            stop.callback(s.stalled_upload(a).close)
        s.wait_uploads(2)
        for _ in range(2):  # more stalled uploads than A's share: refused, not held
            with s.stalled_upload(a) as refused:
                status, body = reply(refused, 5)
            assert status == 429, body
            assert "at most 2 at once" in body["error"]["message"]
        assert s.open_uploads() == 2

        over = s.upload(a)
        assert over.status_code == 429, over.text
        error = over.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "too_many_transfers"
        assert "already has 2 uploads in progress; at most 2 at once" in error["message"]
        assert "PREFT_" not in error["message"] and over.headers["retry-after"] == "1"

        # Everyone else is served meanwhile, A's other calls too.
        assert s.files(b) == [] and s.files(a) == []
        assert s.upload(b).status_code == 200
        assert s.files(b) == ["facts.jsonl"]

        # All tenants' uploads together stay under the connections: past that a 503 says
        # this gateway is busy (not that the registry is down), and other calls still go.
        stop.callback(s.stalled_upload(b).close)
        s.wait_uploads(3)
        busy = s.upload(c)
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["code"] == "uploads_busy"
        assert "already forwarding 3 uploads" in busy.json()["error"]["message"]
        assert s.files(c) == []
        job = s.call(
            c,
            "POST",
            "/v1/fine_tuning/jobs",
            json={"model": "tiny-llama", "training_file": "file-nope"},
        )
        assert job.status_code == 404, job.text
    s.wait_uploads(0)  # the clients left: their slots are free again, and nothing failed
    # The services' own errors: a library's background thread left by an earlier test in this
    # worker process (an OpenTelemetry exporter retrying a collector) may log here too.
    assert not [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.partition(".")[0] in ("preft_serve", "uvicorn")
    ]
    assert s.upload(a).status_code == 200 and s.files(a) == ["facts.jsonl"]
    metrics = httpx.get(f"{s.gateway}/metrics").text
    assert 'preft_gateway_errors_total{cause="registry_share"} 3.0' in metrics


@pytest.mark.parametrize("pace", ["stalled", "trickle"])
def test_an_upload_that_stops_arriving_is_cut_off_and_frees_its_slot(
    stack: Callable[..., Stack], pace: str
) -> None:
    s = stack(registry_tenant_uploads=1, upload_idle_timeout_s=0.5, upload_min_bytes_per_s=1000)
    key = s.registry.tenant("acme")
    sock = s.stalled_upload(key)
    with sock:
        if pace == "trickle":  # 200 bytes a second: under the 1000 asked for
            for _ in range(30):
                try:
                    sock.sendall(b'{"messages": [], "x": 1}\n'[:20])
                except OSError:
                    break  # cut off
                time.sleep(0.1)
        status, body = reply(sock, 10)
    assert status == 408, body  # well before the 10 s the reply is waited for
    error = body["error"]
    assert error["code"] == "request_timeout"
    expected = "nothing for 0.5 s" if pace == "stalled" else "arrived too slowly"
    assert expected in error["message"] and "send it again" in error["message"]
    assert "PREFT_" not in error["message"]
    s.wait_uploads(0)
    assert s.upload(key).status_code == 200  # its one slot is free again
    assert s.files(key) == ["facts.jsonl"]  # nothing of the cut upload was stored


def test_a_stalled_job_body_is_cut_off_without_a_registry_connection(
    stack: Callable[..., Stack],
) -> None:
    """A JSON body (job create) is read whole before a registry connection is taken; one
    that stops arriving is a 408 as an upload is, and no registry call was opened."""
    s = stack(upload_idle_timeout_s=0.5)
    key = s.registry.tenant("acme")
    url = urlsplit(s.gateway)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            (
                "POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: gateway\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                'Content-Length: 500\r\n\r\n{"model": '
            ).encode()
        )
        status, body = reply(sock, 10)
    assert status == 408 and body["error"]["code"] == "request_timeout", body
    assert s.call(key, "GET", "/v1/fine_tuning/jobs").json()["data"] == []


def test_uploads_must_leave_connections_for_other_calls() -> None:
    with pytest.raises(ValueError, match="must be below"):
        GatewaySettings(worker_urls=["http://w1:8000"], registry_connections=8, registry_uploads=8)
    with pytest.raises(ValueError, match=r"UPLOAD_RESERVE .* must be below"):
        GatewaySettings(
            worker_urls=["http://w1:8000"], registry_uploads=8, registry_upload_reserve=8
        )


def test_tenants_filling_their_shares_together_leave_uploads_for_a_new_tenant() -> None:
    """Tenants within their own shares of 4 cannot take the last 2 of 6 upload slots: those
    go to tenants with no upload yet, one each, and then the gateway is full."""
    slots = RegistrySlots(tenant_calls=10, tenant_uploads=4, uploads=6, upload_reserve=2)
    releases = [slots.take(t, upload=True) for t in ("a", "a", "a", "b")]
    for greedy in ("a", "b"):  # a holds 3 of its 4, b 1: both within their shares
        with pytest.raises(TooManyRequests) as refused:
            slots.take(greedy, upload=True)
        assert "keeps its last 2 upload slots for tenants with none" in str(refused.value)
    releases += [slots.take("c", upload=True), slots.take("d", upload=True)]
    with pytest.raises(ServiceUnavailable, match="already forwarding 6 uploads"):
        slots.take("e", upload=True)
    slots.take("b", upload=False)  # other calls are not reserved
    releases[0]()
    releases[1]()  # 4 uploads left, the shared part still full for b
    with pytest.raises(TooManyRequests):
        slots.take("b", upload=True)
    releases[2]()
    slots.take("b", upload=True)
    assert slots.uploading == 4
