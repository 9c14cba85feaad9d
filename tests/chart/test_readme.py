"""charts/preft-serve/README.md documents every value: its parameter tables are generated from
values.yaml's `## @param` lines by scripts/chart_readme.py (`make chart-readme`), and must be
current."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.chart.support import CHART, ROOT

SCRIPT = ROOT / "scripts" / "chart_readme.py"


@pytest.fixture(scope="module")
def chart_readme() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_readme"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_readme_is_current(chart_readme: ModuleType) -> None:
    readme = (CHART / "README.md").read_text()
    wanted = chart_readme.update(readme, chart_readme.tables((CHART / "values.yaml").read_text()))
    assert wanted == readme, "charts/preft-serve/README.md is not current: run `make chart-readme`"


def test_every_param_has_a_row(chart_readme: ModuleType) -> None:
    values_text = (CHART / "values.yaml").read_text()
    params = [p.path for s in chart_readme.parse(values_text) for p in s.params]
    assert len(params) == len(set(params)) > 200
    readme = (CHART / "README.md").read_text()
    for path in params:
        assert readme.count(f"| `{path}` |") == 1, path


def test_check_flag_reports_a_stale_readme(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.yaml").write_text((CHART / "values.yaml").read_text())
    (chart / "README.md").write_text((CHART / "README.md").read_text())
    check = [sys.executable, str(SCRIPT), "--chart", str(chart), "--check"]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    with (chart / "values.yaml").open("a") as values:
        values.write("## @section Extra\n## @param extra A new value\nextra: 1\n")
    stale = subprocess.run(check, capture_output=True, text=True, check=False)
    assert stale.returncode == 1 and "make chart-readme" in stale.stderr
    subprocess.run(check[:-1], check=True, capture_output=True)
    assert "| `extra` | A new value | `1` |" in (chart / "README.md").read_text()


def test_generator_reads_sections_continuations_and_defaults(chart_readme: ModuleType) -> None:
    values_text = """\
# a plain comment, not documentation
## @section First
## @param a.b Two-line description with `code`,
## a | pipe and PREFIX_<NAME>
a:
  b: {x: [1, "y"]}
  ## @param a.c Empty string
  c: ""
## a stray documentation line belongs to no value
## @section Second
## @param d Text with a `backtick` default
d: "run `this`"
"""
    sections = chart_readme.parse(values_text)
    assert [s.title for s in sections] == ["First", "Second"]
    assert [(p.path, p.description) for p in sections[0].params] == [
        ("a.b", "Two-line description with `code`, a | pipe and PREFIX_<NAME>"),
        ("a.c", "Empty string"),
    ]
    tables = chart_readme.tables(values_text)
    assert (
        "| `a.b` | Two-line description with `code`, a \\| pipe and PREFIX_&lt;NAME&gt; | "
        '`{"x": [1, "y"]}` |'
    ) in tables
    assert '| `a.c` | Empty string | `""` |' in tables
    assert "| `d` | Text with a `backtick` default | `` run `this` `` |" in tables
    assert yaml.safe_load(values_text)["d"] == "run `this`"
    with pytest.raises(KeyError, match="@param missing names no value"):
        chart_readme.tables("## @section S\n## @param missing Nothing\nother: 1\n")
