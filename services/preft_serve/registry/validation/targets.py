"""Which modules a LoRA config targets, resolved the way PEFT resolves them.

PEFT (``peft.tuners.tuners_utils.check_target_module_exists``) matches ``target_modules``
against every module name of the base model (``model.layers.0.self_attn.q_proj``):

* a list: an entry equal to the whole name, or a suffix of it at a ``.`` boundary
  (``q_proj``, ``self_attn.q_proj``); ``layers_to_transform`` then filters suffix matches
  by layer index (``layers_pattern`` names the layer list, ``layers`` here);
* a string: ``"all-linear"`` (every linear layer but the output head; PEFT saves that as the
  list of full names it found), otherwise a regular expression that must match a whole name;
* ``exclude_modules`` (same forms) removes modules again.

The base model's module names come from its ``config.json`` (Llama-style decoders, see
``preft_serve.adapters.families.lora``). Everything an upload controls is bounded before use:
a regular expression is at most :data:`MAX_PATTERN_CHARS` characters, is matched only
against those names, with the ``regex`` engine's timeout.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from typing import Any

import regex

from preft_serve.adapters.families.lora import (
    ATTENTION_MODULES,
    LORA_MODULES,
    MLP_MODULES,
    PACKED_MODULES,
    module_group,
)
from preft_serve.common.text import clip, shown
from preft_serve.registry.validation.base import (
    AdapterRejected,
    BaseModelSpec,
    is_int,
    require,
)

ALL_LINEAR = "all-linear"
MAX_PATTERN_CHARS = 256
MAX_ENTRIES = 16384  # all-linear on a 405B model (126 layers x 7) lists 882 names
MATCH_SECONDS = 1.0  # whole budget for matching one pattern against every module name
_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")
MAX_WARNINGS = 20  # like the problems a rejection lists
_HINT = "use names like q_proj, self_attn.q_proj, a regex, or 'all-linear'"


@dataclasses.dataclass(frozen=True, order=True)
class Target:
    """One decoder projection a LoRA adapter wraps."""

    layer: int
    module: str  # short name: q_proj ... down_proj

    @property
    def path(self) -> str:
        return f"model.layers.{self.layer}.{module_group(self.module)}.{self.module}"


@dataclasses.dataclass(frozen=True)
class Resolution:
    targets: list[Target]
    warnings: list[str]


def base_modules(base: BaseModelSpec) -> dict[str, Target | str]:
    """Every module name of the base model (as ``named_modules()`` lists them) -> the
    projection it is, or why it cannot carry a LoRA adapter here."""
    names: dict[str, Target | str] = {
        "": "the whole model",
        "model": "the decoder",
        "model.embed_tokens": "the input embedding (LoRA on embeddings is not served)",
        "model.layers": "the layer list",
        "model.norm": "a norm layer",
        "model.rotary_emb": "the rotary embedding",
        "lm_head": "the output head (LoRA on lm_head is not served)",
    }
    for layer in range(base.num_layers):
        p = f"model.layers.{layer}"
        names[p] = "a whole decoder layer"
        names[f"{p}.self_attn"] = "the attention block; name its projections: " + ", ".join(
            ATTENTION_MODULES
        )
        names[f"{p}.mlp"] = "the MLP block; name its projections: " + ", ".join(MLP_MODULES)
        names[f"{p}.mlp.act_fn"] = "an activation"
        names[f"{p}.input_layernorm"] = names[f"{p}.post_attention_layernorm"] = "a norm layer"
        for module in LORA_MODULES:
            target = Target(layer, module)
            names[target.path] = target
    return names


def _arch(base: BaseModelSpec) -> str:
    return base.architecture or base.name


def _pattern(value: str, key: str) -> regex.Pattern[str]:
    require(
        len(value) <= MAX_PATTERN_CHARS,
        f"{key} regex is {len(value)} characters; the limit is {MAX_PATTERN_CHARS} - "
        "list module names instead",
    )
    try:
        re.compile(value)  # the syntax PEFT (Python's re) accepts
        return regex.compile(value)
    except (re.error, regex.error, RecursionError, OverflowError) as exc:
        raise AdapterRejected(
            f"{key} {shown(value)} is not a valid regular expression "
            f"({clip(str(exc), 100)}); {_HINT}"
        ) from None


def _regex_matches(value: str, key: str, names: list[str]) -> set[str]:
    pattern = _pattern(value, key)
    deadline = time.monotonic() + MATCH_SECONDS
    found = set()
    try:
        for name in names:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if pattern.fullmatch(name, timeout=left):
                found.add(name)
    except TimeoutError:
        raise AdapterRejected(
            f"{key} regex {shown(value)} takes over {MATCH_SECONDS:g} s to match "
            f"{len(names)} module names; simplify it or list module names"
        ) from None
    return found


def _entries(value: Any, key: str) -> list[str]:
    ok = (
        isinstance(value, list)
        and all(isinstance(m, str) for m in value)
        and len(value) <= MAX_ENTRIES
    )
    require(
        ok,
        f"LoRA config '{key}' must be a list of at most {MAX_ENTRIES} module names or "
        f"one string (a regex, or 'all-linear'); got {shown(value)}",
    )
    return list(dict.fromkeys(value))


def _suffixes(names: list[str]) -> dict[str, list[str]]:
    """Every dotted suffix of every name -> the names ending with it (PEFT's suffix rule)."""
    index: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts)):
            index.setdefault(".".join(parts[i:]), []).append(name)
    return index


