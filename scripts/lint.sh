#!/usr/bin/env bash
# `make lint`: ruff over the tree, then mypy over preft_serve and preft_kernels (rules and
# strictness in pyproject.toml's [tool.ruff] and [tool.mypy]).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"

"$venv/bin/ruff" check .
"$venv/bin/mypy"
