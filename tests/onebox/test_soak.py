"""The soak with chaos, short: 2 minutes, one fault of each kind (``bench/soak/``).

The whole stack as processes (moto S3, Redis with AOF, registry, two CPU workers, gateway)
under traffic at 70% of measured capacity and concurrent tenant changes, while a worker is
SIGKILLed, the registry SIGKILLed mid-upload, Redis SIGKILLed and restarted from its AOF,
S3 paused for 20 s, a worker paused for 10 s, a trainer SIGKILLed and the registry
SIGKILLed while it registers a finished job's adapter; fine-tuning jobs are created and
cancelled throughout. Before the faults, 30 s calm, then 30 s with a hostile tenant
(slow uploads through the gateway's /v1/files, ~1 MB /tokenize calls), which stays to the
end; clients of another tenant leave their streams early, and requests with fields no
worker honours are sent every minute. The test reads the soak's own JSON and asserts each
check's numbers, not only that it ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import soak

pytestmark = [pytest.mark.timeout(900), pytest.mark.soak]
KINDS = {
    "worker_kill",
    "registry_kill",
    "redis_kill",
    "s3_stop",
    "worker_stop",
    "trainer_kill",
    "registry_kill_registering",
}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    var = tmp_path_factory.mktemp("soak")
    out = var / "soak.json"
    code = soak.main(
        [
            "--minutes",
            "2",
            "--adapters",
            "120",
            "--faults-per-kind",
            "1",
            "--seed",
            "1",
            "--var",
            str(var),
            "--out",
            str(out),
        ]
    )
    data: dict[str, Any] = json.loads(out.read_text())
    data["exit_code"] = code
    assert Path(out.with_suffix(".png")).stat().st_size > 10_000
    return data


def test_every_fault_kind_happened_and_recovered(result: dict[str, Any]) -> None:
    assert {f["kind"] for f in result["faults"]} == KINDS
    for kind, rec in result["recovery"].items():
        assert rec["recovered"] == rec["faults"] == 1, (kind, rec)
    killed = next(f for f in result["faults"] if f["kind"] == "registry_kill")
    assert killed["upload_in_flight"]["half_sent"]  # the kill landed mid-upload


def test_nothing_lost(result: dict[str, Any]) -> None:
    state = result["state"]
    assert state["uploads_acknowledged"] > 120  # the seeded ones and the soak's own
    assert state["not_listed"] == state["not_downloadable"] == []
    assert state["sha_reply_mismatch"] == 0 and state["deleted_but_listed"] == []
    assert state["bindings_wrong"] == [] and state["blobs_missing"] == []
    acked = result["tenant_changes_acknowledged"]
    assert acked.get("upload", 0) and acked.get("swap", 0) and acked.get("bind", 0)


def test_no_wrong_answer_and_no_unaccounted_error(result: dict[str, Any]) -> None:
    wrong = result["wrong_answers"]
    assert wrong["checked"] > 500 and wrong["wrong"] == 0, wrong
    classes = result["errors"]["classes"]
    assert classes.get("http_500", 0) == 0
    assert result["errors"]["unaccounted"] == 0, result["errors"]["examples"]


def test_every_check_passes(result: dict[str, Any]) -> None:
    failed = [c for c in result["checks"] if not c["pass"]]
    assert not failed and result["passed"] and result["exit_code"] == 0, failed


def test_fine_tuning_jobs_survive_their_faults(result: dict[str, Any]) -> None:
    """The killed trainer's job failed with that reason; the job whose registration the
    registry's death interrupted was registered by the restarted registry; every other job
    ended, and every succeeded one is served."""
    faults = {f["kind"]: f for f in result["faults"]}
    killed = faults["trainer_kill"]
    assert killed["job"] and (killed["job_status"], killed["job_error"]) == (
        "failed",
        "training_failed",
    ), killed
    registering = faults["registry_kill_registering"]
    assert registering["job"] and registering["status_at_kill"] == "running", registering
    assert registering["job_status"] == "succeeded", registering
    jobs = result["state"]["finetune"]
    assert jobs["not_terminal"] == jobs["cancel_ignored"] == jobs["output_left"] == []
    assert jobs["not_listed"] == jobs["not_served"] == []
    assert jobs["served"] == jobs["by_status"]["succeeded"] >= 1


def test_a_hostile_tenant_is_refused_on_its_own_limits_while_the_others_are_served(
    result: dict[str, Any],
) -> None:
    """Every shared resource has a per-tenant bound: the hostile tenant gets 429/413 naming
    its own limit on both of its attacks, the honest tenants' p99 stays near the calm
    window's, and their files and fine-tuning calls are never refused for load."""
    tenancy = result["tenancy"]
    iso = tenancy["isolation"]
    assert min(iso["answers_calm"], iso["answers_hostile"]) >= 20, iso
    assert iso["p99_hostile_s"] <= 3 * iso["p99_calm_s"] + 0.5, iso
    assert iso["refused_hostile"] <= iso["refused_calm"], iso
    hostile = tenancy["hostile"]
    assert set(hostile) == {"slow_upload", "tokenize"}, hostile
    for kind, seen in hostile.items():
        assert seen["refused"] > 0 and seen["named_own_limit"] == seen["refused"], (kind, seen)
        assert seen["http_500"] == 0, (kind, seen)
    calls = tenancy["tenant_calls"]
    assert calls["calls"] > 0 and calls["unavailable"] == 0, calls


def test_streams_their_clients_left_are_billed(result: dict[str, Any]) -> None:
    """Clients that hang up after the headers or mid-stream, on both APIs: the tenant's
    usage is at least their requests, their prompts' tokens and the deltas they read."""
    bill = result["tenancy"]["billing"]
    assert set(bill["by_mode"]) == {
        "chat/headers",
        "chat/midstream",
        "responses/headers",
        "responses/midstream",
    }, bill
    assert bill["counted"] >= 10 and bill["short"] == {}, bill
    for field, least in bill["expected_at_least"].items():
        assert bill["billed"][field] >= least > 0, (field, bill)


def test_no_request_field_is_silently_ignored(result: dict[str, Any]) -> None:
    """tools without a tool-call parser and kv_transfer_params (top-level or in vllm_xargs)
    are each a 400 with their code, never answered as if absent."""
    probes = result["tenancy"]["unsupported"]
    assert probes["wrong"] == 0 and probes["judged"] >= 5, probes
    fields = {(p["path"], p["field"]) for p in result["unsupported_probes"]}
    assert fields == {
        ("/v1/responses", "tools"),
        ("/v1/responses", "tool_choice"),
        ("/v1/chat/completions", "tools"),
        ("/v1/chat/completions", "kv_transfer_params"),
        ("/v1/chat/completions", "vllm_xargs.kv_transfer_params"),
    }
    judged = [p for p in result["unsupported_probes"] if p["status"] not in (0, 502, 503)]
    assert all(p["status"] == 400 and p["code"] == p["expected_code"] for p in judged), judged
