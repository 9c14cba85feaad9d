"""The services' settings share one base, and their flags are derived from the fields."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from preft_serve.common.service_main import add_settings_flags, flag_overrides, load_settings
from preft_serve.common.service_settings import ServiceSettings
from preft_serve.gateway.__main__ import FLAGS as GATEWAY_FLAGS
from preft_serve.gateway.settings import DiscoveryKind, GatewaySettings
from preft_serve.registry.__main__ import FLAGS as REGISTRY_FLAGS
from preft_serve.registry.settings import RegistrySettings
from preft_serve.worker.settings import WorkerSettings

SHARED = ("redis_url", "namespace", "host", "port", "log_level", "log_json", "keepalive_s")


@pytest.mark.parametrize("cls", [GatewaySettings, RegistrySettings])
def test_services_share_the_base_fields_and_namespace_rule(cls: type[ServiceSettings]) -> None:
    assert issubclass(cls, ServiceSettings)
    for name in SHARED:
        assert name in cls.model_fields
    assert (
        cls.model_fields["namespace"].metadata == ServiceSettings.model_fields["namespace"].metadata
    )


@pytest.mark.parametrize("bad", ["a:b", "x" * 33, ""])
def test_every_namespace_field_refuses_key_separators_and_long_names(bad: str) -> None:
    with pytest.raises(ValidationError, match="namespace"):
        GatewaySettings(namespace=bad, worker_urls=["http://w:8000"])
    with pytest.raises(ValidationError, match="registry_namespace"):
        WorkerSettings(registry_namespace=bad)


def gateway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_settings_flags(
        parser, GatewaySettings, "PREFT_GATEWAY_", GATEWAY_FLAGS, {"worker_urls": "--workers"}
    )
    return parser


def test_flag_help_shows_the_fields_own_default_and_variable() -> None:
    text = gateway_parser().format_help()
    default_port = GatewaySettings.model_fields["port"].default
    assert f"(PREFT_GATEWAY_PORT, default {default_port})" in text
    assert "--workers" in text and "--worker-urls" not in text
    for kind in DiscoveryKind:
        assert kind.value in text


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFT_GATEWAY_PORT", "9000")
    monkeypatch.setenv("PREFT_GATEWAY_WORKER_URLS", "http://env:8000")
    parser = gateway_parser()
    args = parser.parse_args(
        [
            "--workers",
            "http://a:1,http://b:2",
            "--tenant-rps",
            "2.5",
            "--log-json",
            "--discovery",
            "static",
        ]
    )
    settings = load_settings(
        parser, GatewaySettings, flag_overrides(args, GATEWAY_FLAGS), "PREFT_GATEWAY_"
    )
    assert settings.worker_urls == ["http://a:1", "http://b:2"]
    assert settings.tenant_rps == 2.5 and settings.log_json is True
    assert settings.port == 9000  # no flag given: the environment's value stays


def test_registry_flags_reach_aliased_fields(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, RegistrySettings, "PREFT_REGISTRY_", REGISTRY_FLAGS)
    args = parser.parse_args(["--base-model", str(tmp_path), "--max-lora-rank", "32"])
    settings = load_settings(
        parser,
        RegistrySettings,
        {**flag_overrides(args, REGISTRY_FLAGS), "admin_token": "a-random-secret-0123456789"},
        "PREFT_REGISTRY_",
    )
    assert settings.max_lora_rank == 32 and settings.base_model == tmp_path


def test_an_invalid_flag_value_is_a_usage_error_naming_the_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = gateway_parser()
    args = parser.parse_args(["--workers", "ftp://nope"])
    with pytest.raises(SystemExit) as exc:
        load_settings(
            parser, GatewaySettings, flag_overrides(args, GATEWAY_FLAGS), "PREFT_GATEWAY_"
        )
    assert exc.value.code == 2
    assert "WORKER_URLS" in capsys.readouterr().err


@pytest.mark.parametrize("raw", ["http://a:1,http://b:2", '["http://a:1", "http://b:2"]'])
def test_worker_urls_from_the_environment_as_comma_or_json_list(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    """The help promises a comma list, which pydantic-settings alone would refuse as bad JSON."""
    monkeypatch.setenv("PREFT_GATEWAY_WORKER_URLS", raw)
    assert GatewaySettings().worker_urls == ["http://a:1", "http://b:2"]
