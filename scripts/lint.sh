#!/usr/bin/env bash
# `make lint`, and each pre-commit hook (.pre-commit-config.yaml) runs one of its checks:
# the same commands over the whole tree, so the two never disagree. Rules and exceptions
# live in pyproject.toml ([tool.ruff], [tool.mypy], [tool.importlinter], [tool.codespell]).
#
#   scripts/lint.sh [VENV] [CHECK...]
#
# CHECK: ruff, format (ruff format --check), mypy (strict on all of preft_serve and
# preft_kernels), imports (the import contracts), shellcheck, codespell, refs (module and
# file names in docs and docstrings that resolve to nothing); all of them by default. Every check runs; the exit
# status is 1 when any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
shift || true
all=(ruff format mypy imports shellcheck codespell refs)
checks=("$@")
[[ ${#checks[@]} -gt 0 ]] || checks=("${all[@]}")

run() {
  case "$1" in
    ruff) "$venv/bin/ruff" check . ;;
    format) "$venv/bin/ruff" format --check . ;;
    mypy) "$venv/bin/mypy" ;;
    imports) "$venv/bin/lint-imports" --no-cache --no-logo ;;
    shellcheck) "$venv/bin/shellcheck" scripts/*.sh .ci/run ;;
    codespell) "$venv/bin/codespell" ;;
    refs) "$venv/bin/python" scripts/stale_refs.py ;;
    *) echo "lint.sh: no check named '$1' (${all[*]})" >&2; return 2 ;;
  esac
}

failed=()
for check in "${checks[@]}"; do
  echo "== $check"
  run "$check" || failed+=("$check")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "lint.sh: failed: ${failed[*]}" >&2
  exit 1
fi
