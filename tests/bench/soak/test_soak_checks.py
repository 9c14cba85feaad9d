"""The soak's verdicts on hand-made timelines: what counts as a wrong answer, an accounted
error, a recovery (bench/soak/verify.py)."""

from __future__ import annotations

from typing import Any

from bench.soak import verify as checks

SEEDED = [
    {"tenant": 0, "name": "a0", "user": "u0", "sha": "s-a0-1"},
    {"tenant": 1, "name": "a1", "user": "u1", "sha": "s-a1-1"},
]


def chat(
    t0: float,
    t1: float,
    name: str | None = "a0",
    version: int = 1,
    sha: str = "s-a0-1",
    status: int = 200,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "k": "chat",
        "t0": t0,
        "t1": t1,
        "tenant": 0,
        "user": "u0",
        "status": status,
        "err": None,
        "name": name,
        "version": version,
        "sha": sha,
        **extra,
    }


MUTATIONS = [
    {
        "k": "swap",
        "t0": 9.0,
        "t1": 10.0,
        "tenant": 0,
        "name": "a0",
        "status": 201,
        "version": 2,
        "sha": "s-a0-2",
    },
    {
        "k": "upload",
        "t0": 11.0,
        "t1": 12.0,
        "tenant": 0,
        "name": "n0",
        "status": 201,
        "version": 1,
        "sha": "s-n0-1",
    },
    {"k": "bind", "t0": 19.0, "t1": 20.0, "tenant": 0, "user": "u0", "name": "n0", "status": 200},
]


def verdict(*requests: dict[str, Any], grace: float = 0.0) -> dict[str, Any]:
    return checks.wrong_answers(requests, checks.Truth(MUTATIONS, SEEDED), grace)


def test_versions_older_than_an_acknowledged_swap_are_wrong() -> None:
    assert (
        verdict(chat(5, 11), chat(9.5, 10.5), chat(11, 12, version=2, sha="s-a0-2"))["wrong"] == 0
    )  # before the swap, while it was in flight, after it with v2
    stale = verdict(chat(10.5, 11))
    assert stale["by_kind"] == {"stale_version": 1}
    assert verdict(chat(10.5, 11), grace=1.0)["wrong"] == 0


def test_binding_changes_and_cross_tenant_answers() -> None:
    assert (
        verdict(chat(19.5, 21, name="n0", sha="s-n0-1"), chat(19.5, 21, version=2, sha="s-a0-2"))[
            "wrong"
        ]
        == 0
    )
    assert verdict(chat(21, 22, version=2, sha="s-a0-2"))["by_kind"] == {"stale_binding": 1}
    other = verdict(chat(1, 2, name="a1", sha="s-a1-1"))
    assert other["by_kind"] == {"other_tenant": 1}
    assert verdict(chat(11, 12, version=2, sha="s-a0-1"))["by_kind"] == {"content_not_version": 1}
    assert verdict(chat(1, 2, name=None))["by_kind"] == {"no_adapter_headers": 1}


def test_errors_are_accounted_only_inside_fault_windows() -> None:
    faults = [{"kind": "s3_stop", "start": 100.0, "end": 120.0, "recovered": 121.0}]
    records = [
        chat(1, 2),
        chat(3, 4, status=429, shape_ok=True),
        chat(99, 101, status=503, shape_ok=True),
        chat(123, 124, status=502, shape_ok=True),  # within grace (5 s) of the recovery
        chat(110, 111, status=0, err="ReadTimeout"),  # a broken answer in the window
        {"k": "bind", "t0": 105, "t1": 106, "status": 0},  # registry call without answer
        chat(200, 201, status=503, shape_ok=True),  # outside any window
        chat(110, 111, status=500, shape_ok=True),
        chat(110, 111, status=502, shape_ok=False),
        chat(5, 6, status=0),  # the gateway never goes away: no answer is never right
    ]
    out = checks.account_errors(records, faults, grace=5, end=300)
    assert out["classes"] == {
        "ok": 1,
        "rate_limited_429": 1,
        "chaos_window": 5,
        "http_500": 1,
        "unexpected_503": 1,
        "bad_error_body": 1,
        "unexpected_no_answer": 1,
    }
    assert out["unaccounted"] == 4


