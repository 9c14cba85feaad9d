"""The scheduler holds a waiting request back until the worker has parsed its adapter, so
no step parses weights inline: not for a new adapter, and not for one the worker evicted
from host memory (``max_cpu_loras`` 4 here) and must read from disk again. Real engine,
real scheduler and worker; the outputs are compared with the same requests' greedy
tokens from an unrelated engine run, the load outcomes with the worker's own counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.support.engine import Engine, prompt

ADAPTERS = 6  # > max_cpu_loras (4): the first ones are evicted by the last ones


def _outcomes(worker: Any) -> dict[str, int]:
    from preft_serve.worker.vllm_compat.lora_manager import preloader_of

    preloader = preloader_of(worker.model_runner.lora_manager)
    return dict(preloader.outcomes)


def _scheduler(engine: Engine) -> Any:
    return engine.llm.llm_engine.engine_core.engine_core.scheduler


def _resident(worker: Any) -> set[int]:
    return set(worker.model_runner.lora_manager.list_adapters())


def _loads(engine: Engine) -> dict[str, int]:
    return engine.llm.collective_rpc(_outcomes)[0]


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("ready", "waited", "inline")}


def test_evicted_adapters_are_parsed_ahead_while_their_requests_wait(
    engines: dict[str, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold is made long enough that a loaded machine's slow parse cannot release a
    request by timeout (the timeout itself is tested in tests/worker/test_parse_gate.py):
    what is checked is that no step parses weights inline."""
    engine = next(iter(engines.values()))
    folders = [
        make_lora_adapter(
            engine.model_dir, tmp_path / f"gate-{i}", seed=500 + i, spec=LoraSpec(rank=8)
        )
        for i in range(ADAPTERS)
    ]
    loras = [engine.fresh_lora(f"gate-{i}", folder) for i, folder in enumerate(folders)]
    prompts = [prompt(700 + i, 12) for i in range(ADAPTERS)]
    gate = _scheduler(engine).adapter_gate
    monkeypatch.setattr(gate, "_hold_s", 120.0)
    released = gate.released_unsettled  # the session's other tests may have released some

    # One request per new adapter, one adapter at a time: each is held while it parses.
    before, held = _loads(engine), gate.held
    first = [engine.tokens([p], [lora], max_tokens=6)[0] for p, lora in zip(prompts, loras)]
    assert _diff(_loads(engine), before) == {"ready": ADAPTERS, "waited": 0, "inline": 0}
    assert gate.held > held
    resident = engine.llm.collective_rpc(_resident)[0]
    evicted = [i for i, lora in enumerate(loras) if lora.lora_int_id not in resident]
    assert evicted, "max_cpu_loras should have evicted the first adapters"

    # The evicted ones again, all at once: read from disk ahead of their steps too.
    before, held = _loads(engine), gate.held
    again = engine.tokens([prompts[i] for i in evicted], [loras[i] for i in evicted], max_tokens=6)
    assert _diff(_loads(engine), before) == {"ready": len(evicted), "waited": 0, "inline": 0}
    assert gate.held > held
    assert gate.released_unsettled == released  # never scheduled on a timeout
    assert again == [first[i] for i in evicted]  # the same weights came back


def test_held_requests_give_the_same_tokens_as_a_batch_of_resident_adapters(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    """Holding changes when a request starts, never what it computes: a mixed batch of
    a resident adapter, a new one and the base model gives the tokens each gives alone."""
    engine = next(iter(engines.values()))
    folder = make_lora_adapter(
        engine.model_dir, tmp_path / "gate-new", seed=601, spec=LoraSpec(rank=8)
    )
    resident = engine.lora("all-1")
    prompts = [prompt(801, 12), prompt(802, 12), prompt(803, 12)]
    alone = [engine.tokens([prompts[0]], [resident])[0], engine.tokens([prompts[2]], [None])[0]]
    new = engine.fresh_lora("gate-new", folder)
    together = engine.tokens(prompts, [resident, new, None])
    assert together[0] == alone[0] and together[2] == alone[1]
    assert together[1] == engine.tokens([prompts[1]], [new])[0]


def test_an_adapter_whose_weights_cannot_be_read_fails_its_requests_not_the_engine(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    """A valid adapter_config.json over a broken safetensors file: the background parse
    fails, and the scheduler fails the adapter's requests with an error instead of
    scheduling them (a step that parsed it would raise inside the engine loop and stop
    the engine). A request in the same batch, and the engine afterwards, are unharmed."""
    engine = next(iter(engines.values()))
    folder = make_lora_adapter(
        engine.model_dir, tmp_path / "gate-broken", seed=650, spec=LoraSpec(rank=8)
    )
    (folder / "adapter_model.safetensors").write_bytes(
        b"\x20\x00\x00\x00\x00\x00\x00\x00{this is not a safetensors header}"
    )
    broken = engine.fresh_lora("gate-broken", folder)
    good = engine.lora("all-1")
    want = engine.tokens([prompt(902, 12)], [good], max_tokens=6)[0]
    before = _loads(engine)

    outs = engine.generate([prompt(901, 12), prompt(902, 12)], [broken, good], max_tokens=6)
    assert outs[0].outputs[0].finish_reason == "error"
    assert list(outs[0].outputs[0].token_ids) == []
    assert list(outs[1].outputs[0].token_ids) == want
    # Asked again, it fails at once (no new parse), and the engine still serves.
    again = engine.generate([prompt(903, 12)], [broken], max_tokens=6)
    assert again[0].outputs[0].finish_reason == "error"
    assert engine.tokens([prompt(902, 12)], [good], max_tokens=6)[0] == want
    assert _diff(_loads(engine), before)["inline"] == 0  # no step ever parsed it
