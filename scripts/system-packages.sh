#!/usr/bin/env bash
# Install the Debian packages that `make run` / `make test` use for real, when missing.
#
#   scripts/system-packages.sh run    # redis-server (the local stack's Redis)
#   scripts/system-packages.sh test   # + prometheus/promtool (metric and alert tests),
#                                     #   npm (installs the pinned helm for the chart tests),
#                                     #   chromium (the console's browser tests),
#                                     #   and what `images` installs (the image tests)
#   scripts/system-packages.sh images # buildah (builds images without a daemon) and
#                                     #   debootstrap (the stand-in Python base), unless a
#                                     #   working docker or podman builds the images
#
# Installs with apt-get when this is a Debian/Ubuntu machine and we are root (or sudo needs
# no password); otherwise says which packages are missing and how to get them. For `test`
# that is not fatal (the tests that need a tool skip and say why, or fail under CI=1); for
# `run` a missing redis-server is.
set -euo pipefail

purpose="${1:-test}"
missing=()
if [[ "$purpose" != images ]]; then
  command -v redis-server >/dev/null || missing+=(redis-server)
fi
if [[ "$purpose" == test || "$purpose" == images ]]; then
  if [[ "$purpose" == test ]] || ! { docker info >/dev/null 2>&1 || podman info >/dev/null 2>&1; }; then
    command -v buildah >/dev/null || missing+=(buildah)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
  fi
fi
if [[ "$purpose" == test ]]; then
  { [[ -x /usr/bin/prometheus ]] && command -v promtool >/dev/null; } || missing+=(prometheus)
  command -v npm >/dev/null || missing+=(npm)
  [[ -x /usr/bin/chromium ]] || missing+=(chromium)
fi
((${#missing[@]})) || exit 0

if [[ $(id -u) == 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  sudo=(none)
fi
if ! command -v apt-get >/dev/null || [[ "${sudo[*]}" == none ]]; then
  echo "system-packages: missing ${missing[*]}; install them (Debian/Ubuntu:" \
       "sudo apt-get install -y ${missing[*]})" >&2
  [[ "$purpose" == test ]] || exit 1
  echo "system-packages: tests that need them will skip (or fail under CI=1)" >&2
  exit 0
fi
echo "system-packages: installing ${missing[*]} with apt-get (one-time)" >&2
"${sudo[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
