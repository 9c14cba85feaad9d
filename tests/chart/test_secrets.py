"""Secrets only ever travel through Secret objects: no credential sits in a plain env value,
an argument, a ConfigMap or an annotation; generated secrets survive upgrades, and with
existingSecret values (GitOps) the chart generates nothing and renders reproducibly."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.chart.manifests import container, env, pod_spec, secret_marker, workloads
from tests.chart.support import CHART, SCENARIOS, Rendered, run_helm, template_args

ALL = list(SCENARIOS)
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|SECRET|ACCESS_KEY|API_KEY|CREDENTIAL|AUTH", re.IGNORECASE)


def containers(rendered: Rendered) -> list[dict[str, Any]]:
    found = [
        c
        for w in workloads(rendered)
        for c in pod_spec(w).get("initContainers", []) + pod_spec(w)["containers"]
    ]
    found += [c for p in rendered.of_kind("Pod") for c in p["spec"]["containers"]]
    return found


@pytest.mark.parametrize("scenario", ALL)
def test_credentials_come_from_secret_refs(scenarios: dict[str, Rendered], scenario: str) -> None:
    for spec in containers(scenarios[scenario]):
        for item in spec.get("env", []):
            if SECRET_NAME.search(item["name"]):
                assert "value" not in item, f"{spec['name']}: {item['name']} is a plain value"
                assert set(item["valueFrom"]) == {"secretKeyRef"}
            if item["name"].endswith("REDIS_URL"):
                password = urlparse(item["value"]).password
                assert password in (None, "$(REDIS_PASSWORD)"), item


@pytest.mark.parametrize("scenario", ALL)
def test_generated_secret_values_appear_nowhere_else(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    generated = rendered.of_kind("Secret")
    others = yaml.safe_dump_all([d for d in rendered.docs if d["kind"] != "Secret"])
    for secret in generated:
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        for encoded in secret["data"].values():
            plain = base64.b64decode(encoded).decode()
            assert len(plain) >= 32 and plain.isalnum()
            assert plain not in others and encoded not in others


@pytest.mark.parametrize("scenario", ALL)
def test_secret_refs_point_at_rendered_or_named_secrets(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    generated = {s["metadata"]["name"]: set(s["data"]) for s in rendered.of_kind("Secret")}
    values_files = [yaml.safe_load((CHART / p).read_text()) for p in SCENARIOS[scenario]]
    named = {m for v in values_files for m in re.findall(r"existingSecret': '([^']+)'", str(v))}
    for spec in containers(rendered):
        for item in spec.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref is None:
                continue
            if ref["name"] in generated:
                assert ref["key"] in generated[ref["name"]]
            else:
                assert ref["name"] in named, f"{ref['name']} is neither rendered nor named"


def test_existing_secrets_replace_the_generated_ones(scenarios: dict[str, Rendered]) -> None:
    """A Secret is generated exactly for what the values do not name: the admin token unless
    registry.adminToken.existingSecret, the Redis password only for the bundled Redis."""

    def generated(scenario: str) -> set[str]:
        return {
            s["metadata"]["labels"]["app.kubernetes.io/component"]
            for s in scenarios[scenario].of_kind("Secret")
        }

    assert generated("default") == {"registry", "redis"}
    assert generated("external-s3") == {"redis"}  # admin token from Secret preft-admin
    assert generated("ha") == {"registry"}  # external Redis, password from preft-redis
    assert generated("platform") == set()  # GitOps: secrets.generate=false, all named


def test_named_secrets_reach_every_client(scenarios: dict[str, Rendered]) -> None:
    """platform-values names all three Secrets: no Secret is rendered, and every consumer
    refers to the named Secret and key."""
    rendered = scenarios["platform"]
    assert rendered.of_kind("Secret") == []
    registry = env(container(rendered.component("Deployment", "registry")))
    assert registry["PREFT_REGISTRY_ADMIN_TOKEN"] == secret_marker("platform-preft-admin", "token")
    redis_password = secret_marker("platform-preft-redis", "password")
    redis = env(container(rendered.component("StatefulSet", "redis"), "redis"))
    assert redis["REDIS_PASSWORD"] == redis["REDISCLI_AUTH"] == redis_password
    for component in ("gateway", "registry", "worker"):
        values = env(container(rendered.component("Deployment", component), component))
        assert values["REDIS_PASSWORD"] == redis_password, component
        if component != "gateway":
            assert values["AWS_ACCESS_KEY_ID"] == secret_marker(
                "platform-preft-s3", "AWS_ACCESS_KEY_ID"
            )
            assert values["AWS_SECRET_ACCESS_KEY"] == secret_marker(
                "platform-preft-s3", "AWS_SECRET_ACCESS_KEY"
            )


def test_offline_renders_are_reproducible(helm: str) -> None:
    """What Argo CD does on every sync: `helm template` without a cluster. With the Secrets
    named, two renders are identical; with generated ones, only the Secrets' data differs
    (the documented caveat) and, following it, the checksum/config of the pods reading
    them; nothing else in the manifests is random."""

    def template(values: list[str]) -> str:
        result = run_helm(helm, *template_args(values))
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert template(["ci/platform-values.yaml"]) == template(["ci/platform-values.yaml"])
    first, second = (yaml.safe_load_all(template([])) for _ in range(2))
    changed = []
    for a, b in zip(first, second, strict=True):
        if a["kind"] in ("Deployment", "StatefulSet"):
            for doc in (a, b):
                pod = doc["spec"]["template"]["metadata"]
                pod.get("annotations", {}).pop("checksum/config", None)
        if a != b:
            changed.append(f"{a['kind']}/{a['metadata']['name']}")
    assert sorted(changed) == [
        "Secret/prod-preft-serve-redis",
        "Secret/prod-preft-serve-registry-admin",
    ]


def test_turning_generation_off_requires_each_secret(
    render_error: Callable[..., str], render: Callable[..., Rendered]
) -> None:
    message = render_error([], {"secrets.generate": "false"})
    assert "registry.adminToken.existingSecret is required when secrets.generate=false" in message
    assert "redis.auth.existingSecret is required when secrets.generate=false" in message
    message = render_error(
        [], {"secrets.generate": "false", "registry.adminToken.existingSecret": "admin"}
    )
    assert "registry.adminToken" not in message and "redis.auth.existingSecret" in message
    # An external Redis needs no generated password (its Secret is optional).
    rendered = render(
        [],
        {
            "secrets.generate": "false",
            "registry.adminToken.existingSecret": "admin",
            "redis.enabled": "false",
            "redis.external.host": "redis.internal",
        },
    )
    assert rendered.of_kind("Secret") == []


def test_s3_credentials_reach_registry_and_workers_only(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["external-s3"]
    holders = set()
    for workload in workloads(rendered):
        for spec in pod_spec(workload)["containers"]:
            refs = {
                i["name"]: i["valueFrom"]["secretKeyRef"]
                for i in spec.get("env", [])
                if "valueFrom" in i
            }
            if "AWS_SECRET_ACCESS_KEY" in refs:
                assert refs["AWS_SECRET_ACCESS_KEY"] == {
                    "name": "preft-s3-credentials",
                    "key": "secret-key",
                }
                assert refs["AWS_ACCESS_KEY_ID"] == {
                    "name": "preft-s3-credentials",
                    "key": "access-key",
                }
                holders.add(workload["metadata"]["labels"]["app.kubernetes.io/component"])
    assert holders == {"registry", "worker"}


def test_irsa_annotations_go_on_the_s3_service_accounts(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["ha"]
    role = "arn:aws:iam::123456789012:role/preft-serve-s3"
    for component, expected in [("registry", role), ("worker", role), ("gateway", None)]:
        account = rendered.get(
            "ServiceAccount",
            pod_spec(rendered.component("Deployment", component))["serviceAccountName"],
        )
        annotations = account["metadata"].get("annotations", {})
        assert annotations.get("eks.amazonaws.com/role-arn") == expected


def test_secrets_cannot_be_given_as_plain_values(render_error: Callable[..., str]) -> None:
    """There is no value for a raw token, password or key: the schema refuses them."""
    for key in ("registry.adminToken.value", "redis.auth.password", "objectStore.secretAccessKey"):
        message = render_error([], {key: "x" * 32})
        assert "additional properties" in message
        assert key.rsplit(".", 1)[1] in message
