#!/usr/bin/env bash
# `make lint`: ruff over the tree, then mypy over preft_serve and preft_kernels (strict on
# preft_serve.common and preft_kernels; see [tool.mypy] in pyproject.toml).
#
# mypy cannot follow setuptools' editable-install import hook, and the import names differ
# from the folders (services/ -> preft_serve, kernels/ -> preft_kernels), so mypy reads the
# sources through links with the import names, under .tools/mypy (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"

"$venv/bin/ruff" check .

mkdir -p .tools/mypy
ln -sfn ../../services .tools/mypy/preft_serve
ln -sfn ../../kernels .tools/mypy/preft_kernels
"$venv/bin/mypy"
