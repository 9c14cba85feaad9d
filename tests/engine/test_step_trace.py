"""The engine's step trace (``PREFT_STEP_TRACE``): one line per executed step, written by
the real engine's model runner, with the tokens vLLM scheduled in that step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from preft_serve.worker.step_trace import StepTrace, read_steps
from tests.support.engine import BATCH_TOKENS, Engine, prompt


def _start_trace(worker: Any, path: str) -> None:
    worker.model_runner.step_trace = StepTrace(Path(path))


def _stop_trace(worker: Any) -> None:
    worker.model_runner.step_trace.close()
    worker.model_runner.step_trace = None


def test_the_engine_marks_every_step_with_its_scheduled_tokens(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    engine = next(iter(engines.values()))
    trace = tmp_path / "steps.txt"
    prompt_len, max_tokens = 100, 6
    prompts = [prompt(90_001, prompt_len), prompt(90_002, prompt_len)]  # unseen: no cache hits
    engine.llm.collective_rpc(_start_trace, args=(str(trace),))
    try:
        outputs = engine.generate(prompts, [None, None], max_tokens=max_tokens)
    finally:
        engine.llm.collective_rpc(_stop_trace)
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)

    lines = [tuple(map(float, line.split())) for line in trace.read_text().splitlines()]
    # Every prompt token is computed once; each further output token is one decode token
    # (the first comes out of the prefill step).
    assert sum(tokens for _, tokens, _, _ in lines) == 2 * prompt_len + 2 * (max_tokens - 1)
    assert all(
        0 < tokens <= BATCH_TOKENS and 1 <= requests <= 2 for _, tokens, requests, _ in lines
    )
    # The budget of 64 tokens makes each 100-token prompt a chunked prefill: 200 prompt
    # tokens need at least 4 steps, and the 2 x 5 decode tokens at least 5 more.
    assert len(lines) >= 4 + 5

    steps = read_steps(trace)
    assert len(steps) == len(lines) - 1  # the last step's end is not in the trace
    assert all(s.seconds > 0 for s in steps)
    assert [s.start for s in steps] == [t for t, *_ in lines[:-1]]
    # The adapter-preparation part of each step is measured and is a part of the step.
    assert all(s.adapter_seconds is not None and 0 <= s.adapter_seconds < s.seconds for s in steps)
    decode = [s for s in steps if s.decode_only]
    assert decode and all(s.tokens == s.requests for s in decode)
