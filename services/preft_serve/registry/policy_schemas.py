"""Wire models of an adapter's serving policy and version states (``serving_policy``)."""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field, field_validator

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.evaluation_wire import Metric
from preft_serve.common.version_split import WEIGHT_DECIMALS, weight_units
from preft_serve.registry.schemas import AdapterUploaded

MAX_VERSION = 999_999_999  # version numbers have at most nine digits (as name@version)


class VersionState(enum.StrEnum):
    STAGED = "staged"  # stored, never served (uploaded with promote=false)
    SERVING = "serving"  # the policy's version or its canary
    RETIRED = "retired"  # served once, no longer


class CanaryIn(BaseModel):
    model_config = {"extra": "forbid"}

    version: int = Field(ge=1, le=MAX_VERSION, description="The canary version", examples=[4])
    weight: float = Field(
        gt=0,
        lt=1,
        description=f"Share of users who get the canary: 0 < weight < 1, at most "
        f"{WEIGHT_DECIMALS} decimals. A user is in it iff a stable hash of (adapter name, "
        "user id) falls under the weight, so raising it only adds users",
        examples=[0.1],
    )

    @field_validator("weight")
    @classmethod
    def _decimals(cls, weight: float) -> float:
        weight_units(weight)  # ValueError names what is wrong
        return weight


class PolicyIn(BaseModel):
    model_config = {"extra": "forbid"}

    version: int = Field(
        ge=1,
        le=MAX_VERSION,
        description="The version every user gets (outside the canary): promote a staged "
        "version or roll back to an older one by naming it",
        examples=[3],
    )
    canary: CanaryIn | None = Field(
        None, description="Another version for a deterministic share of users; null: none"
    )


class CanaryOut(BaseModel):
    version: int
    sha256: str
    weight: float


class EvaluationResult(BaseModel):
    """A version's last evaluation (``registry.evaluation``), kept in its history record."""

    file_id: str
    metric: Metric
    examples: int
    score: float = Field(
        description="exact, contains: the share of examples answered right, 0 to 1; loss: "
        "nats per answer token over every example (the summed loss over the summed tokens; "
        "lower is better)"
    )
    serving_version: int | None = Field(description="The version it was compared with")
    serving_score: float | None
    loss_sum: float | None = Field(None, description="loss: the summed nats of every answer token")
    tokens: int | None = Field(None, description="loss: the answer tokens scored")
    serving_loss_sum: float | None = None
    serving_tokens: int | None = None
    margin: float
    passed: bool = Field(description="Not worse than the serving version by more than margin")
    evaluated_at: str


class PolicyVersion(BaseModel):
    version: int
    sha256: str
    type: AdapterType
    rank: int
    mode: AdapterMode
    size_bytes: int
    created_at: str
    state: VersionState
    evaluation: EvaluationResult | None = Field(
        None, description="Its last evaluation on the adapter's evaluation file, if any"
    )


class UserPick(BaseModel):
    user: str
    version: int
    variant: str = Field(description="serving or canary")


class PolicyOut(BaseModel):
    name: str
    version: int = Field(description="The version served to users outside the canary")
    sha256: str
    canary: CanaryOut | None
    updated_at: str
    versions: list[PolicyVersion] = Field(description="Every version with its state")
    user: UserPick | None = Field(
        None, description="With ?user=: the version that user gets under this policy"
    )


class VersionUploaded(AdapterUploaded):
    """The upload response, with the new version's state (staged with ?promote=false)."""

    state: VersionState
