"""OpenAPI descriptions of the completion endpoints' bodies (``/docs``, ``/openapi.json``).

The routes read the body as raw JSON (``gateway.validation``) so that fields the gateway
does not act on reach vLLM unchanged; these schemas document what the gateway itself
checks (400 otherwise), rendered from the table it checks with (``gateway.body_rules``),
and nothing more: everything else is the worker's (vLLM's) to judge. Limits that are the
deployment's settings or that span fields (prompts x choices x max_tokens) are in the
descriptions, not in the schemas, and by what they bound rather than by the setting's name
(the document is served to tenants; a refusal states the value).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from preft_serve.gateway import body_rules
from preft_serve.gateway.body_rules import Rule


def request_body(schema: dict[str, Any], content_type: str = "application/json") -> dict[str, Any]:
    """An operation's required request body of one content type (``openapi_extra``)."""
    return {"requestBody": {"required": True, "content": {content_type: {"schema": schema}}}}


def _properties(rules: dict[str, Rule]) -> dict[str, Any]:
    return {field: rule.openapi() for field, rule in rules.items()}


def _body(
    rules: dict[str, Rule], required: str, what: str, example: dict[str, Any]
) -> dict[str, Any]:
    return request_body(
        {
            "type": "object",
            "required": [required],
            "additionalProperties": True,
            "properties": _properties(rules),
            "examples": [example],
            "description": f"An OpenAI {what} request. prompts x max(n, best_of) x "
            "max_tokens "
            "is at most this gateway's cap on one request's output, and JSON nests "
            "at most its cap on depth (a refusal states both values); other fields "
            "go to the worker unchanged.",
        }
    )


CHAT_BODY = _body(
    body_rules.CHAT,
    "messages",
    "chat completion",
    {"model": "support-bot", "max_tokens": 32, "messages": [{"role": "user", "content": "Hello!"}]},
)
COMPLETION_BODY = _body(
    body_rules.COMPLETION,
    "prompt",
    "completion",
    {"model": "support-bot", "prompt": "Once upon a time", "max_tokens": 32},
)


def _tokenizer_body(
    properties: dict[str, Any], example: dict[str, Any], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    schema_required = {"required": list(required)} if required else {}
    return request_body(
        {
            "type": "object",
            **schema_required,
            "additionalProperties": True,
            "examples": [example],
            "properties": {**properties, "model": body_rules.NAMES["model"].openapi()},
            "description": "vLLM's tokenizer request; the base model's tokenizer, "
            "which every adapter shares",
        }
    )


TOKENIZE_BODY = _tokenizer_body(
    {
        "prompt": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "description": "Tokenized through the chat template",
        },
    },
    {"prompt": "Once upon a time"},
)
DETOKENIZE_BODY = _tokenizer_body(
    {"tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
    {"tokens": [9906, 1917]},
    required=("tokens",),
)

# The worker's answer: JSON, or server-sent events with "stream": true.
OK_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The worker's answer, `model` rewritten to the adapter's name",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "data": {
                            "type": "string",
                            "description": "A JSON chunk, or [DONE] at the end",
                        }
                    },
                }
            },
        },
    }
}

# The routes the gateway forwards to the registry (``gateway.registry_proxy``): the bodies
# are the registry's to check, so they are documented with the registry's own models.
UPLOAD_BODY: dict[str, Any] = request_body(
    {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {
                "type": "string",
                "format": "binary",
                "description": 'JSONL, one {"messages": [...]} per line',
            },
            "purpose": {"type": "string", "enum": ["fine-tune"]},
        },
        "description": "At most this gateway's upload limit, streamed to the registry, "
        "which validates every line before it stores anything",
    },
    "multipart/form-data",
)


def _query_param(name: str, kind: str, description: str | None = None) -> dict[str, Any]:
    described = {} if description is None else {"description": description}
    return {"name": name, "in": "query", "required": False, **described, "schema": {"type": kind}}


def query(*names: str) -> dict[str, Any]:
    """Query parameters passed to the registry as they are (it checks them)."""
    return {
        "parameters": [
            _query_param(name, "integer" if name == "limit" else "string") for name in names
        ]
    }


def typed_query(**params: tuple[str, str]) -> dict[str, Any]:
    """Query parameters passed to the registry as they are: name -> (JSON type, what it
    does)."""
    return {
        "parameters": [
            _query_param(name, kind, description) for name, (kind, description) in params.items()
        ]
    }


def with_query(extra: dict[str, Any], **params: tuple[str, str]) -> dict[str, Any]:
    """``extra`` (a body's ``openapi_extra``) with :func:`typed_query` parameters."""
    return {**extra, **typed_query(**params)}


def _adapter_upload(name_required: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "mode": {
            "type": "string",
            "enum": ["prefill", "all"],
            "description": "prefill (PreFT) or all (classic)"
            + ("" if name_required else "; default: the current mode"),
        },
        "files": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "format": "binary"},
            "description": "adapter_config.json and adapter_model.safetensors as two parts, "
            "or one .tar.gz/.zip of the adapter folder",
        },
    }
    required = ["files"]
    if name_required:
        properties["name"] = {
            "type": "string",
            "description": "Adapter name, unique within your tenant",
        }
        required = ["name", "mode", "files"]
    return request_body(
        {
            "type": "object",
            "required": required,
            "properties": properties,
            "description": "At most this gateway's upload limit, streamed to the "
            "registry, which validates the adapter before it stores anything",
        },
        "multipart/form-data",
    )


ADAPTER_UPLOAD_BODY = _adapter_upload(name_required=True)
ADAPTER_VERSION_BODY = _adapter_upload(name_required=False)


def json_object_body(
    properties: dict[str, Any], required: tuple[str, ...], description: str
) -> dict[str, Any]:
    """A small JSON body the registry checks (documented here, not parsed)."""
    return request_body(
        {
            "type": "object",
            "required": list(required),
            "properties": properties,
            "description": description,
        }
    )


def json_reply(description: str, status: int = 200) -> dict[int | str, dict[str, Any]]:
    """A registry answer documented by what it holds (the registry's document has its
    schema; the gateway relays it unchanged)."""
    return {status: {"description": description, "content": {"application/json": {}}}}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A JSON request body documented by ``model`` (added to the components by
    :func:`document_models`), without the gateway parsing it."""
    return request_body({"$ref": f"#/components/schemas/{model.__name__}"})


def document_models(app: FastAPI, *models: type[BaseModel]) -> None:
    """Put ``models`` (bodies only :func:`json_body` names) into the document's components."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = build()
        _, defs = models_json_schema(
            [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in defs.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


RESPONSES_BODY: dict[str, Any] = request_body(
    {
        "type": "object",
        "required": ["input"],
        "additionalProperties": True,
        "properties": _properties(body_rules.RESPONSES),
        "examples": [{"model": "support-bot", "input": "Hello!", "max_output_tokens": 32}],
        "description": "An OpenAI Responses request; other fields go to the worker unchanged.",
    }
)

# The worker's answer: a response object, or typed server-sent events with "stream": true.
RESPONSES_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The worker's response object, `model` rewritten to the adapter's name",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": {
                            "type": "string",
                            "description": "The event's type, e.g. response.output_text.delta",
                        },
                        "data": {"type": "string", "description": "The event as JSON"},
                    },
                }
            },
        },
    }
}
