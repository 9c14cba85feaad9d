"""The evaluation gate: an adapter's evaluation config, its versions' results, and the
check the serving policy makes before it promotes a staged version.

The config lives in the adapter's Redis hash (field ``evaluation``, JSON), so it goes with
the adapter when it is deleted and is read in the same snapshot as the policy; a version's
result lives in its history record (key ``evaluation``), which policy changes rewrite
whole, so it stays with the version. The gateway runs an evaluation (it has the serving
path) and reports what it measured; the registry computes the scores from the counts (or,
for loss, the summed nats over the summed answer tokens), decides ``passed`` with the
config's margin, and the gate re-decides it on every promote, with the margin and
serving version of that moment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from preft_serve.common.domain_errors import Conflict, InvalidRequest, NotFound
from preft_serve.common.evaluation_wire import (
    MAX_EVAL_BYTES,
    MAX_EXAMPLES,
    Metric,
    parse_examples,
    passes,
)
from preft_serve.common.finetune_wire import FINE_TUNE_PURPOSE
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.text import shown
from preft_serve.registry.evaluation_schemas import (
    EvaluationCounts,
    EvaluationIn,
    EvaluationOut,
    EvaluationResult,
)
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.names import check_adapter_name, utcnow
from preft_serve.registry.txn import Redis, transact

CONFIG_FIELD = "evaluation"  # in the adapter's hash
RESULT_KEY = "evaluation"  # in a version's history record


def config_of(current: Mapping[str, str]) -> EvaluationOut | None:
    raw = current.get(CONFIG_FIELD)
    return EvaluationOut.model_validate_json(raw) if raw else None


def gate_refusal(name: str, current: Mapping[str, str], record: Mapping[str, Any]) -> str | None:
    """Why a promote of ``record`` (a staged version) must wait, or None when it may go:
    the adapter has no evaluation, or the version's result is for the current config and
    serving version and is within the margin."""
    config = config_of(current)
    if config is None:
        return None
    version, serving = int(record["version"]), int(current["version"])
    run = (
        f"run it (POST /v1/adapters/{name}/evaluations, `preft adapter evaluate {name} "
        f"--version {version}`), or promote with force=true to skip the gate"
    )
    raw = record.get(RESULT_KEY)
    if not raw:
        return f"version {version} of adapter {shown(name)} has no evaluation result; {run}"
    result = EvaluationResult.model_validate(raw)
    if (result.file_id, result.metric) != (config.file_id, config.metric):
        return (
            f"version {version} was evaluated on {result.file_id} ({result.metric.value}), "
            f"but the adapter's evaluation is now {config.file_id} ({config.metric.value}); " + run
        )
    if result.serving_version != serving:
        return (
            f"version {version} was compared with version {result.serving_version}, but "
            f"version {serving} is served now; {run}"
        )
    if not passes(result.metric, result.score, result.serving_score, config.margin):
        lower = " (lower is better)" if result.metric is Metric.LOSS else ""
        return (
            f"version {version} scored {result.score:.4f} ({result.metric.value}{lower}) against "
            f"{result.serving_score:.4f} for the serving version {serving}: worse by more "
            f"than the margin {config.margin}; improve it, raise the margin, or promote with "
            "force=true"
        )
    return None


def _scores(body: EvaluationCounts) -> dict[str, Any]:
    """The version's and the serving version's scores from what the run measured: the share
    right (exact, contains), or summed nats over summed answer tokens (loss)."""
    if body.metric is Metric.LOSS:
        if body.loss_sum is None or body.tokens is None:
            raise InvalidRequest("a loss result needs loss_sum and tokens")
        if body.serving_loss_sum is None or body.serving_tokens is None:
            raise InvalidRequest("a loss result needs serving_loss_sum and serving_tokens")
        return {
            "score": body.loss_sum / body.tokens,
            "serving_score": body.serving_loss_sum / body.serving_tokens,
            "loss_sum": body.loss_sum,
            "tokens": body.tokens,
            "serving_loss_sum": body.serving_loss_sum,
            "serving_tokens": body.serving_tokens,
        }
    if body.correct is None or body.serving_correct is None:
        raise InvalidRequest(f"a {body.metric.value} result needs correct and serving_correct")
    if max(body.correct, body.serving_correct) > body.examples:
        raise InvalidRequest("correct counts cannot exceed examples")
    return {
        "score": body.correct / body.examples,
        "serving_score": body.serving_correct / body.examples,
    }


class EvaluationService:
    def __init__(self, client: Redis, keys: RegistryKeys) -> None:
        self.redis, self.keys = client, keys

    def set(self, tenant: str, name: str, body: EvaluationIn, files: FileService) -> EvaluationOut:
        """Attach ``body.file_id`` (checked line by line) as the adapter's evaluation;
        refused with nothing stored when the metric, the file or the adapter is wrong."""
        check_adapter_name(name)
        info = files.info(tenant, body.file_id, param="file_id")  # 404: not this tenant's
        if info.get("purpose") != FINE_TUNE_PURPOSE:
            raise InvalidRequest(
                f"file {body.file_id} is a {shown(info.get('purpose'))} file; upload the "
                f"evaluation data with purpose={FINE_TUNE_PURPOSE}",
                param="file_id",
            )
        if int(info.get("bytes", 0)) > MAX_EVAL_BYTES or int(info.get("examples", 0)) > (
            MAX_EXAMPLES
        ):
            raise InvalidRequest(
                f"file {body.file_id} has {info.get('examples')} examples in "
                f"{info.get('bytes')} bytes; an evaluation file has at most {MAX_EXAMPLES} "
                f"examples and {MAX_EVAL_BYTES} bytes: upload a smaller sample",
                param="file_id",
            )
        try:
            examples = parse_examples(files.content(tenant, body.file_id))
        except ValueError as exc:
            raise InvalidRequest(
                f"file {body.file_id} cannot be an evaluation file: {exc}",
                param="file_id",
                code="invalid_file_format",
            ) from None
        config = EvaluationOut(
            **body.model_dump(), name=name, examples=len(examples), updated_at=utcnow()
        )
        adapter_key = self.keys.adapter(tenant, name)

        def txn(pipe: Any) -> EvaluationOut:
            if not pipe.exists(adapter_key):
                raise NotFound(f"adapter {shown(name)} does not exist")
            pipe.multi()
            pipe.hset(adapter_key, CONFIG_FIELD, config.model_dump_json())
            return config

        return transact(self.redis, txn, adapter_key)

    def get(self, tenant: str, name: str) -> EvaluationOut:
        check_adapter_name(name)
        current = self.redis.hgetall(self.keys.adapter(tenant, name))
        return self._config(name, current)

    def delete(self, tenant: str, name: str) -> EvaluationOut:
        """Detach the evaluation (the gate opens); the config that was attached."""
        check_adapter_name(name)
        adapter_key = self.keys.adapter(tenant, name)

        def txn(pipe: Any) -> EvaluationOut:
            config = self._config(name, pipe.hgetall(adapter_key))
            pipe.multi()
            pipe.hdel(adapter_key, CONFIG_FIELD)
            return config

        return transact(self.redis, txn, adapter_key)

    def record(
        self, tenant: str, name: str, version: int, body: EvaluationCounts
    ) -> EvaluationResult:
        """Store what a run measured as ``version``'s result; 409 (nothing stored) when the
        config or the served version changed since the run began."""
        check_adapter_name(name)
        adapter_key = self.keys.adapter(tenant, name)
        versions_key = self.keys.versions(tenant, name)

        def txn(pipe: Any) -> EvaluationResult:
            current = pipe.hgetall(adapter_key)
            config = self._config(name, current)
            raw = pipe.hget(versions_key, str(version))
            if raw is None:
                raise NotFound(f"adapter {shown(name)} has no version {version}")
            if (body.file_id, body.metric, body.examples) != (
                config.file_id,
                config.metric,
                config.examples,
            ):
                raise Conflict(
                    f"the evaluation of adapter {shown(name)} changed while this run went on "
                    f"(now {config.file_id}, {config.metric.value}); run it again"
                )
            served = int(current["version"])
            if body.serving_version != served:
                raise Conflict(
                    f"version {served} of adapter {shown(name)} is served now, not "
                    f"{body.serving_version}; run the evaluation again"
                )
            scores = _scores(body)
            result = EvaluationResult(
                file_id=body.file_id,
                metric=body.metric,
                examples=body.examples,
                serving_version=served,
                margin=config.margin,
                passed=passes(body.metric, scores["score"], scores["serving_score"], config.margin),
                evaluated_at=utcnow(),
                **scores,
            )
            record = {**json.loads(raw), RESULT_KEY: result.model_dump(mode="json")}
            pipe.multi()
            pipe.hset(versions_key, str(version), json.dumps(record))
            return result

        return transact(self.redis, txn, adapter_key, versions_key)

    @staticmethod
    def _config(name: str, current: Mapping[str, str]) -> EvaluationOut:
        if not current:
            raise NotFound(f"adapter {shown(name)} does not exist")
        config = config_of(current)
        if config is None:
            raise NotFound(
                f"adapter {shown(name)} has no evaluation; attach one with PUT "
                f"/v1/adapters/{name}/evaluation"
            )
        return config
