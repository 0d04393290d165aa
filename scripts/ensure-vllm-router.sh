#!/usr/bin/env bash
# Install vllm-router (the vLLM project's Rust router, a binary wheel on PyPI) into its own
# cached venv, once: the peer that bench/peers.py runs kvpool against.
#
# Why a separate venv outside the repo: it is a peer under test, not a dependency of
# kvpool; keeping it apart means its pins never touch .venv and a `make clean` keeps it.
#
# Idempotent: a stamp file (keyed by the pinned version) records a complete install and a
# working binary (`vllm-router --help`); with the stamp present the script returns at once.
# An interrupted install (venv without a working binary) is repaired by re-running pip.
#
# Usage: scripts/ensure-vllm-router.sh   (venv at ${KVPOOL_ROUTER_VENV:-~/.cache/kvpool/router-venv};
#        prints the binary's path on stdout)
set -euo pipefail

ROUTER_VERSION="${KVPOOL_ROUTER_VERSION:-}"  # empty: the newest on the index
venv="${KVPOOL_ROUTER_VENV:-$HOME/.cache/kvpool/router-venv}"
python="${KVPOOL_ROUTER_BASE_PYTHON:-python3}"
stamp="$venv/.kvpool-ensure-vllm-router.stamp"
spec="vllm-router${ROUTER_VERSION:+==$ROUTER_VERSION}"

log() { echo "ensure-vllm-router: $*" >&2; }

works() { [ -x "$venv/bin/vllm-router" ] && "$venv/bin/vllm-router" --help >/dev/null 2>&1; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$spec" ] && works; then
  echo "$venv/bin/vllm-router"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$python" -m venv "$venv"
fi
log "installing $spec into $venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
if ! works; then
  log "error: $venv/bin/vllm-router does not run after the install; remove $venv and retry"
  exit 1
fi
echo "$spec" >"$stamp"
log "ready: $("$venv/bin/python" -m pip show vllm-router 2>/dev/null | sed -n 's/^Version: //p')"
echo "$venv/bin/vllm-router"
