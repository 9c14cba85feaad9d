"""Reading rendered pod specs: containers, environment (secrets resolved to markers,
``$(VAR)`` references expanded as the kubelet does), selectors."""

from __future__ import annotations

import re
from typing import Any

from tests.chart.support import Rendered

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return (
        workload["spec"]["template"]["spec"] if "template" in workload["spec"] else workload["spec"]
    )


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def secret_marker(name: str, key: str) -> str:
    """A URL-safe stand-in for a secret value (so URLs built from it still parse)."""
    return f"secret.{name}.{key}"


def field_marker(path: str) -> str:
    """A stand-in for a downward-API value (fieldRef), e.g. ``field.status.podIP``."""
    return f"field.{path}"


def env(container_spec: dict[str, Any]) -> dict[str, str]:
    """Name -> value; secretKeyRef values become :func:`secret_marker` strings, fieldRef
    values :func:`field_marker` strings."""
    resolved: dict[str, str] = {}
    for item in container_spec.get("env", []):
        if "value" in item:
            value = _REF.sub(lambda m: resolved.get(m.group(1), m.group(0)), str(item["value"]))
        elif "fieldRef" in item["valueFrom"]:
            value = field_marker(item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            value = secret_marker(ref["name"], ref["key"])
        resolved[item["name"]] = value
    return resolved


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def workloads(rendered: Rendered) -> list[dict[str, Any]]:
    return rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")


def selected_workloads(rendered: Rendered, selector: dict[str, str]) -> list[dict[str, Any]]:
    """Workloads whose pods carry every label of ``selector``."""
    return [
        w
        for w in workloads(rendered)
        if labels_match(selector, w["spec"]["template"]["metadata"]["labels"])
    ]


def container_port(container_spec: dict[str, Any], port: str | int) -> int:
    """The container port a named or numbered Service/probe port refers to."""
    for item in container_spec.get("ports", []):
        if port in (item.get("name"), item["containerPort"]):
            return int(item["containerPort"])
    raise AssertionError(f"container {container_spec['name']} has no port {port!r}")
