"""``GET /v1/models`` and ``GET /v1/models/{model}``: OpenAI model objects with ``created``
(adapter: first upload; base model: gateway start), and no sign of other tenants' adapters.
``name@version`` parsing and ``DELETE /v1/models/{model}``'s own refusals (deleting through
a real registry: tests/finetune/test_fine_tuned_models.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import split_pinned
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, CREATED, KEY, OTHER_KEY, FakeRegistry, Workers

SETTINGS = GatewaySettings(
    worker_urls=["http://w1:8000"], base_model_name="org/tiny", worker_base_model="/models/tiny"
)


@pytest.fixture
def started() -> Iterator[tuple[TestClient, int, int]]:
    """A client and the unix seconds just before and after the gateway started."""
    before = int(time.time())
    app = create_app(SETTINGS, transport=httpx.MockTransport(Workers()), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, before, int(time.time())


def base_created(resp: httpx.Response, before: int, after: int) -> bool:
    return before <= resp.json()["created"] <= after


def test_list_has_created(started: tuple[TestClient, int, int]) -> None:
    client, before, after = started
    data = client.get("/v1/models", headers=AUTH).json()["data"]
    assert data[0] == {"id": "bot", "object": "model", "created": CREATED, "owned_by": "acme"}
    assert data[1]["id"] == "org/tiny" and before <= data[1]["created"] <= after
    other = client.get("/v1/models", headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert [m["id"] for m in other.json()["data"]] == ["rival", "org/tiny"]


def test_get_own_adapter_and_the_base(started: tuple[TestClient, int, int]) -> None:
    client, before, after = started
    bot = client.get("/v1/models/bot", headers=AUTH)
    assert bot.json() == {"id": "bot", "object": "model", "created": CREATED, "owned_by": "acme"}
    base = client.get("/v1/models/org/tiny", headers=AUTH)
    assert base.status_code == 200 and base.json()["id"] == "org/tiny"
    assert base.json()["owned_by"] == "preft-serve" and base_created(base, before, after)
    assert client.get("/v1/models/bot").status_code == 401


def test_unknown_and_other_tenants_adapters_look_the_same(
    started: tuple[TestClient, int, int],
) -> None:
    client = started[0]
    unknown = client.get("/v1/models/nope", headers=AUTH)
    theirs = client.get("/v1/models/rival", headers=AUTH)
    assert unknown.status_code == theirs.status_code == 404
    assert theirs.json() == {
        "error": {
            "message": "model 'rival' does not exist; GET /v1/models lists yours",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert (
        unknown.json()["error"]["message"].replace("nope", "rival")
        == (theirs.json()["error"]["message"])
    )
    assert set(unknown.headers) == set(theirs.headers)
    owner = client.get("/v1/models/rival", headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert owner.status_code == 200 and owner.json()["owned_by"] == "globex"


def test_openai_client_retrieve(started: tuple[TestClient, int, int]) -> None:
    client = openai.OpenAI(
        base_url="http://testserver/v1", api_key=KEY, max_retries=0, http_client=started[0]
    )
    model = client.models.retrieve("bot")
    assert (model.id, model.created, model.owned_by) == ("bot", CREATED, "acme")
    assert [m.id for m in client.models.list()] == ["bot", "org/tiny"]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("rival")
    assert "model 'rival' does not exist" in str(info.value)
    assert info.value.request_id


@pytest.mark.parametrize(
    ("model", "pinned"),
    [
        ("carol@2", ("carol", 2)),
        ("a.b-c_d@10", ("a.b-c_d", 10)),
        ("carol", None),
        ("carol@0", None),
        ("carol@", None),
        ("@1", None),
        ("carol@1@1", None),
        ("carol@x", None),
        ("carol@\u0661", None),
        ("carol@1234567890", None),
        ("a..b@1", None),
    ],
)
def test_name_at_version_is_parsed_in_one_place(model: str, pinned: tuple[str, int] | None) -> None:
    assert split_pinned(model) == pinned


def test_deleting_the_base_model_or_without_a_registry_says_why(
    started: tuple[TestClient, int, int],
) -> None:
    client = started[0]
    base = client.delete("/v1/models/org/tiny", headers=AUTH)
    assert base.status_code == 400 and base.json()["error"]["code"] == "model_not_deletable"
    pinned = client.delete("/v1/models/bot@1", headers=AUTH)
    assert pinned.status_code == 400 and "delete 'bot'" in pinned.json()["error"]["message"]
    unconfigured = client.delete("/v1/models/bot", headers=AUTH)
    assert unconfigured.status_code == 501, unconfigured.text
    message = unconfigured.json()["error"]["message"]
    assert "not enabled on this deployment" in message and "PREFT_" not in message
    assert client.delete("/v1/models/bot").status_code == 401
