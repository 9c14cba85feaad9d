"""Regenerate the parameter tables of charts/preft-serve/README.md from values.yaml.

values.yaml documents every value with Bitnami's readme-generator comments:
``## @section Title`` starts a table, ``## @param dotted.path Description`` (continued on the
``##`` lines right below it) describes a value, and the default comes from the YAML itself.
The tables replace whatever lies between the two markers in README.md; the prose around them
is written by hand. tests/chart/test_readme.py fails when README.md is not current.

    python scripts/chart_readme.py          # rewrite README.md (make chart-readme)
    python scripts/chart_readme.py --check  # exit 1 when README.md is not current
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "preft-serve"
BEGIN = (
    "<!-- BEGIN PARAMETERS: generated from values.yaml by scripts/chart_readme.py "
    "(make chart-readme); edit values.yaml, not this table -->"
)
END = "<!-- END PARAMETERS -->"

_SECTION = re.compile(r"^\s*## @section\s+(.+?)\s*$")
_PARAM = re.compile(r"^\s*## @param\s+(\S+)\s*(.*?)\s*$")
_CONTINUATION = re.compile(r"^\s*##(?:\s+(?!@)(.*?))?\s*$")


@dataclass
class Param:
    path: str
    description: str


@dataclass
class Section:
    title: str
    params: list[Param] = field(default_factory=list)


def parse(values_text: str) -> list[Section]:
    """Sections and their params, in file order; a param's description includes the ``##``
    lines that directly follow it."""
    sections: list[Section] = []
    current: Param | None = None
    for line in values_text.splitlines():
        if match := _SECTION.match(line):
            sections.append(Section(match.group(1)))
            current = None
        elif match := _PARAM.match(line):
            if not sections:
                raise ValueError(f"@param {match.group(1)} comes before any @section")
            current = Param(match.group(1), match.group(2))
            sections[-1].params.append(current)
        elif current is not None and (match := _CONTINUATION.match(line)):
            current.description = f"{current.description} {match.group(1) or ''}".strip()
        else:
            current = None
    return sections


def lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"@param {path} names no value in values.yaml")
        node = node[part]
    return node


def cell(text: str) -> str:
    """Table-safe: pipes escaped (GitHub tables split on them even inside code spans)."""
    return text.replace("|", "\\|").replace("\n", " ")


def prose(text: str) -> str:
    """A description for a cell: outside `code spans`, < and > are escaped so that a
    placeholder such as PREFT_GATEWAY_<NAME> is shown rather than taken for an HTML tag."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return cell("`".join(parts))


def default(value: Any) -> str:
    if isinstance(value, str):
        text = value if value else '""'
    else:
        text = json.dumps(value, separators=(", ", ": "))
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{cell(text)}{pad}{fence}"


def tables(values_text: str) -> str:
    """The Markdown for every section: a heading and a Name/Description/Default table."""
    values = yaml.safe_load(values_text)
    out: list[str] = []
    for section in parse(values_text):
        out += [
            f"### {section.title}",
            "",
            "| Name | Description | Default |",
            "| --- | --- | --- |",
        ]
        for param in section.params:
            out.append(
                f"| `{param.path}` | {prose(param.description)} | "
                f"{default(lookup(values, param.path))} |"
            )
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def update(readme_text: str, generated: str) -> str:
    """README text with the part between the markers replaced by ``generated``."""
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the markers:\n{BEGIN}\n{END}")
    return f"{readme_text[:start]}{BEGIN}\n\n{generated}\n{readme_text[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chart", type=Path, default=CHART, help="chart directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when README.md is not current (changes nothing)",
    )
    args = parser.parse_args(argv)
    readme = args.chart / "README.md"
    current = readme.read_text()
    wanted = update(current, tables((args.chart / "values.yaml").read_text()))
    if args.check:
        if wanted != current:
            print(f"{readme} is not current: run `make chart-readme`", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        readme.write_text(wanted)
        print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
