"""pyreft checkpoints convert without pickle execution and keep pyreft's math."""

from __future__ import annotations

import pytest
import torch
from preft_serve.common.adapter_format import AdapterFormatError
from preft_serve.common.pyreft_import import convert
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


def delta(adapter, layer: int, part: int, h: torch.Tensor) -> torch.Tensor:
    iv = adapter.intervention(layer, part)
    return (h @ iv.proj_in.T + iv.bias) @ iv.proj_out


@pytest.mark.parametrize("kind", ["loreft", "direft"])
def test_converted_adapter_reproduces_pyreft_interventions(tmp_path, kind) -> None:
    torch.manual_seed(0)
    modules = {(layer, idx): PyreftLike() for layer in (1, 3) for idx in (0, 1)}
    src = tmp_path / "pyreft"
    src.mkdir()
    for (layer, idx), module in modules.items():
        state = module.loreft_state() if kind == "loreft" else module.state_dict()
        torch.save(state, src / f"intkey_layer.{layer}.comp.block_output.unit.pos.nunit.1#{idx}.bin")
    out = convert(src, tmp_path / "out", kind, "f3+l3", "base", share_weights=False)
    adapter = load_reft_adapter(out, hidden_size=D, num_layers=4)
    h = torch.randn(5, D)
    for (layer, idx), module in modules.items():
        with torch.no_grad():
            want = (module.loreft(h) if kind == "loreft" else module.direft(h)) - h
        torch.testing.assert_close(delta(adapter, layer, idx, h), want, rtol=1e-4, atol=1e-5)


def test_pickled_objects_are_refused_not_executed(tmp_path) -> None:
    src = tmp_path / "pyreft"
    src.mkdir()
    torch.save({"weight": torch.zeros(R, D), "payload": torch.nn.Linear(2, 2)},
               src / "intkey_layer.0.comp.block_output#0.bin")
    with pytest.raises(AdapterFormatError, match="more than plain tensors"):
        convert(src, tmp_path / "out", "loreft", "f1+l1", "base", share_weights=True)
    assert not (tmp_path / "out").exists()


def test_directory_without_pyreft_files_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(AdapterFormatError, match="intkey_"):
        convert(tmp_path, tmp_path / "out", "loreft", "f1+l1", "base", share_weights=True)
