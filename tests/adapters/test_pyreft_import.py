"""pyreft checkpoints convert without pickle execution and keep pyreft's math.

pyreft itself cannot be installed here (it pins transformers 4.45.1; we run 5.x), so its
save format is rebuilt from pyvene's ``save``: ``intkey_<key>.bin`` per intervention and an
``IntervenableConfig`` ``config.json`` (``sorted_keys``, ``intervention_types`` as
``str(type)``, ``representations`` as lists)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from preft_serve.adapters.format import AdapterFormatError
from preft_serve.adapters.pyreft_import import convert
from preft_serve.worker.reft.adapter import load_reft_adapter

D, R = 32, 4


class LowRankRotateLayer(torch.nn.Module):
    """pyreft's rotate layer: h @ weight, weight (d, r) made orthogonal by torch."""

    def __init__(self, n: int, m: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, m))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class PyreftLike(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rotate_layer = torch.nn.utils.parametrizations.orthogonal(LowRankRotateLayer(D, R))
        self.learned_source = torch.nn.Linear(D, R)

    def loreft(self, h: torch.Tensor) -> torch.Tensor:  # pyreft LoreftIntervention.forward
        return h + (self.learned_source(h) - self.rotate_layer(h)) @ self.rotate_layer.weight.T

    def direft(self, h: torch.Tensor) -> torch.Tensor:  # pyreft DireftIntervention.forward
        return h + self.learned_source(h) @ self.rotate_layer.weight.T

    def loreft_state(self) -> dict:  # pyreft's compact LoReFT state_dict override
        state = dict(self.learned_source.state_dict())
        state["rotate_layer"] = self.rotate_layer.weight.data
        return state


def key_of(layer: int, idx: int, component: str = "block_output") -> str:
    return f"layer.{layer}.comp.{component}.unit.pos.nunit.1#{idx}"


def write_pyreft_config(
    src: Path, keys: list[str], cls: str, component: str = "block_output"
) -> None:
    """pyvene's IntervenableConfig.save_pretrained, reduced to what the converter reads."""
    reps = [
        [
            int(k.split(".")[1]),
            component,
            "pos",
            1,
            R,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ]
        for k in keys
    ]
    (src / "config.json").write_text(
        json.dumps(
            {
                "model_type": "<class 'transformers.models.llama.modeling_llama.LlamaForCausalLM'>",
                "representations": reps,
                "sorted_keys": keys,
                "intervention_types": [f"<class 'pyreft.interventions.{cls}'>"] * len(keys),
                "intervention_dimensions": [D] * len(keys),
            }
        )
    )


def pyreft_dir(tmp_path: Path, cls: str | None, component: str = "block_output") -> Path:
    src = tmp_path / "pyreft"
    src.mkdir()
    keys = [key_of(layer, idx, component) for layer in (1, 3) for idx in (0, 1)]
    for key in keys:
        torch.save(PyreftLike().loreft_state(), src / f"intkey_{key}.bin")
    if cls is not None:
        write_pyreft_config(src, keys, cls, component)
    return src


def delta(adapter, layer: int, part: int, h: torch.Tensor) -> torch.Tensor:
    iv = adapter.intervention(layer, part)
    return (h @ iv.proj_in.T + iv.bias) @ iv.proj_out


@pytest.mark.parametrize("kind", ["loreft", "direft"])
@pytest.mark.parametrize("with_config", [True, False])
def test_converted_adapter_reproduces_pyreft_interventions(tmp_path, kind, with_config) -> None:
    """With pyreft's config.json the type is read from it; without, --reft-type says it."""
    torch.manual_seed(0)
    modules = {(layer, idx): PyreftLike() for layer in (1, 3) for idx in (0, 1)}
    src = tmp_path / "pyreft"
    src.mkdir()
    for (layer, idx), module in modules.items():
        state = module.loreft_state() if kind == "loreft" else module.state_dict()
        torch.save(state, src / f"intkey_{key_of(layer, idx)}.bin")
    if with_config:
        cls = {"loreft": "LoreftIntervention", "direft": "DireftIntervention"}[kind]
        write_pyreft_config(src, [key_of(*k) for k in modules], cls)
    out = convert(
        src, tmp_path / "out", None if with_config else kind, "f3+l3", "base", share_weights=False
    )
    assert json.loads((out / "adapter_config.json").read_text())["reft_type"] == kind
    adapter = load_reft_adapter(out, hidden_size=D, num_layers=4)
    h = torch.randn(5, D)
    for (layer, idx), module in modules.items():
        with torch.no_grad():
            want = (module.loreft(h) if kind == "loreft" else module.direft(h)) - h
        torch.testing.assert_close(delta(adapter, layer, idx, h), want, rtol=1e-4, atol=1e-5)


def test_pickled_objects_are_refused_not_executed(tmp_path) -> None:
    src = tmp_path / "pyreft"
    src.mkdir()
    torch.save(
        {"weight": torch.zeros(R, D), "payload": torch.nn.Linear(2, 2)},
        src / "intkey_layer.0.comp.block_output#0.bin",
    )
    with pytest.raises(AdapterFormatError, match="more than plain tensors"):
        convert(src, tmp_path / "out", "loreft", "f1+l1", "base", share_weights=True)
    assert not (tmp_path / "out").exists()


def test_directory_without_pyreft_files_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(AdapterFormatError, match="intkey_"):
        convert(tmp_path, tmp_path / "out", "loreft", "f1+l1", "base", share_weights=True)


@pytest.mark.parametrize(
    "cls,component,requested,expected",
    [
        ("LoreftIntervention", "block_output", "direft", "does not match the checkpoint"),
        ("DireftIntervention", "block_output", "loreft", "pyreft's config.json says direft"),
        ("NoreftIntervention", "block_output", None, "is a NoreftIntervention"),
        ("ConsreftIntervention", "block_output", "loreft", "ConsreftIntervention"),
        ("LoreftIntervention", "mlp_output", None, "edits mlp_output"),
        ("LoreftIntervention", "attention_output", "loreft", "edits attention_output"),
        (None, "block_output", None, "pass --reft-type"),
        (None, "mlp_output", "loreft", "edits mlp_output"),
    ],
)
def test_what_the_format_cannot_represent_is_refused_and_nothing_written(
    tmp_path, cls, component, requested, expected
) -> None:
    src = pyreft_dir(tmp_path, cls, component)
    with pytest.raises(AdapterFormatError, match=expected):
        convert(src, tmp_path / "out", requested, "f3+l3", "base", share_weights=False)
    assert not (tmp_path / "out").exists()


def test_oversized_or_foreign_config_is_refused(tmp_path) -> None:
    src = pyreft_dir(tmp_path, None)
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(AdapterFormatError, match="not pyreft's"):
        convert(src, tmp_path / "out", "loreft", "f3+l3", "base", share_weights=False)
    (src / "config.json").write_text(" " * ((1 << 20) + 1))
    with pytest.raises(AdapterFormatError, match="over"):
        convert(src, tmp_path / "out", "loreft", "f3+l3", "base", share_weights=False)


def test_command_line_error_is_a_usage_message(tmp_path, capsys) -> None:
    from preft_serve.adapters.pyreft_import import main

    src = pyreft_dir(tmp_path, "LoreftIntervention", "mlp_output")
    with pytest.raises(SystemExit) as exc:
        main([str(src), str(tmp_path / "out"), "--positions", "f3+l3", "--base-model", "b"])
    assert exc.value.code == 2 and "edits mlp_output" in capsys.readouterr().err
