"""Gateway configuration: environment, flags and clear errors."""

from __future__ import annotations

import pytest

from preft_serve.gateway.__main__ import main
from preft_serve.gateway.settings import GatewaySettings


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFT_GATEWAY_WORKER_URLS", '["http://w1:8000/", "http://w2:8000"]')
    monkeypatch.setenv("PREFT_GATEWAY_MAX_TOKENS_CAP", "64")
    settings = GatewaySettings()  # type: ignore[call-arg]
    assert settings.worker_urls == ["http://w1:8000", "http://w2:8000"]
    assert settings.max_tokens_cap == 64
    assert settings.worker_model == settings.base_model_name == "base"


def test_comma_separated_workers_and_bad_urls() -> None:
    settings = GatewaySettings(worker_urls="http://a:1, http://b:2")  # type: ignore[arg-type]
    assert settings.worker_urls == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="must start with http"):
        GatewaySettings(worker_urls=["ftp://a"])


def test_cli_reports_invalid_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFT_GATEWAY_WORKER_URLS", raising=False)
    with pytest.raises(SystemExit):
        main([])
    assert "WORKER_URLS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--workers", "ftp://x"])
    assert "must start with http" in capsys.readouterr().err


def test_token_limit_flags_reach_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--workers", "http://w:8000", "--user-tpm", "-5"])
    assert "USER_TPM: Input should be greater than or equal to 0" in capsys.readouterr().err