def test_recovery_resources_and_error_shape() -> None:
    rec = checks.recovery(
        [
            {"kind": "redis_kill", "start": 0, "end": 5, "recovered": 7.5},
            {"kind": "redis_kill", "start": 50, "end": 55, "recovered": None},
        ]
    )
    assert rec["redis_kill"] == {"faults": 2, "recovered": 1, "max_s": 2.5, "each_s": [2.5, None]}
    samples = [
        {
            "t": t,
            "parts": {
                "gw": {"rss_mb": rss, "fds": 10, "incarnation": 1},
                "w": {"rss_mb": 100, "fds": 5, "incarnation": inc},
            },
        }
        for t, rss, inc in ((0, 100, 1), (10, 120, 2), (20, 110, 2))
    ]
    res = checks.resources(samples)
    assert res["gw"]["rss_growth_same_process"] == 1.1 and res["gw"]["restarts"] == 0
    assert res["w"]["restarts"] == 1
    assert checks.error_shape_ok(
        {"error": {"message": "y", "type": "invalid_request_error", "param": None, "code": "x"}}
    )
    assert not checks.error_shape_ok({"error": {"code": "x", "message": "y"}})  # no type
    assert not checks.error_shape_ok({"detail": "nope"})
    assert "FAIL" in checks.table([("a", "b", False)])


def test_growth_of_a_restarted_part_counts_from_its_recovery() -> None:
    samples = [
        {"t": t, "parts": {"w": {"rss_mb": rss, "fds": 5, "incarnation": inc}}}
        for t, rss, inc in ((0, 2000, 1), (10, 300, 2), (20, 1900, 2), (30, 2000, 2))
    ]
    faults = [{"kind": "worker_kill", "part": "w", "start": 5, "end": 6, "recovered": 15}]
    res = checks.resources(samples, faults)["w"]
    assert res["restarts"] == 1 and res["rss_growth_same_process"] == 1.05
    never = [{**faults[0], "recovered": None}]
    assert checks.resources(samples, never)["w"]["rss_growth_same_process"] is None


def test_a_worker_error_needs_a_fault_on_that_worker() -> None:
    faults = [
        {
            "kind": "worker_kill",
            "part": "w0",
            "url": "http://127.0.0.1:1",
            "start": 0,
            "end": 1,
            "recovered": 200,
        }
    ]
    records = [
        chat(50, 51, status=502, shape_ok=True, msg="worker http://127.0.0.1:1 failed: ReadError"),
        chat(60, 61, status=502, shape_ok=True, msg="worker http://127.0.0.1:2 failed: ReadError"),
    ]
    records.append(
        chat(
            70,
            71,
            status=503,
            shape_ok=True,
            msg="the registry's Redis is unavailable; retry shortly",
        )
    )
    # "no worker is reachable" names every worker tried: the faulted one accounts for it.
    both = "no worker is reachable (http://127.0.0.1:2: ConnectTimeout; http://127.0.0.1:1: "
    records.append(chat(80, 81, status=503, shape_ok=True, msg=both + "ConnectError)"))
    records.append(
        chat(
            90, 91, status=503, shape_ok=True, msg="no worker is reachable (http://127.0.0.1:2: X)"
        )
    )
    out = checks.account_errors(records, faults, grace=5, end=300)
    assert out["classes"] == {"chaos_window": 2, "unexpected_502": 1, "unexpected_503": 2}


def test_a_cancel_that_arrives_after_its_job_ended_is_accounted_only_as_such() -> None:
    cancel = {"k": "ft_cancel", "t0": 50, "t1": 51, "tenant": 0, "status": 409, "shape_ok": True}
    records = [{**cancel, "code": "job_not_cancellable"}, {**cancel, "code": "conflict"}]
    out = checks.account_errors(records, [], grace=5, end=300)
    assert out["classes"] == {"cancel_after_job_ended": 1, "unexpected_409": 1}


