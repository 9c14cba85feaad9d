"""One chart value, worker.maxLoraRank, sets the workers' --max-lora-rank and the registry's
MAX_LORA_RANK, and its default is the services' own (common/rank_caps.py): a registry
that accepts ranks its workers refuse answers 201 to an upload and 400 to every request."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from preft_serve.common.rank_caps import RANK_CAPS
from preft_serve.registry.settings import RegistrySettings
from preft_serve.worker import serve
from tests.chart.manifests import container, env
from tests.chart.support import SCENARIOS, Rendered

ENV = "PREFT_REGISTRY_MAX_LORA_RANK"


def ranks(rendered: Rendered, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[int, int]:
    """(worker's --max-lora-rank, registry's max_lora_rank), each as its service parses it."""
    worker_args = container(rendered.component("Deployment", "worker"))["args"]
    worker, _ = serve.parser().parse_known_args(worker_args)
    for name in [n for n in os.environ if n.startswith("PREFT_REGISTRY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(ENV, env(container(rendered.component("Deployment", "registry")))[ENV])
    (tmp_path / "config.json").write_text("{}")
    registry = RegistrySettings(admin_token="a-real-random-secret-9f8e7d", base_model=tmp_path)
    return worker.max_lora_rank, registry.max_lora_rank


def test_chart_default_is_the_services_default(values: dict[str, Any]) -> None:
    assert values["worker"]["maxLoraRank"] == RANK_CAPS.max_lora_rank
    assert serve.parser().parse_args(["--model", "m"]).max_lora_rank == RANK_CAPS.max_lora_rank
    assert RegistrySettings.model_fields["max_lora_rank"].default == RANK_CAPS.max_lora_rank


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios_give_workers_and_registry_one_rank(
    scenarios: dict[str, Rendered], scenario: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    worker, registry = ranks(scenarios[scenario], monkeypatch, tmp_path)
    assert worker == registry
    if scenario == "default":
        assert worker == RANK_CAPS.max_lora_rank


def test_override_reaches_both(
    render: Callable[..., Rendered], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert RANK_CAPS.max_lora_rank != 64
    rendered = render([], {"worker.maxLoraRank": "64"})
    assert ranks(rendered, monkeypatch, tmp_path) == (64, 64)


@pytest.mark.parametrize(
    "sets",
    [
        {"registry.settings.MAX_RANK": "64"},
        {"registry.settings.max_lora_rank": "64"},
        {"registry.extraEnv[0].name": ENV, "registry.extraEnv[0].value": "64"},
        {"worker.extraArgs[0]": "--max-lora-rank=64"},
    ],
)
def test_setting_one_side_alone_is_refused(
    render_error: Callable[..., str], sets: dict[str, str]
) -> None:
    message = render_error([], sets)
    assert "set worker.maxLoraRank" in message
    assert "which must agree" in message
