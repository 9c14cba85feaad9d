"""One OpenAI base URL, the gateway's, for the whole flow: the official ``openai`` client
uploads a file, creates a fine-tuning job, reads its events, cancels it and lists models,
all through the gateway, which forwards files and fine-tuning to a real registry (over
loopback HTTP, on the suite's Redis) with the tenant's key and its own request id. Errors:
a missing or wrong key is the gateway's own 401, an upload over the limit is a 413 that
stores nothing.
Also here, because it needs both services on one Redis: a tenant's ``unbound_user``
setting decides what a user without a binding gets for the base model's name.
(The trained adapter served by a real worker: test_openai_e2e.py.)"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from preft_serve.gateway.app import create_app as gateway_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as registry_app
from tests.finetune.conftest import Api, chat_jsonl, registry_settings
from tests.support.gateway import MSGS, Workers
from tests.support.inprocess import serving
from tests.support.registry_api import admin

BASE = "tiny-llama"  # the registry's label for the model directory, and the gateway's name
METHOD = {"type": "preft", "preft": {"adapter": "lora", "mode": "prefill", "rank": 4, "steps": 2}}


class Stack:
    """A registry and a gateway in front of it; ``workers`` records what reached them."""

    def __init__(self, registry: str, gateway: str, workers: Workers) -> None:
        self.registry, self.gateway, self.workers = Api(registry), gateway, workers

    def client(self, key: str) -> OpenAI:
        return OpenAI(base_url=f"{self.gateway}/v1", api_key=key, max_retries=0)


@pytest.fixture
def stack(
    redis_server: str, namespace: str, model_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., Stack]]:
    """Start both (``registry``: the registry's own settings, the rest the gateway's); a
    long dispatcher period keeps created jobs queued, so no trainer runs here."""
    with ExitStack() as stop:

        def start(registry: dict[str, Any] | None = None, **gateway: Any) -> Stack:
            settings = registry_settings(
                redis_server, namespace, model_dir, tmp_path, registry, poll_s=60
            )
            registry_url = stop.enter_context(serving(registry_app(settings)))
            workers = Workers()
            app = gateway_app(
                GatewaySettings(
                    worker_urls=["http://w1:8000"],
                    redis_url=redis_server,
                    namespace=namespace,
                    base_model_name=BASE,
                    registry_url=registry_url,
                    limits_cache_s=0,
                    **gateway,
                ),
                transport=httpx.MockTransport(workers),
            )
            return Stack(registry_url, stop.enter_context(serving(app)), workers)

        yield start


def test_one_openai_client_does_the_whole_flow_through_the_gateway(
    stack: Callable[..., Stack], caplog: pytest.LogCaptureFixture
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    client = s.client(key)

    uploaded = client.files.create(file=("facts.jsonl", chat_jsonl()), purpose="fine-tune")
    assert uploaded.id.startswith("file-") and uploaded.bytes == len(chat_jsonl())
    assert client.files.retrieve(uploaded.id).filename == "facts.jsonl"
    assert [f.id for f in client.files.list().data] == [uploaded.id]
    assert client.files.content(uploaded.id).content == chat_jsonl()

    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=uploaded.id, suffix="facts", method=METHOD
    )  # type: ignore[arg-type]
    assert job.status == "queued" and job.id.startswith("ftjob-")
    assert client.fine_tuning.jobs.retrieve(job.id).training_file == uploaded.id
    assert [j.id for j in client.fine_tuning.jobs.list(limit=5).data] == [job.id]
    events = client.fine_tuning.jobs.list_events(job.id, limit=10).data
    assert events and all(e.object == "fine_tuning.job.event" for e in events)
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []
    assert [m.id for m in client.models.list().data] == [BASE]

    # The gateway's request id is the registry's: one id in both services' logs.
    caplog.set_level(logging.INFO, logger="preft_serve.registry.access")
    raw = client.files.with_raw_response.list(extra_headers={"X-Request-Id": "trace-42"})
    assert raw.headers["x-request-id"] == "trace-42"

    def registry_logged() -> bool:
        return any(
            getattr(r, "request_id", None) == "trace-42"
            for r in caplog.records
            if r.name == "preft_serve.registry.access"
        )

    # The access line is written once the registry's answer is sent, on the registry's own
    # server thread: on a loaded machine the client can read the answer first.
    deadline = time.monotonic() + 10
    while not registry_logged() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registry_logged()

    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError) as gone:
        client.files.retrieve(uploaded.id)
    assert gone.value.code == "not_found" or gone.value.status_code == 404


def test_a_missing_or_wrong_key_is_a_401_as_on_the_chat_routes(stack: Callable[..., Stack]) -> None:
    s = stack()
    s.registry.tenant("acme")
    with pytest.raises(openai.AuthenticationError) as refused:
        s.client("pft_nope.wrong").files.list()
    assert refused.value.status_code == 401
    assert refused.value.response.headers["www-authenticate"] == "Bearer"
    assert refused.value.body["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        s.client("pft_nope.wrong").files.create(file=("a.jsonl", chat_jsonl()), purpose="fine-tune")
    assert refused.value.code == "invalid_api_key"
    anonymous = httpx.get(f"{s.gateway}/v1/fine_tuning/jobs")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["message"]
    assert anonymous.json()["error"]["code"] == "missing_api_key"


@pytest.mark.parametrize("where", ["gateway", "registry"])
def test_an_upload_over_the_limit_is_413_and_stores_nothing(
    stack: Callable[..., Stack], where: str
) -> None:
    s = (
        stack(registry={"max_upload_bytes": 2048})
        if where == "registry"
        else stack(max_upload_bytes=2048)
    )
    key = s.registry.tenant("acme")
    big = chat_jsonl({f"question {i}?": "answer" for i in range(60)})
    assert len(big) > 4096
    with pytest.raises(openai.APIStatusError) as refused:
        s.client(key).files.create(file=("big.jsonl", big), purpose="fine-tune")
    assert refused.value.status_code == 413
    error = refused.value.body
    assert error["code"] == "request_too_large"  # type: ignore[index]
    assert "2048-byte limit" in error["message"]  # type: ignore[index]
    assert "PREFT_" not in error["message"]  # type: ignore[index]
    assert s.client(key).files.list().data == []
    # Chunked (no Content-Length): counted as it streams, refused all the same.
    chunked = httpx.post(
        f"{s.gateway}/v1/files",
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "multipart/form-data; boundary=b",
        },
        content=iter([b"--b\r\n", b"x" * 1024] + [b"y" * 1024] * 4),
    )
    assert chunked.status_code == 413, chunked.text
    assert s.client(key).files.list().data == []
    # The gateway's own body limit still holds everywhere else.
    job = httpx.post(
        f"{s.gateway}/v1/fine_tuning/jobs",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": BASE, "pad": "x" * (2 << 20)},
    )
    assert job.status_code == 413 and f"{1 << 20}-byte limit" in job.text
    assert "PREFT_" not in job.text


def test_the_tenant_decides_what_an_unbound_user_gets_for_the_base_models_name(
    stack: Callable[..., Stack],
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    chat = {"model": BASE, "messages": MSGS, "user": "nobody"}
    auth = {"Authorization": f"Bearer {key}"}
    served = httpx.post(f"{s.gateway}/v1/chat/completions", json=chat, headers=auth)
    assert served.status_code == 200, served.text  # the default: the base model answers
    assert served.headers["x-preft-adapter"] == "none"

    patched = httpx.patch(
        f"{s.registry.url}/v1/tenants/acme", headers=admin(), json={"unbound_user": "not_found"}
    )
    assert patched.status_code == 200, patched.text
    refused = httpx.post(f"{s.gateway}/v1/chat/completions", json=chat, headers=auth)
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "adapter_binding_not_found" and error["param"] == "user"
    assert "unbound_user" in error["message"] and "x-preft-adapter" not in refused.headers
    text = httpx.post(
        f"{s.gateway}/v1/completions",
        headers={**auth, "X-User-Id": "nobody"},
        json={"model": BASE, "prompt": "hi"},
    )
    assert text.status_code == 404
    # Naming the base model without a user still runs the base model.
    anonymous = httpx.post(
        f"{s.gateway}/v1/chat/completions", headers=auth, json={"model": BASE, "messages": MSGS}
    )
    assert anonymous.status_code == 200 and anonymous.headers["x-preft-adapter"] == "none"
    assert len(s.workers.seen) == 2


def test_a_job_may_name_the_base_model_as_make_runs_gateway_lists_it(
    redis_server: str,
    namespace: str,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """make run's toy stack keeps its model in a directory named ``model`` and serves it as
    ``tiny-llama``: the services get one name from the stack, so every base-model name the
    gateway's /v1/models lists is one a fine-tuning job may name, through the gateway."""
    from preft_serve.onebox.__main__ import config_from, parser
    from preft_serve.onebox.stack import OneBox

    box = OneBox(
        config_from(parser().parse_args(["--var", str(tmp_path), "--toy"])), say=lambda _: None
    )
    model = tmp_path / "demo" / "model"  # where make run's toy model is prepared
    model.parent.mkdir(parents=True)
    model.symlink_to(model_dir, target_is_directory=True)
    _, registry_env = box.registry_command(model)
    for name, value in registry_env.items():
        monkeypatch.setenv(name, value)
    gateway_argv, _ = box.gateway_command(model)
    served_as = gateway_argv[gateway_argv.index("--base-model-name") + 1]
    assert served_as != model.name  # the case the directory's name alone gets wrong
    with ExitStack() as stop:
        registry_url = stop.enter_context(
            serving(
                registry_app(registry_settings(redis_server, namespace, model, tmp_path, poll_s=60))
            )
        )
        gateway_url = stop.enter_context(
            serving(
                gateway_app(
                    GatewaySettings(
                        worker_urls=["http://w1:8000"],
                        redis_url=redis_server,
                        namespace=namespace,
                        base_model_name=served_as,
                        registry_url=registry_url,
                        limits_cache_s=0,
                    ),
                    transport=httpx.MockTransport(Workers()),
                )
            )
        )
        key = Api(registry_url).tenant("acme")
        client = OpenAI(base_url=f"{gateway_url}/v1", api_key=key, max_retries=0)
        file_id = client.files.create(file=("facts.jsonl", chat_jsonl()), purpose="fine-tune").id
        listed = [m.id for m in client.models.list().data if m.owned_by == "preft-serve"]
        assert listed

        for name in listed:
            job = client.fine_tuning.jobs.create(model=name, training_file=file_id, method=METHOD)  # type: ignore[arg-type]
            assert job.status == "queued" and job.model == name
        before = [j.id for j in client.fine_tuning.jobs.list().data]
        with pytest.raises(openai.NotFoundError) as unknown:
            client.fine_tuning.jobs.create(model="gpt-4o-mini" + "x" * 240, training_file=file_id)
        error = unknown.value.body
        assert error["code"] == "model_not_found" and error["param"] == "model"  # type: ignore[index]
        message = error["message"]  # type: ignore[index]
        assert all(repr(name) in message for name in listed)
        assert len(message) < 240  # the unknown name is clipped, not echoed whole
        assert [j.id for j in client.fine_tuning.jobs.list().data] == before
