#!/usr/bin/env bash
# Set up the trainers' own data code for `make test-trainers`: SpecForge and speculators in a
# venv of their own (default .trainers-venv, or $EAGLEGEN_TRAINERS_VENV).
#
# Only what their data code imports: both packages, and the hs-connectors package speculators'
# loader imports, go in with --no-deps, because their full requirements pull sglang / vLLM,
# CUDA builds and conflicting pins (SpecForge wants transformers==5.8.1 and torch==2.11.0,
# speculators transformers<=5.19 and datasets<=5.1). transformers 5.19.0 and datasets 5.1.0
# satisfy speculators; SpecForge's data code runs on them unchanged. torch is the CPU build the
# project pins. The venv is reused while its marker names these pins; a missing or half-built
# one is rebuilt. On failure the reason goes to .eaglegen/trainers-setup.failed.
set -euo pipefail
cd "$(dirname "$0")/.."

peers="specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0"
deps="torch==2.13.0 transformers==5.19.0 datasets==5.1.0 numpy tqdm pydantic pydantic-settings
httpx openai loguru safetensors huggingface-hub jinja2 psutil pyyaml typer rich click"
pins="$peers $(echo $deps)"
# shellcheck source=scripts/venv_lib.sh
. scripts/venv_lib.sh
venv_setup trainers "${EAGLEGEN_TRAINERS_VENV:-.trainers-venv}"

install_venv() {
  echo "trainers: installing $peers into $venv (log: $log)"
  venv_fresh
  # torch first and pinned: an open range would pull a multi-GB CUDA build.
  # shellcheck disable=SC2086
  "$venv/bin/pip" install $deps >>"$log" 2>&1 || fail "trainers: pip install of their deps failed"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --no-deps $peers >>"$log" 2>&1 || fail "trainers: pip install $peers failed"
  "$venv/bin/python" -c "import specforge.data.preprocessing, speculators.train.data" \
    >>"$log" 2>&1 || fail "trainers: installed but their data code does not import"
  echo "$pins" >"$marker"
}

start=$SECONDS
if venv_ready "$pins"; then
  echo "trainers: ready in $venv"
else
  install_venv
fi
echo "trainers: set up in $((SECONDS - start)) s"
