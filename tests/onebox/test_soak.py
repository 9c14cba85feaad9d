"""The soak with chaos, short: 2 minutes, one fault of each kind (``loadtests/soak/``).

The whole stack as processes (moto S3, Redis with AOF, registry, two CPU workers, gateway)
under traffic at 70% of measured capacity and concurrent tenant changes, while a worker is
SIGKILLed, the registry SIGKILLed mid-upload, Redis SIGKILLed and restarted from its AOF,
S3 paused for 20 s, a worker paused for 10 s, a trainer SIGKILLed and the registry
SIGKILLed while it registers a finished job's adapter; fine-tuning jobs are created and
cancelled throughout. The test reads the soak's own JSON and asserts each check's numbers,
not only that it ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtests import soak

pytestmark = pytest.mark.timeout(900)
KINDS = {"worker_kill", "registry_kill", "redis_kill", "s3_stop", "worker_stop",
         "trainer_kill", "registry_kill_registering"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    var = tmp_path_factory.mktemp("soak")
    out = var / "soak.json"
    code = soak.main(["--minutes", "2", "--adapters", "120", "--faults-per-kind", "1",
                      "--seed", "1", "--var", str(var), "--out", str(out)])
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
        "failed", "training_failed"), killed
    registering = faults["registry_kill_registering"]
    assert registering["job"] and registering["status_at_kill"] == "running", registering
    assert registering["job_status"] == "succeeded", registering
    jobs = result["state"]["finetune"]
    assert jobs["not_terminal"] == jobs["cancel_ignored"] == jobs["output_left"] == []
    assert jobs["not_listed"] == jobs["not_served"] == []
    assert jobs["served"] == jobs["by_status"]["succeeded"] >= 1
