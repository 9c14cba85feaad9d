"""Session fixtures: helm and promtool, and the chart rendered once per values scenario."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.chart.support import (
    CHART,
    ROOT,
    SCENARIOS,
    Rendered,
    find_tool,
    parse,
    run_helm,
    template_args,
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PREFT_* settings leak in from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("PREFT_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def helm() -> str:
    return find_tool("helm", "HELM", ROOT / ".tools" / "bin" / "helm")


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool", "PROMTOOL")


@pytest.fixture(scope="session")
def render(helm: str) -> Callable[..., Rendered]:
    """``render(values_files, sets)``: the parsed manifests; fails with helm's stderr."""

    def _render(values: list[str] | None = None, sets: dict[str, str] | None = None) -> Rendered:
        result = run_helm(helm, *template_args(values or [], sets))
        assert result.returncode == 0, result.stderr
        return parse(result.stdout)

    return _render


@pytest.fixture(scope="session")
def render_error(helm: str) -> Callable[..., str]:
    """``render_error(values_files, sets)``: helm's error message for values it must refuse."""

    def _render_error(values: list[str] | None = None, sets: dict[str, str] | None = None) -> str:
        result = run_helm(helm, *template_args(values or [], sets))
        assert result.returncode != 0, "helm template accepted values it should refuse"
        return result.stderr

    return _render_error


@pytest.fixture(scope="session")
def scenarios(render: Callable[..., Rendered]) -> dict[str, Rendered]:
    """Every scenario rendered once for the whole session."""
    return {name: render(values) for name, values in SCENARIOS.items()}


@pytest.fixture(scope="session")
def values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())