def _layer_of(name: str) -> int | None:
    """The layer index PEFT reads from a module name (``model.layers.3.mlp`` -> 3)."""
    found = _LAYER_INDEX.match(name)
    return int(found.group(1)) if found else None


def _layer_filter(config: Mapping[str, Any]) -> set[int] | None:
    chosen = config.get("layers_to_transform")
    if chosen is None or chosen == []:
        return None
    pattern = config.get("layers_pattern")
    as_list = [pattern] if isinstance(pattern, str) else pattern
    require(
        pattern is None
        or (isinstance(as_list, list) and all(p in ("", "layers") for p in as_list)),
        f"layers_pattern {shown(pattern)} does not name this base model's layer list; use "
        "'layers' (or leave it unset)",
    )
    return {chosen} if is_int(chosen) else set(chosen)


def _list_matches(
    entries: list[str],
    config: Mapping[str, Any],
    names: dict[str, Target | str],
    base: BaseModelSpec,
) -> tuple[set[str], list[str]]:
    index = _suffixes(list(names))
    layers = _layer_filter(config)
    found: set[str] = set()
    unmatched = []
    for entry in entries:
        if entry in PACKED_MODULES and entry not in index:
            parts = ", ".join(PACKED_MODULES[entry])
            raise AdapterRejected(
                f"target_modules entry {entry!r} is vLLM's fused name for {parts}; "
                f"{_arch(base)} has separate modules, and PEFT adapters for it name them: "
                f"list {parts} instead"
            )
        hits = set(index.get(entry, ()))
        if layers is not None:
            hits = {n for n in hits if _layer_of(n) in layers}
        if entry in names:
            hits.add(entry)  # a whole name: PEFT applies no layer filter
        if not hits:
            unmatched.append(entry)
        found |= hits
    warnings = [
        f"target_modules entry {shown(e)} matches no module of the base model "
        f"({_arch(base)}); {_HINT}"
        for e in unmatched[:MAX_WARNINGS]
    ]
    if len(unmatched) > MAX_WARNINGS:  # a list may have 16,384 entries: the answer stays small
        warnings.append(
            f"... and {len(unmatched) - MAX_WARNINGS} more target_modules entries "
            "that match no module"
        )
    return found, warnings


def _excluded(config: Mapping[str, Any], names: dict[str, Target | str]) -> set[str]:
    value = config.get("exclude_modules")
    if value is None or value == []:
        return set()
    if isinstance(value, str):
        return _regex_matches(value, "exclude_modules", list(names))
    index = _suffixes(list(names))
    out: set[str] = set()
    for entry in _entries(value, "exclude_modules"):
        out |= set(index.get(entry, ()))
        if entry in names:
            out.add(entry)
    return out


def resolve_targets(config: Mapping[str, Any], base: BaseModelSpec) -> Resolution:
    """The projections ``config`` targets on ``base``, and warnings (entries matching
    nothing). Raises :class:`AdapterRejected` when nothing matches or a match is a module
    the workers cannot apply LoRA to."""
    value = config.get("target_modules")
    names = base_modules(base)
    warnings: list[str] = []
    if isinstance(value, str) and value.lower() == ALL_LINEAR:
        found = {n for n, t in names.items() if isinstance(t, Target)}
    elif isinstance(value, str):
        found = _regex_matches(value, "target_modules", list(names))
    else:
        entries = _entries(value, "target_modules")
        require(bool(entries), f"LoRA config 'target_modules' is empty; {_HINT}")
        found, warnings = _list_matches(entries, config, names, base)
    found -= _excluded(config, names)
    if not found:
        raise AdapterRejected(
            f"target_modules {shown(value)} matches no module of the base model "
            f"({_arch(base)}, e.g. model.layers.0.self_attn.q_proj); {_HINT}"
        )
    refused = sorted(
        (n for n in found if not isinstance(names[n], Target)), key=lambda n: (not n, n)
    )  # the root module ("") last
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise AdapterRejected(
            f"target_modules {shown(value)} matches {first or 'the root module'}{more}, "
            f"which is {names[first]}; LoRA is served on the decoder projections "
            f"{', '.join(LORA_MODULES)}"
        )
    targets = sorted(t for n in found if isinstance(t := names[n], Target))
    return Resolution(targets, warnings)
