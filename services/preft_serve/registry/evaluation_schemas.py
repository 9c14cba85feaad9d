"""Wire models of the evaluation gate (``registry.evaluation``): an adapter's evaluation
config and a version's evaluation result."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator

from preft_serve.common.evaluation_wire import (
    DEFAULT_EVAL_TOKENS,
    MAX_EVAL_TOKENS,
    MAX_EXAMPLES,
    MAX_LOSS_MARGIN,
    MAX_LOSS_SUM,
    MAX_LOSS_TOKENS,
    MAX_SHARE_MARGIN,
    Metric,
)
from preft_serve.registry.policy_schemas import MAX_VERSION, EvaluationResult

__all__ = ["EvaluationCounts", "EvaluationIn", "EvaluationOut", "EvaluationResult"]
_FILE_ID = Field(
    min_length=1,
    max_length=64,
    description="A chat JSONL file of yours (POST /v1/files, or a job's validation_file) "
    f"whose every line ends with the assistant's expected answer; at most {MAX_EXAMPLES} "
    "lines",
    examples=["file-abc123"],
)


class EvaluationIn(BaseModel):
    model_config = {"extra": "forbid"}

    file_id: str = _FILE_ID
    metric: Metric = Field(
        description="exact: the answer equals the expected one (both stripped); contains: "
        "the answer contains it; loss: nats per token of the expected answer, scored with "
        "PreFT semantics (the adapter on the prompt, the answer on the base model; lower is "
        "better)",
        examples=["exact"],
    )
    margin: float = Field(
        ge=0,
        le=MAX_LOSS_MARGIN,
        description="How much worse than the serving version a staged version may score and "
        f"still pass: exact, contains: a share of examples, 0 to {MAX_SHARE_MARGIN:g}; loss: "
        f"nats per answer token, 0 to {MAX_LOSS_MARGIN:g}",
        examples=[0.05],
    )
    max_tokens: int = Field(
        DEFAULT_EVAL_TOKENS,
        ge=1,
        le=MAX_EVAL_TOKENS,
        description="Tokens each example's answer may have (greedy; exact and contains)",
    )

    @model_validator(mode="after")
    def _margin_of_metric(self) -> Self:
        if self.metric is not Metric.LOSS and self.margin > MAX_SHARE_MARGIN:
            raise ValueError(
                f"margin {self.margin:g} is above {MAX_SHARE_MARGIN:g}: for {self.metric.value} "
                "it is a share of the examples (0 to 1); margins up to "
                f"{MAX_LOSS_MARGIN:g} are nats, for metric loss"
            )
        return self


class EvaluationOut(EvaluationIn):
    name: str
    examples: int = Field(description="Examples in the file")
    updated_at: str


_LOSS_SUM = Field(None, ge=0, le=MAX_LOSS_SUM, allow_inf_nan=False)
_TOKENS = Field(None, ge=1, le=MAX_LOSS_TOKENS)


class EvaluationCounts(BaseModel):
    """What the gateway measured (counts for exact and contains; summed nats and tokens for
    loss); the registry computes the scores and decides ``passed`` itself."""

    model_config = {"extra": "forbid"}

    file_id: str = _FILE_ID
    metric: Metric
    examples: int = Field(ge=1, le=MAX_EXAMPLES)
    correct: int | None = Field(
        None, ge=0, le=MAX_EXAMPLES, description="Examples the version got right"
    )
    serving_version: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="The version compared with; null: none"
    )
    serving_correct: int | None = Field(None, ge=0, le=MAX_EXAMPLES)
    loss_sum: float | None = _LOSS_SUM
    tokens: int | None = _TOKENS
    serving_loss_sum: float | None = _LOSS_SUM
    serving_tokens: int | None = _TOKENS
