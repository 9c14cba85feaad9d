"""The soak's verdicts on hand-made timelines: what counts as a wrong answer, an accounted
error, a recovery (loadtests/soak/verify.py)."""

from __future__ import annotations

from typing import Any

from loadtests.soak import verify as checks

SEEDED = [{"tenant": 0, "name": "a0", "user": "u0", "sha": "s-a0-1"},
          {"tenant": 1, "name": "a1", "user": "u1", "sha": "s-a1-1"}]


def chat(t0: float, t1: float, name: str = "a0", version: int = 1, sha: str = "s-a0-1",
         status: int = 200, **extra: Any) -> dict[str, Any]:
    return {"k": "chat", "t0": t0, "t1": t1, "tenant": 0, "user": "u0", "status": status,
            "err": None, "name": name, "version": version, "sha": sha, **extra}


MUTATIONS = [
    {"k": "swap", "t0": 9.0, "t1": 10.0, "tenant": 0, "name": "a0", "status": 201,
     "version": 2, "sha": "s-a0-2"},
    {"k": "upload", "t0": 11.0, "t1": 12.0, "tenant": 0, "name": "n0", "status": 201,
     "version": 1, "sha": "s-n0-1"},
    {"k": "bind", "t0": 19.0, "t1": 20.0, "tenant": 0, "user": "u0", "name": "n0",
     "status": 200},
]


def verdict(*requests: dict[str, Any], grace: float = 0.0) -> dict[str, Any]:
    return checks.wrong_answers(requests, checks.Truth(MUTATIONS, SEEDED), grace)


def test_versions_older_than_an_acknowledged_swap_are_wrong() -> None:
    assert verdict(chat(5, 11), chat(9.5, 10.5), chat(11, 12, version=2, sha="s-a0-2"))[
        "wrong"] == 0  # before the swap, while it was in flight, after it with v2
    stale = verdict(chat(10.5, 11))
    assert stale["by_kind"] == {"stale_version": 1}
    assert verdict(chat(10.5, 11), grace=1.0)["wrong"] == 0


def test_binding_changes_and_cross_tenant_answers() -> None:
    assert verdict(chat(19.5, 21, name="n0", sha="s-n0-1"), chat(19.5, 21, version=2,
                                                                  sha="s-a0-2"))["wrong"] == 0
    assert verdict(chat(21, 22, version=2, sha="s-a0-2"))["by_kind"] == {"stale_binding": 1}
    other = verdict(chat(1, 2, name="a1", sha="s-a1-1"))
    assert other["by_kind"] == {"other_tenant": 1}
    assert verdict(chat(11, 12, version=2, sha="s-a0-1"))["by_kind"] == {
        "content_not_version": 1}
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
    assert out["classes"] == {"ok": 1, "rate_limited_429": 1, "chaos_window": 5,
                              "http_500": 1, "unexpected_503": 1, "bad_error_body": 1,
                              "unexpected_no_answer": 1}
    assert out["unaccounted"] == 4


def test_recovery_resources_and_error_shape() -> None:
    rec = checks.recovery([{"kind": "redis_kill", "start": 0, "end": 5, "recovered": 7.5},
                           {"kind": "redis_kill", "start": 50, "end": 55, "recovered": None}])
    assert rec["redis_kill"] == {"faults": 2, "recovered": 1, "max_s": 2.5,
                                 "each_s": [2.5, None]}
    samples = [{"t": t, "parts": {"gw": {"rss_mb": rss, "fds": 10, "incarnation": 1},
                                  "w": {"rss_mb": 100, "fds": 5, "incarnation": inc}}}
               for t, rss, inc in ((0, 100, 1), (10, 120, 2), (20, 110, 2))]
    res = checks.resources(samples)
    assert res["gw"]["rss_growth_same_process"] == 1.1 and res["gw"]["restarts"] == 0
    assert res["w"]["restarts"] == 1
    assert checks.error_shape_ok({"error": {"message": "y", "type": "invalid_request_error",
                                            "param": None, "code": "x"}})
    assert not checks.error_shape_ok({"error": {"code": "x", "message": "y"}})  # no type
    assert not checks.error_shape_ok({"detail": "nope"})
    assert "FAIL" in checks.table([("a", "b", False)])


def test_growth_of_a_restarted_part_counts_from_its_recovery() -> None:
    samples = [{"t": t, "parts": {"w": {"rss_mb": rss, "fds": 5, "incarnation": inc}}}
               for t, rss, inc in ((0, 2000, 1), (10, 300, 2), (20, 1900, 2), (30, 2000, 2))]
    faults = [{"kind": "worker_kill", "part": "w", "start": 5, "end": 6, "recovered": 15}]
    res = checks.resources(samples, faults)["w"]
    assert res["restarts"] == 1 and res["rss_growth_same_process"] == 1.05
    never = [{**faults[0], "recovered": None}]
    assert checks.resources(samples, never)["w"]["rss_growth_same_process"] is None


def test_a_worker_error_needs_a_fault_on_that_worker() -> None:
    faults = [{"kind": "worker_kill", "part": "w0", "url": "http://127.0.0.1:1", "start": 0,
               "end": 1, "recovered": 200}]
    records = [chat(50, 51, status=502, shape_ok=True,
                    msg="worker http://127.0.0.1:1 failed: ReadError"),
               chat(60, 61, status=502, shape_ok=True,
                    msg="worker http://127.0.0.1:2 failed: ReadError")]
    records.append(chat(70, 71, status=503, shape_ok=True,
                        msg="the registry's Redis is unavailable; retry shortly"))
    out = checks.account_errors(records, faults, grace=5, end=300)
    assert out["classes"] == {"chaos_window": 1, "unexpected_502": 1, "unexpected_503": 1}


def test_a_cancel_that_arrives_after_its_job_ended_is_accounted_only_as_such() -> None:
    cancel = {"k": "ft_cancel", "t0": 50, "t1": 51, "tenant": 0, "status": 409,
              "shape_ok": True}
    records = [{**cancel, "code": "job_not_cancellable"}, {**cancel, "code": "conflict"}]
    out = checks.account_errors(records, [], grace=5, end=300)
    assert out["classes"] == {"cancel_after_job_ended": 1, "unexpected_409": 1}


def test_fine_tuning_checks_fail_on_an_unended_job_a_lost_cancel_or_an_unserved_adapter(
) -> None:
    good = {"acknowledged": 3, "by_status": {"succeeded": 2, "cancelled": 1}, "errors": {},
            "not_terminal": [], "cancel_ignored": [], "not_listed": [], "not_served": [],
            "output_left": [], "served": 2}
    assert all(passed for _, _, passed in checks.finetune_rows(good))
    for field in ("not_terminal", "cancel_ignored", "not_served", "output_left"):
        rows = checks.finetune_rows({**good, field: [["ftjob-x", "running"]]})
        assert [passed for _, _, passed in rows].count(False) == 1, field
    none_succeeded = {**good, "by_status": {"failed": 3}, "served": 0}
    assert not checks.finetune_rows(none_succeeded)[0][2]
    assert checks.finetune_rows(None) == []
