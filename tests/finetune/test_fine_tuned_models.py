"""A fine-tuned model (an adapter) through the gateway, on a real registry: ``name@version``
pins one version in ``model``, and ``client.models.delete`` deletes it with the registry's
own check (the tenant's key, 409 while users are bound)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from preft_serve.adapters.format import format_model_name
from tests.finetune.test_through_gateway import BASE, Stack, stack  # noqa: F401 (fixture)
from tests.support.gateway import MSGS


def upload(s: Stack, key: str, model_dir: Path, tmp_path: Path, name: str, seed: int) -> str:
    """A new version of adapter ``name``; returns its sha256."""
    from preft_serve.toymodels import make_lora_adapter

    folder = make_lora_adapter(model_dir, tmp_path / f"{name}-{seed}", seed=seed)
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]
    reply = s.registry.call(
        key,
        "PUT",
        f"/v1/adapters/{name}",
        params={"promote": "true"},
        data={"mode": "prefill"},
        files=files,
    )
    assert reply.status_code == 201, reply.text
    return str(reply.json()["sha256"])


def test_name_at_version_pins_a_version_and_a_missing_one_is_a_clear_404(
    stack: Callable[..., Stack],  # noqa: F811
    model_dir: Path,
    tmp_path: Path,
) -> None:
    s = stack()
    key, other = s.registry.tenant("acme"), s.registry.tenant("globex")
    first = upload(s, key, model_dir, tmp_path, "carol", 1)
    second = upload(s, key, model_dir, tmp_path, "carol", 2)
    client = s.client(key)
    for model, sha, version in (
        ("carol@1", first, "1"),
        ("carol@2", second, "2"),
        ("carol", second, "2"),
    ):
        raw = client.chat.completions.with_raw_response.create(model=model, messages=MSGS)  # type: ignore[arg-type]
        assert s.workers.seen[-1]["model"] == format_model_name(sha), model
        assert raw.headers["x-preft-adapter"] == "carol"
        assert raw.headers["x-preft-adapter-version"] == version
        assert raw.parse().model == "carol"
    assert client.models.retrieve("carol@1").id == "carol@1"

    seen = len(s.workers.seen)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="carol@3", messages=MSGS)  # type: ignore[arg-type]
    assert missing.value.body["message"] == (  # type: ignore[index]
        "adapter 'carol' has no version 3; its versions are 1 to 2 ('carol' alone is version 2)"
    )
    assert missing.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as theirs:
        s.client(other).chat.completions.create(model="carol@1", messages=MSGS)  # type: ignore[arg-type]
    assert "model 'carol@1' does not exist" in str(theirs.value)
    for odd in ("carol@0", "carol@", "carol@1@1", "carol@x"):
        assert (
            httpx.post(
                f"{s.gateway}/v1/chat/completions",
                json={"model": odd, "messages": MSGS},
                headers={"Authorization": f"Bearer {key}"},
            ).status_code
            == 404
        ), odd
    assert len(s.workers.seen) == seen


def test_models_delete_deletes_a_fine_tuned_model_with_the_registrys_check(
    stack: Callable[..., Stack],  # noqa: F811
    model_dir: Path,
    tmp_path: Path,
) -> None:
    s = stack()
    key, other = s.registry.tenant("acme"), s.registry.tenant("globex")
    upload(s, key, model_dir, tmp_path, "carol", 1)
    client = s.client(key)
    bound = s.registry.call(key, "PUT", "/v1/users/dana", json={"adapter": "carol"})
    assert bound.status_code == 200, bound.text

    with pytest.raises(openai.NotFoundError):  # another tenant's adapter: not theirs
        s.client(other).models.delete("carol")
    with pytest.raises(openai.ConflictError) as in_use:
        client.models.delete("carol")
    assert "dana" in str(in_use.value) or "bound" in str(in_use.value)
    with pytest.raises(openai.BadRequestError) as base:
        client.models.delete(BASE)
    assert "is the base model" in str(base.value)
    with pytest.raises(openai.BadRequestError) as pinned:
        client.models.delete("carol@1")
    assert "versions are not deleted one by one" in str(pinned.value)
    assert [m.id for m in client.models.list().data] == ["carol", BASE]

    assert s.registry.call(key, "DELETE", "/v1/users/dana").status_code in (200, 204)
    deleted = client.models.delete("carol")
    assert (deleted.id, deleted.object, deleted.deleted) == ("carol", "model", True)
    assert [m.id for m in client.models.list().data] == [BASE]
    with pytest.raises(openai.NotFoundError):
        client.models.delete("carol")
    with pytest.raises(openai.AuthenticationError):
        s.client("pft_nope.wrong").models.delete("carol")
