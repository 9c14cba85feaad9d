"""The evaluation gate's shared parts: its bounds, its examples and its metrics.

An evaluation file is a stored chat JSONL file (``/v1/files``, validated at upload) whose
every line ends with the assistant's expected answer. The registry parses it when a tenant
attaches it to an adapter (and refuses it there, naming the line); the gateway parses it
again when it runs the evaluation, with the same function, so both agree on the examples.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from preft_serve.common.jsondepth import json_nests_deeper

MAX_EXAMPLES = 200  # examples one evaluation runs (two completions each)
MAX_EVAL_BYTES = 4 * 1024 * 1024  # an evaluation file's size
MAX_EVAL_TOKENS = 512  # max_tokens of one example's completion
DEFAULT_EVAL_TOKENS = 64
MAX_JSON_DEPTH = 16
_PARTS_TYPE = "text"


class Metric(enum.StrEnum):
    EXACT = "exact"  # the answer, stripped, equals the expected answer, stripped
    CONTAINS = "contains"  # the answer contains the expected answer, stripped
    # Mean negative log-likelihood (nats) per token of the expected answer, teacher-forced
    # with PreFT semantics: the adapter on the prompt, the answer on the base model.
    LOSS = "loss"


MAX_SHARE_MARGIN = 1.0  # exact/contains: a share of the examples
MAX_LOSS_MARGIN = 10.0  # loss: nats per answer token
MAX_LOSS_TOKENS = MAX_EXAMPLES * 8192  # answer tokens of one run, for the bounds on sums
MAX_LOSS_SUM = 1e9  # summed nats of one run (a float32 logprob is above -1e4 per token)


def lower_is_better(metric: Metric) -> bool:
    return metric is Metric.LOSS


@dataclasses.dataclass(frozen=True)
class Example:
    messages: list[dict[str, str]]  # the prompt: every message before the last
    expected: str  # the last message's content: the assistant's answer


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == _PARTS_TYPE and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _example(raw: str) -> Example:
    if json_nests_deeper(raw, MAX_JSON_DEPTH):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        record = json.loads(raw)
    except ValueError:
        raise ValueError("not valid JSON") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or len(messages) < 2:
        raise ValueError('expected {"messages": [...]} with a prompt and an expected answer')
    parsed = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        text = _text(message.get("content")) if isinstance(message, dict) else None
        if role not in ("system", "user", "assistant") or text is None:
            raise ValueError(f"message {i} needs a role (system, user, assistant) and content")
        parsed.append({"role": str(role), "content": text})
    if parsed[-1]["role"] != "assistant":
        raise ValueError(
            "the last message must be the assistant's expected answer (role 'assistant')"
        )
    return Example(parsed[:-1], parsed[-1]["content"])


def parse_examples(data: bytes) -> list[Example]:
    """The file's examples; ValueError naming the first bad line, the size or the count.
    Bounded before anything is parsed: size first, then the number of lines."""
    if len(data) > MAX_EVAL_BYTES:
        raise ValueError(
            f"the file has {len(data)} bytes; an evaluation file has at most {MAX_EVAL_BYTES}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8 text") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError("the file has no examples")
    if len(lines) > MAX_EXAMPLES:
        raise ValueError(
            f"the file has {len(lines)} examples; an evaluation runs at most {MAX_EXAMPLES}: "
            "upload a smaller sample"
        )
    examples = []
    for number, line in lines:
        try:
            examples.append(_example(line))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return examples


def correct(metric: Metric, answer: str, expected: str) -> bool:
    """Whether one answer scores under ``metric``."""
    if metric is Metric.EXACT:
        return answer.strip() == expected.strip()
    return expected.strip() in answer


def passes(metric: Metric, score: float, serving_score: float | None, margin: float) -> bool:
    """The gate: not worse than the serving version by more than ``margin`` (no serving
    version to compare with: passes). Worse is a lower share right, or a higher loss.
    Rounded, so a tie at the margin passes."""
    if serving_score is None:
        return True
    worse_by = score - serving_score if lower_is_better(metric) else serving_score - score
    return round(worse_by, 9) <= round(margin, 9)
