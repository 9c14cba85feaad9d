"""`helm upgrade` rolls the pods whose configuration changed, and only those: each pod
template carries a checksum/config annotation over the chart's ConfigMaps and generated
Secrets it reads (env, envFrom, volumes are read once, when a pod starts)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chart.manifests import container, env, workloads
from tests.chart.support import Rendered

# Named Secrets: nothing random in the render, so any difference is the values' doing.
PLATFORM = ["ci/platform-values.yaml"]
TRAINER = {"trainer.enabled": "true"}


def pod_annotations(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """Pod template annotations by workload component."""
    return {
        w["metadata"]["labels"]["app.kubernetes.io/component"]: w["spec"]["template"][
            "metadata"
        ].get("annotations", {})
        for w in workloads(rendered)
    }


def checksums(rendered: Rendered) -> dict[str, str | None]:
    return {c: a.get("checksum/config") for c, a in pod_annotations(rendered).items()}


def test_new_trainer_limits_roll_the_registry_and_nothing_else(
    render: Callable[..., Rendered],
) -> None:
    before = render(PLATFORM, TRAINER)
    after = render(
        PLATFORM,
        {**TRAINER, "trainer.limits.maxSteps": "500", "trainer.limits.maxQueuedPerTenant": "9"},
    )
    # The registry loads the trainer ConfigMap with envFrom: only the ConfigMap changed...
    changed = [
        d["metadata"]["name"] for d, e in zip(before.docs, after.docs, strict=True) if d != e
    ]
    assert changed == [
        before.component("ConfigMap", "trainer")["metadata"]["name"],
        before.component("Deployment", "registry")["metadata"]["name"],
    ]
    # ...and the registry's pod template, through its checksum alone.
    old, new = pod_annotations(before), pod_annotations(after)
    assert old["registry"]["checksum/config"] != new["registry"]["checksum/config"]
    assert {k: v for k, v in old["registry"].items() if k != "checksum/config"} == {
        k: v for k, v in new["registry"].items() if k != "checksum/config"
    }
    assert {c: a for c, a in old.items() if c != "registry"} == {
        c: a for c, a in new.items() if c != "registry"
    }


def test_a_new_base_model_config_rolls_the_registry(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    def with_config(hidden_size: int) -> dict[str, str | None]:
        config = {"model_type": "llama", "hidden_size": hidden_size}
        path = tmp_path / f"config-{hidden_size}.yaml"
        path.write_text(json.dumps({"registry": {"modelConfig": json.dumps(config)}}))
        return checksums(render([*PLATFORM, str(path)]))

    before, after = with_config(64), with_config(128)
    assert before["registry"] and before["registry"] != after["registry"]
    assert {c: v for c, v in before.items() if c != "registry"} == {
        c: v for c, v in after.items() if c != "registry"
    }


def test_pods_carry_the_checksum_of_the_generated_secrets_they_read(
    render: Callable[..., Rendered],
) -> None:
    """Offline, each render generates new Secrets (lookup has no cluster): exactly the pods
    that read a generated Secret see their checksum move with it; a pod reading no chart
    configuration has none."""
    first, second = (render([], {"disaggregation.enabled": "true"}) for _ in range(2))

    def secret_values(rendered: Rendered) -> dict[str, str]:
        return {
            s["metadata"]["labels"]["app.kubernetes.io/component"]: base64.b64decode(
                next(iter(s["data"].values()))
            ).decode()
            for s in rendered.of_kind("Secret")
        }

    assert secret_values(first)["redis"] != secret_values(second)["redis"]
    one, two = checksums(first), checksums(second)
    readers = {"gateway", "registry", "worker", "redis"}
    assert {c for c, v in one.items() if v} == readers
    assert one["decode-worker"] is None  # the base model alone: no Redis, no ConfigMap
    for component in readers:
        assert one[component] != two[component], component
    # The Redis password alone: the same checksum for all its readers in one render.
    assert one["gateway"] == one["worker"] == one["redis"] != one["registry"]


def test_the_operator_view_gives_the_gateways_the_registrys_admin_token(
    render: Callable[..., Rendered],
) -> None:
    """Off by default (the public gateways then hold no admin secret); on, the gateways read
    the registry's own token from its Secret and roll when it changes, as the registry
    does."""
    default = render([], {})
    gateway = container(default.component("Deployment", "gateway"))
    assert "PREFT_GATEWAY_ADMIN_TOKEN" not in env(gateway)

    first, second = (render([], {"gateway.operatorView": "true"}) for _ in range(2))
    registry_token = env(container(first.component("Deployment", "registry")))[
        "PREFT_REGISTRY_ADMIN_TOKEN"
    ]
    gateway_env = env(container(first.component("Deployment", "gateway")))
    assert gateway_env["PREFT_GATEWAY_ADMIN_TOKEN"] == registry_token
    assert registry_token.startswith("secret.")  # from the Secret, never a plain value
    one, two = checksums(first), checksums(second)
    assert one["gateway"] != two["gateway"]  # new admin token (offline render): rolls
