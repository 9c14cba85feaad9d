"""Metric names: the ones the code exports, and the ones a PromQL expression reads.

Exported names come from the real exporters (instantiated on private registries) and, for
vLLM, from the metric definitions in the installed vLLM package's source. Names read by an
expression are found by removing everything that is not a metric selector (strings, label
matchers, ranges, grouping clauses, Grafana variables, function and keyword names); promtool
separately checks that each expression parses (tests/chart/test_monitoring.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

# Grafana's variables ($__rate_interval, ${datasource}, $namespace).
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
}
_DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")


def metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression (function calls excluded)."""
    text = _VARIABLE.sub("x", expr)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS or _DURATION.match(name):
            continue
        names.add(name)
    return names


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry's metrics can expose (with their type's suffixes)."""
    names = set()
    for family in registry.collect():
        names |= series_names(family.name, family.type)
    return names


def series_names(name: str, kind: str) -> set[str]:
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    return {name}


_VLLM_DEFINITION = re.compile(r'_(gauge|counter|histogram)_cls\(\s*name="(vllm:[a-z0-9_:]+)"')


def vllm_names(loggers_py: Path) -> set[str]:
    """Series names defined by vLLM's Prometheus stat logger (``v1/metrics/loggers.py``)."""
    definitions = _VLLM_DEFINITION.findall(loggers_py.read_text())
    assert len(definitions) > 20, f"vLLM metric definitions not found in {loggers_py}"
    names = set()
    for kind, name in definitions:
        names |= series_names(name, kind)
    return names


_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^{}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def label_values(expr: str) -> list[tuple[str, str, str]]:
    """(metric, label, value) for each positive matcher; ``=~"a|b"`` gives a and b."""
    found = []
    for metric, body in _SELECTOR.findall(expr):
        for label, op, value in _MATCHER.findall(body):
            if op == "=":
                found.append((metric, label, value))
            elif op == "=~" and re.fullmatch(r"[\w|]+", value):
                found += [(metric, label, v) for v in value.split("|")]
    return found