def test_fine_tuning_checks_fail_on_an_unended_job_a_lost_cancel_or_an_unserved_adapter() -> None:
    good = {
        "acknowledged": 3,
        "by_status": {"succeeded": 2, "cancelled": 1},
        "errors": {},
        "not_terminal": [],
        "cancel_ignored": [],
        "not_listed": [],
        "not_served": [],
        "output_left": [],
        "served": 2,
    }
    assert all(passed for _, _, passed in checks.finetune_rows(good))
    for field in ("not_terminal", "cancel_ignored", "not_served", "output_left"):
        rows = checks.finetune_rows({**good, field: [["ftjob-x", "running"]]})
        assert [passed for _, _, passed in rows].count(False) == 1, field
    none_succeeded = {**good, "by_status": {"failed": 3}, "served": 0}
    assert not checks.finetune_rows(none_succeeded)[0][2]
    assert checks.finetune_rows(None) == []


# -- tenants bounded, clients that leave billed, no field ignored -------------------------


def answered(t0: float, latency: float, status: int = 200) -> dict[str, Any]:
    return chat(t0, t0 + latency, status=status)


PHASES = {"calm": [0.0, 30.0], "hostile_calm": [30.0, 60.0], "hostile": [30.0, 200.0]}
REGISTRY_DOWN = {
    "kind": "registry_kill",
    "part": "registry",
    "start": 100.0,
    "end": 101.0,
    "recovered": 110.0,
}


def test_isolation_compares_the_honest_p99_beside_the_hostile_tenant_with_the_calm_one() -> None:
    calm = [answered(i * 0.5, 0.4) for i in range(40)]
    iso = checks.isolation([*calm, *(answered(30 + i * 0.5, 1.2) for i in range(40))], PHASES)
    assert (iso["p99_calm_s"], iso["p99_hostile_s"], iso["ratio"]) == (0.4, 1.2, 3.0)
    assert iso["pass"]  # 1.2 <= 3 x 0.4 + 0.5
    slow = checks.isolation([*calm, *(answered(30 + i * 0.5, 1.8) for i in range(40))], PHASES)
    assert not slow["pass"]
    few = checks.isolation([*calm, *(answered(30 + i, 0.4) for i in range(10))], PHASES)
    assert few["answers_hostile"] == 10 and not few["pass"]
    refused = checks.isolation(
        [*calm, *(answered(30 + i * 0.5, 0.4) for i in range(40)), answered(45, 0.01, status=429)],
        PHASES,
    )
    assert (refused["refused_calm"], refused["refused_hostile"]) == (0, 1)
    assert not refused["pass"]  # honest tenants have no limits: refused for the hostile one


def hostile_call(kind: str, status: int, msg: str | None = None) -> dict[str, Any]:
    return {
        "k": kind,
        "t0": 40.0,
        "t1": 40.1,
        "status": status,
        "err": None,
        "shape_ok": msg is not None,
        "code": "rate_limit_exceeded",
        "msg": msg,
    }


def test_hostile_refusals_must_name_the_hostile_tenants_own_limit() -> None:
    own = "your tenant has 4 uploads in flight, its limit; retry after 2 s"
    good = [
        hostile_call("slow_upload", 429, own),
        hostile_call("slow_upload", 408, "idle"),
        hostile_call("tokenize", 413, "the /tokenize body limit is 65536 bytes"),
    ]
    out = checks.hostile_refusals(good, others=["soak-0", "soak-1"])
    assert out["slow_upload"]["refused"] == out["slow_upload"]["named_own_limit"] == 1
    assert out["slow_upload"]["statuses"] == {"429": 1, "408": 1}
    assert out["slow_upload"]["pass"] and out["tokenize"]["pass"]
    assert out["slow_upload"]["example"] == own
    other = checks.hostile_refusals(
        [hostile_call("tokenize", 429, "tenant soak-0 is over 2 requests/s")], ["soak-0"]
    )
    assert other["tokenize"]["named_own_limit"] == 0 and not other["tokenize"]["pass"]
    vague = checks.hostile_refusals([hostile_call("tokenize", 429, "too many requests")], [])
    assert not vague["tokenize"]["pass"]  # no limit stated
    no_body = checks.hostile_refusals([hostile_call("tokenize", 429)], [])
    assert not no_body["tokenize"]["pass"]  # not the error envelope
    served = checks.hostile_refusals([hostile_call("tokenize", 200)], [])
    assert served["tokenize"]["refused"] == 0 and not served["tokenize"]["pass"]
    crashed = checks.hostile_refusals([*good, hostile_call("tokenize", 500, "boom")], [])
    assert crashed["tokenize"]["http_500"] == 1 and not crashed["tokenize"]["pass"]


