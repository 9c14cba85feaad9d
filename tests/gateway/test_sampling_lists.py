"""The lists vLLM applies on every generated token or step (``stop``, ``stop_token_ids``,
``bad_words``, ``logit_bias``, ``allowed_token_ids``, ``structured_outputs.choice``) have
fixed bounds: within them a body reaches the worker unchanged, one past them is a 400
before any worker is called. And the gateway's own look for a stop string across its two
hops (``handoff.ends_in_stop_start``) does work bounded by the stop string, not the text."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.handoff import FirstToken, Handoff, ends_in_stop_start
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry, Workers, message

ROUTES = ("/v1/chat/completions", "/v1/completions")


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    settings = GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny")
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def post(client: TestClient, path: str, **fields: Any) -> httpx.Response:
    shape: dict[str, Any] = {
        "/v1/chat/completions": {"messages": MSGS, "user": "u1"},
        "/v1/completions": {"model": "bot", "prompt": "hi"},
        "/v1/responses": {"model": "bot", "input": "hi"},
    }[path]
    return client.post(path, json={**shape, **fields}, headers=AUTH)


def words(count: int, chars: int) -> list[str]:
    return [f"{i:0{chars}d}"[-chars:] for i in range(count)]


# case: (the field, the largest value accepted, one past it, the refusal's param, what it says)
BOUNDS: dict[str, tuple[str, Any, Any, str, str]] = {
    "stop sequences": (
        "stop",
        words(4, 256),
        words(5, 3),
        "stop",
        "'stop' holds 5 stop sequences; at most 4 are accepted: end the output at single "
        "tokens with 'stop_token_ids' instead",
    ),
    "a stop sequence's length": (
        "stop",
        words(4, 256),
        [*words(3, 256), "s" * 257],
        "stop",
        "stop sequence 3 in 'stop' is 257 characters long; at most 256 are accepted: "
        "send a shorter stop sequence",
    ),
    "a stop string": (
        "stop",
        "s" * 256,
        "s" * 257,
        "stop",
        "'stop' is 257 characters long; at most 256 are accepted: send a shorter stop sequence",
    ),
    "stop_token_ids": (
        "stop_token_ids",
        list(range(64)),
        list(range(65)),
        "stop_token_ids",
        "'stop_token_ids' holds 65 token ids; at most 64 are accepted: list fewer; the "
        "model's own end-of-text tokens stop it without being listed",
    ),
    "bad_words": (
        "bad_words",
        words(64, 256),
        words(65, 3),
        "bad_words",
        "'bad_words' holds 65 words; at most 64 are accepted: lower further tokens with "
        "'logit_bias' instead",
    ),
    "a bad word's length": (
        "bad_words",
        words(64, 256),
        ["w" * 257],
        "bad_words",
        "word 0 in 'bad_words' is 257 characters long; at most 256 are accepted: "
        "send a shorter word",
    ),
    "logit_bias": (
        "logit_bias",
        {str(i): -100 for i in range(300)},
        {str(i): -100 for i in range(301)},
        "logit_bias",
        "'logit_bias' holds 301 token ids; at most 300 are accepted: bias fewer tokens, or "
        "restrict the output to a set with 'allowed_token_ids'",
    ),
    "allowed_token_ids": (
        "allowed_token_ids",
        list(range(1024)),
        list(range(1025)),
        "allowed_token_ids",
        "'allowed_token_ids' holds 1025 token ids; at most 1024 are accepted: exclude "
        "tokens with 'logit_bias' or 'bad_words' instead",
    ),
    "structured_outputs.choice": (
        "structured_outputs",
        {"choice": words(256, 256)},
        {"choice": words(257, 3)},
        "structured_outputs.choice",
        "'structured_outputs.choice' holds 257 choices; at most 256 are accepted: describe "
        "a larger set with 'structured_outputs.regex' or '.json' instead",
    ),
    "a choice's length": (
        "structured_outputs",
        {"choice": words(256, 256)},
        {"choice": ["yes", "c" * 257]},
        "structured_outputs.choice",
        "choice 1 in 'structured_outputs.choice' is 257 characters long; at most 256 are "
        "accepted: describe longer answers with 'structured_outputs.regex' or '.json' instead",
    ),
}


def assert_refused(reply: httpx.Response, workers: Workers, param: str, says: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_value",
        param,
    )
    assert message(reply) == says
    assert workers.seen == []  # nothing reached a worker


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("case", list(BOUNDS))
def test_the_largest_list_passes_unchanged_and_one_more_is_refused(
    client: TestClient, workers: Workers, path: str, case: str
) -> None:
    field, largest, over, param, says = BOUNDS[case]
    assert_refused(post(client, path, **{field: over}), workers, param, says)
    reply = post(client, path, **{field: largest})
    assert reply.status_code == 200, reply.text
    assert workers.seen[-1][field] == largest


# vLLM's Responses server reads these (not bad_words nor allowed_token_ids).
RESPONSES_READ = {"stop", "stop_token_ids", "logit_bias", "structured_outputs"}


@pytest.mark.parametrize("case", [c for c, bound in BOUNDS.items() if bound[0] in RESPONSES_READ])
def test_responses_bound_the_lists_vllm_reads_there(
    client: TestClient, workers: Workers, case: str
) -> None:
    field, largest, over, param, says = BOUNDS[case]
    assert_refused(post(client, "/v1/responses", **{field: over}), workers, param, says)
    reply = post(client, "/v1/responses", **{field: largest})
    assert reply.status_code == 200, reply.text
    assert workers.seen[-1][field] == largest


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"stop": 7}, "stop", "'stop' must be a string or a list of strings"),
        ({"stop": ["a", 7]}, "stop", "'stop' must be a list of strings"),
        ({"bad_words": None}, "bad_words", "'bad_words' must be a list of strings"),
        (
            {"stop_token_ids": [1, -1]},
            "stop_token_ids",
            "'stop_token_ids' must be a list of non-negative integers",
        ),
        (
            {"allowed_token_ids": "1"},
            "allowed_token_ids",
            "'allowed_token_ids' must be a list of token ids",
        ),
        (
            {"logit_bias": [1]},
            "logit_bias",
            "'logit_bias' must be an object of token ids to biases",
        ),
        (
            {"structured_outputs": "yes"},
            "structured_outputs",
            "'structured_outputs' must be an object",
        ),
    ],
)
def test_a_list_of_the_wrong_shape_is_refused(
    client: TestClient, workers: Workers, fields: dict[str, Any], param: str, says: str
) -> None:
    for path in ROUTES:
        assert_refused(post(client, path, **fields), workers, param, says)


def test_null_and_absent_lists_pass(client: TestClient, workers: Workers) -> None:
    nulls = dict.fromkeys(("stop", "stop_token_ids", "logit_bias", "allowed_token_ids"))
    reply = post(client, "/v1/completions", structured_outputs={"choice": None}, **nulls)
    assert reply.status_code == 200, reply.text
    assert all(workers.seen[-1][field] is None for field in nulls)


def test_a_megabyte_stop_string_is_refused_before_a_worker_sees_it(
    client: TestClient, workers: Workers
) -> None:
    """One stop string just under the body limit (1 MiB): refused by its length."""
    for path in ROUTES:
        reply = post(client, path, stop=["x" * 1_000_000])
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "stop"
        assert "is 1000000 characters long; at most 256 are accepted" in message(reply)
    assert workers.seen == []


def spans_reference(text: str, stop: str) -> bool:
    """By definition: some non-empty proper prefix of ``stop`` ends ``text``."""
    return any(text.endswith(stop[:k]) for k in range(1, len(stop)))


def test_ends_in_stop_start_agrees_with_the_definition_on_random_strings() -> None:
    rng = random.Random(20240)
    outcomes = set()
    for _ in range(5000):
        text = "".join(rng.choices("ab", k=rng.randrange(0, 9)))
        stop = "".join(rng.choices("ab", k=rng.randrange(0, 9)))
        expected = spans_reference(text, stop)
        assert ends_in_stop_start(text, stop) is expected, (text, stop)
        outcomes.add(expected)
    assert outcomes == {True, False}  # both answers were exercised
    # The edges: a whole stop string in the text is the worker's match, not a span.
    assert not ends_in_stop_start("xab", "ab")
    assert ends_in_stop_start("xa", "ab")
    assert not ends_in_stop_start("", "ab") and not ends_in_stop_start("a", "a")
    assert not ends_in_stop_start("a", "")


class CountedText(str):
    """A text that counts the slices taken of it."""

    slices = 0

    def __getitem__(self, key: Any) -> str:
        CountedText.slices += 1
        return str.__getitem__(self, key)


@pytest.mark.parametrize("length", [1000, 100_000])
def test_the_work_is_bounded_by_the_stop_string_not_the_text(length: int) -> None:
    """A 256-character stop string against a long first-token text: at most 255 suffixes
    of the text are looked at, however long it is."""
    stop_absent = "y" + "x" * 255  # no suffix of x...x starts it
    stop_open = "x" * 255 + "y"  # the text's last 255 characters start it
    CountedText.slices = 0
    assert not ends_in_stop_start(CountedText("x" * length), stop_absent)
    assert CountedText.slices == 255
    assert ends_in_stop_start(CountedText("x" * length), stop_open)


def test_stop_may_span_reads_every_stop_sequence_of_the_body() -> None:
    def spans(stop: Any, text: str) -> bool:
        handoff = Handoff(cast(Any, None), cast(Any, None), {"stop": stop}, False, "/", None)
        return handoff.stop_may_span(FirstToken({}, [], [], text, None, None))

    long_text = "z" * 1000
    assert spans("z" * 256, long_text)
    assert spans(["qq", "z" * 256], long_text)
    assert not spans(["q" * 256, "qzz", "z"], long_text)  # "z" alone: the worker's match
    assert not spans(None, long_text) and not spans([], long_text)


def test_the_refusal_is_counted_as_a_client_error(client: TestClient, workers: Workers) -> None:
    assert post(client, "/v1/completions", stop=words(5, 1)).status_code == 400
    assert 'preft_gateway_errors_total{cause="invalid_value"} 1.0' in client.get("/metrics").text
    assert workers.seen == []
