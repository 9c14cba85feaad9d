"""values.yaml is the chart's documented API: every value has a `## @param` line, every
`## @param` names a real value, and values.schema.json describes every value."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.chart.support import CHART

PARAM = re.compile(r"^\s*## @param (\S+)", re.MULTILINE)


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def leaf_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of values, descending only where the schema lists properties."""
    paths = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        sub = schema.get("properties", {}).get(key)
        assert sub is not None, f"values.schema.json does not describe {path}"
        if isinstance(value, dict) and "properties" in sub:
            paths |= leaf_paths(value, sub, f"{path}.")
        else:
            paths.add(path)
    return paths


def test_every_value_is_documented_and_in_the_schema(values: dict[str, Any]) -> None:
    documented = set(PARAM.findall((CHART / "values.yaml").read_text()))
    leaves = leaf_paths(values, _schema())
    # A @param on a map (e.g. gateway.resources) documents what is inside it.
    undocumented = sorted(
        p for p in leaves if not any(p == d or p.startswith(f"{d}.") for d in documented)
    )
    assert not undocumented, f"values without a ## @param line: {undocumented}"


def test_every_param_line_names_a_value(values: dict[str, Any]) -> None:
    for path in PARAM.findall((CHART / "values.yaml").read_text()):
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"@param {path} names no value"
            node = node[part]