def ft_call(t0: float, status: int, kind: str = "ft_file") -> dict[str, Any]:
    return {"k": kind, "t0": t0, "t1": t0 + 0.5, "tenant": 0, "status": status}


def test_honest_files_calls_beside_the_hostile_tenant_are_never_refused_for_load() -> None:
    calls = [
        ft_call(20, 503),
        ft_call(40, 200),
        ft_call(41, 200, "ft_get"),
        ft_call(104, 503),
        ft_call(105, 0, "ft_create"),
        ft_call(250, 503),
    ]
    out = checks.tenant_calls_beside_hostile(
        calls, [REGISTRY_DOWN], PHASES["hostile"], grace=5, end=300
    )
    # Before and after the hostile tenant: not counted; inside the registry's outage: its.
    assert out["calls"] == 4 and out["unavailable"] == 0
    assert out["by_status"] == {"200": 2, "503": 1, "0": 1}
    worker = {**REGISTRY_DOWN, "kind": "worker_kill", "part": "worker-0"}
    late = checks.tenant_calls_beside_hostile(calls, [worker], PHASES["hostile"], 5, 300)
    assert late["unavailable"] == 2  # a worker's fault does not cover the files API
    limited = checks.tenant_calls_beside_hostile(
        [ft_call(40, 429)], [REGISTRY_DOWN], PHASES["hostile"], 5, 300
    )
    assert limited["unavailable"] == 1


def left(
    t0: float,
    mode: str,
    prompt_tokens: int = 10,
    deltas: int = 0,
    api: str = "chat",
    status: int = 200,
) -> dict[str, Any]:
    return {
        "k": "leave",
        "api": api,
        "mode": mode,
        "t0": t0,
        "t1": t0 + 1.0,
        "status": status,
        "err": None,
        "prompt_tokens": prompt_tokens,
        "deltas": deltas,
    }


def test_billing_of_clients_that_left_is_at_least_requests_prompts_and_deltas() -> None:
    sent = [
        left(10, "headers"),
        left(20, "midstream", 12, 3, "responses"),
        left(30, "headers", status=503),
        left(102, "midstream", 50, 9),
    ]
    enough = {"requests": 2, "prompt_tokens": 22, "completion_tokens": 3}
    out = checks.billing(sent, enough, [REGISTRY_DOWN], grace=5, end=300)
    # The 503 was never answered; the stream inside the outage's window may go unbilled.
    assert out["counted"] == 2 and out["expected_at_least"] == enough
    assert out["by_mode"] == {"chat/headers": 1, "responses/midstream": 1}
    assert out["short"] == {} and out["pass"]
    short = checks.billing(sent, {**enough, "prompt_tokens": 10}, [], 5, 300)
    assert short["short"] == {
        "prompt_tokens": [10, 72],
        "requests": [2, 3],
        "completion_tokens": [3, 12],
    }
    assert not short["pass"]
    one_mode = checks.billing(sent[:1], enough, [], 5, 300)
    assert not one_mode["pass"]  # no client left mid-stream: half the check untested


