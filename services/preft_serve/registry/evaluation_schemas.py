"""Wire models of the evaluation gate (``registry.evaluation``): an adapter's evaluation
config and a version's evaluation result."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from preft_serve.common.evaluation_wire import (
    DEFAULT_EVAL_TOKENS,
    MAX_EVAL_TOKENS,
    MAX_EXAMPLES,
    UNSUPPORTED_LOSS,
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
        "the answer contains it (loss is not offered: the serving path cannot score an "
        "answer with PreFT semantics)",
        examples=["exact"],
    )
    margin: float = Field(
        ge=0,
        le=1,
        description="How much lower than the serving version's score (a share of examples, "
        "0 to 1) a staged version may score and still pass",
        examples=[0.05],
    )
    max_tokens: int = Field(
        DEFAULT_EVAL_TOKENS,
        ge=1,
        le=MAX_EVAL_TOKENS,
        description="Tokens each example's answer may have (greedy)",
    )

    @field_validator("metric", mode="before")
    @classmethod
    def _no_loss(cls, metric: Any) -> Any:
        if metric == "loss":
            raise ValueError(UNSUPPORTED_LOSS)
        return metric


class EvaluationOut(EvaluationIn):
    name: str
    examples: int = Field(description="Examples in the file")
    updated_at: str


class EvaluationCounts(BaseModel):
    """What the gateway measured; the registry decides ``passed`` itself."""

    model_config = {"extra": "forbid"}

    file_id: str = _FILE_ID
    metric: Metric
    examples: int = Field(ge=1, le=MAX_EXAMPLES)
    correct: int = Field(ge=0, le=MAX_EXAMPLES, description="Examples the version got right")
    serving_version: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="The version compared with; null: none"
    )
    serving_correct: int | None = Field(None, ge=0, le=MAX_EXAMPLES)
