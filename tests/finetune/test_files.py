"""POST /v1/files: every class of bad line is refused with its line number and nothing is
stored; sizes and counts are bounded; files are tenant-scoped (404 across tenants)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.finetune.conftest import Api, chat_jsonl

GOOD = json.dumps(
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
)


def _msgs(*messages: object) -> str:
    return json.dumps({"messages": list(messages)})


BAD_LINES = {
    "not JSON": ('{"messages": [', "not valid JSON"),
    "NaN": ('{"messages": [{"role": "user", "content": "x"}], "w": NaN}', "NaN is not allowed"),
    "nested too deep": ('{"messages": ' + "[" * 20 + "]" * 20 + "}", "nested deeper than 16"),
    "not an object": ("[1, 2]", 'expected an object {"messages"'),
    "no messages": ('{"prompt": "x"}', 'expected an object {"messages"'),
    "empty messages": ('{"messages": []}', "non-empty list"),
    "message not an object": (_msgs("hi"), "message 0 is not an object"),
    "unknown role": (_msgs({"role": "tool", "content": "x"}), "unknown role 'tool'"),
    "tool calls": (
        _msgs({"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}),
        "tool calls",
    ),
    "bad content": (_msgs({"role": "user", "content": 5}), "needs 'content'"),
    "bad weight": (_msgs({"role": "assistant", "content": "x", "weight": 2}), "weight 2"),
    "no assistant": (_msgs({"role": "user", "content": "x"}), "no assistant message"),
    "too many messages": (_msgs(*[{"role": "user", "content": "x"}] * 257), "257 messages"),
    # JSON admits lone surrogates; no tokenizer encodes them, so the trainer would fail late.
    "lone surrogate": (
        '{"messages": [{"role": "user", "content": "a\\ud800b"}, '
        '{"role": "assistant", "content": "x"}]}',
        "lone surrogate",
    ),
}


def _stored(redis_server: str, namespace: str, root: Path) -> tuple[list[str], list[Path]]:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    keys = sorted(k for k in client.scan_iter(f"{namespace}:*") if ":file" in k)
    client.close()
    objects = (
        sorted((root / "objects" / "files").glob("*"))
        if (root / "objects" / "files").exists()
        else []
    )
    return keys, objects


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_each_bad_line_is_refused_with_its_number(
    api: Api, case: str, redis_server: str, namespace: str, tmp_path: Path
) -> None:
    key = api.tenant("acme")
    line, says = BAD_LINES[case]
    reply = api.upload(key, f"{GOOD}\n{line}\n{GOOD}\n".encode())
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "file" and error["code"] == "invalid_file_format"
    assert "1 bad line(s)" in error["message"] and "line 2:" in error["message"], error
    assert says in error["message"], error
    assert _stored(redis_server, namespace, tmp_path) == ([], [])


def test_every_bad_line_is_listed_and_bytes_are_checked(api: Api) -> None:
    key = api.tenant("acme")
    reply = api.upload(key, b"\xff\xfe\n" + GOOD.encode() + b"\n{\n")
    message = reply.json()["error"]["message"]
    assert reply.status_code == 400
    assert "line 1: not UTF-8 text" in message and "line 3: not valid JSON" in message
    assert (
        api.upload(key, b"\n\n").json()["error"]["message"].startswith("the file has no examples")
    )


def test_sizes_counts_and_purpose_are_bounded(serve: object) -> None:
    api = serve(max_file_bytes=4096, max_examples=2, tenant_max_files=1)  # type: ignore[operator]
    key = api.tenant("acme")
    too_big = api.upload(key, (GOOD + "\n") * 100)
    assert too_big.status_code == 413 and "4096-byte limit" in too_big.text
    too_many = api.upload(key, ((GOOD + "\n") * 3).encode())
    assert too_many.status_code == 400 and "at most 2 per file" in too_many.text
    # Limits are stated by their values, never by the settings behind them.
    assert "PREFT_" not in too_big.text and "PREFT_" not in too_many.text
    wrong = api.call(
        key,
        "POST",
        "/v1/files",
        data={"purpose": "assistants"},
        files={"file": ("a.jsonl", chat_jsonl())},
    )
    assert wrong.status_code == 422 and "purpose" in wrong.json()["error"]["message"]
    assert api.upload(key, chat_jsonl()).status_code == 200
    full = api.upload(key, chat_jsonl())
    assert full.status_code == 403 and full.json()["error"]["code"] == "quota_exceeded"


def test_files_are_content_addressed_and_tenant_scoped(
    api: Api, tmp_path: Path, redis_server: str, namespace: str
) -> None:
    acme, other = api.tenant("acme"), api.tenant("other")
    first = api.upload(acme, chat_jsonl(), "a/b/train.jsonl").json()
    second = api.upload(other, chat_jsonl()).json()
    assert first["id"].startswith("file-") and first["id"] != second["id"]
    assert first["filename"] == "train.jsonl" and first["bytes"] == len(chat_jsonl())
    assert first["status"] == "processed" and first["purpose"] == "fine-tune"
    assert len(list((tmp_path / "objects" / "files").glob("*"))) == 1  # one blob for both
    for path in (f"/v1/files/{first['id']}", f"/v1/files/{first['id']}/content"):
        assert api.call(other, "GET", path).status_code == 404
    assert api.call(other, "DELETE", f"/v1/files/{first['id']}").status_code == 404
    assert api.call(acme, "GET", "/v1/files/file-nope").status_code == 404
    assert api.call(acme, "GET", f"/v1/files/{first['id']}/content").content == chat_jsonl()
    assert [f["id"] for f in api.call(acme, "GET", "/v1/files").json()["data"]] == [first["id"]]
    assert api.call(acme, "DELETE", f"/v1/files/{first['id']}").json()["deleted"] is True
    assert len(list((tmp_path / "objects" / "files").glob("*"))) == 1  # other's still uses it
    assert api.call(other, "DELETE", f"/v1/files/{second['id']}").status_code == 200
    assert _stored(redis_server, namespace, tmp_path) == ([], [])
