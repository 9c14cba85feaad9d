"""Chart test helpers: scenarios, running helm, the parsed manifests.

helm comes from ``make helm`` (``.tools/bin/helm``, installed by ``make test`` and CI), or
``$HELM``, or ``helm`` on PATH. Without it the chart tests are skipped locally and fail in
CI (``CI`` set), so a CI machine cannot pass them by accident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "preft-serve"
CI_VALUES = CHART / "ci"
RELEASE = "prod"
NAMESPACE = "llm"
# Scenario name -> values files (relative to the chart); "default" is values.yaml alone.
SCENARIOS: dict[str, list[str]] = {
    "default": [],
    **{
        p.name.removesuffix("-values.yaml"): [f"ci/{p.name}"]
        for p in sorted(CI_VALUES.glob("*-values.yaml"))
    },
}


def find_tool(name: str, env: str, local: Path | None = None) -> str:
    """Path of a CLI tool, else skip (fail under CI) with how to get it."""
    candidates = [os.environ.get(env), str(local) if local else None, shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    message = f"{name} not found (${env}, {local or 'PATH'}); `make helm` or .ci/run installs it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Rendered:
    """The manifests of one ``helm template`` run, indexed by kind and name."""

    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def component(self, kind: str, component: str) -> dict[str, Any]:
        """The one ``kind`` object labelled app.kubernetes.io/component=``component``."""
        found = [
            d
            for d in self.of_kind(kind)
            if d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
        return found[0]

    def has(self, kind: str, component: str) -> bool:
        return any(
            d["metadata"]["labels"].get("app.kubernetes.io/component") == component
            for d in self.of_kind(kind)
        )


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def template_args(values: list[str], sets: dict[str, str] | None = None) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for path in values:
        args += ["-f", str(CHART / path)]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    return args


def parse(stdout: str) -> Rendered:
    return Rendered([d for d in yaml.safe_load_all(stdout) if d])