def probe(
    field: str,
    status: int,
    code: str | None,
    expected: str = "unsupported_parameter",
    t0: float = 40.0,
    path: str = "/v1/chat/completions",
) -> dict[str, Any]:
    return {
        "k": "unsupported",
        "path": path,
        "field": field,
        "expected_code": expected,
        "t0": t0,
        "t1": t0 + 0.2,
        "status": status,
        "err": None,
        "code": code,
        "shape_ok": code is not None,
    }


def test_unsupported_fields_must_be_a_400_with_their_code() -> None:
    probes = [
        probe("kv_transfer_params", 400, "unsupported_parameter"),
        probe("tools", 400, "tool_calling_disabled", "tool_calling_disabled", path="/v1/responses"),
        probe(
            "tools",
            503,
            "service_unavailable",
            "tool_calling_disabled",
            t0=103,
            path="/v1/responses",
        ),
    ]
    out = checks.unsupported_fields(probes, [REGISTRY_DOWN], grace=5, end=300)
    assert (out["sent"], out["judged"], out["wrong"]) == (3, 2, 0) and out["pass"]
    ignored = checks.unsupported_fields(
        [*probes, probe("vllm_xargs.kv_transfer_params", 200, None)], [], 5, 300
    )
    assert ignored["wrong"] == 2 and not ignored["pass"]  # answered; the 503 outside a fault
    wrong_code = checks.unsupported_fields(
        [probe("kv_transfer_params", 400, "invalid_value")], [], 5, 300
    )
    assert not wrong_code["pass"]
    never = checks.unsupported_fields(
        [probes[0], probe("tools", 503, "x", "tool_calling_disabled", t0=103)],
        [REGISTRY_DOWN],
        5,
        300,
    )
    assert never["wrong"] == 0 and not never["pass"]  # one probe never got an answer


def test_a_raw_answer_to_a_stalled_upload_is_read_for_status_and_envelope() -> None:
    from bench.soak.hostile import _answer

    envelope = (
        b'{"error": {"message": "4 uploads at once is your limit", "type": '
        b'"rate_limit_error", "param": null, "code": "rate_limit_exceeded"}}'
    )
    plain = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\r\n"
    assert _answer(plain + envelope) == {
        "status": 429,
        "shape_ok": True,
        "code": "rate_limit_exceeded",
        "msg": "4 uploads at once is your limit",
    }
    chunked = (
        b"HTTP/1.1 408 Request Timeout\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(envelope):x}\r\n".encode()
        + envelope
        + b"\r\n0\r\n\r\n"
    )
    assert _answer(chunked)["status"] == 408 and _answer(chunked)["shape_ok"]
    assert _answer(b"HTTP/1.1 502 Bad Gateway\r\n\r\nupstream gone") == {
        "status": 502,
        "shape_ok": False,
    }
    assert _answer(b"")["status"] == 0  # closed without a word


def test_a_leaving_client_refused_in_a_window_is_judged_by_its_envelope() -> None:
    """A client meaning to leave mid-stream that is refused before the stream reads the
    refusal whole: a 502 with the envelope is accounted for, one without is not."""
    from bench.soak.leaving import error_fields

    envelope = (
        b'{"error": {"message": "worker http://127.0.0.1:9 failed", "type": '
        b'"upstream_error", "param": null, "code": "upstream_unavailable"}}'
    )
    assert error_fields(envelope) == {"shape_ok": True, "msg": "worker http://127.0.0.1:9 failed"}
    assert error_fields(b"<html>Bad Gateway</html>") == {"shape_ok": False}
    faults = [
        {
            "kind": "worker_kill",
            "url": "http://127.0.0.1:9",
            "start": 10.0,
            "end": 20.0,
            "recovered": 21.0,
        }
    ]
    leave = {
        "k": "leave",
        "api": "chat",
        "mode": "midstream",
        "t0": 12,
        "t1": 13,
        "status": 502,
        "err": None,
    }
    out = checks.account_errors(
        [{**leave, **error_fields(envelope)}, {**leave, **error_fields(b"oops")}], faults, 1, 100
    )
    assert out["classes"] == {"chaos_window": 2, "bad_error_body": 1}
