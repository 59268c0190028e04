#!/usr/bin/env bash
# The GPU figures in one run, with the transformers backend and torch only (benchmarks/gpu.py):
# executor against one question at a time on a random-weight Llama from the 1B config, exact fp16
# search over 10M x 1024 vectors at batch 256, and a bf16 SFT step's MFU. Each part has its own time
# limit so that one slow part still leaves the others' figures; the last line of each part is JSON.
#
#   bash benchmarks/gpu.sh            # about 5 minutes on one H100/H200
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PYTHON=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
status=0
for part in decoding search training; do
  echo "== $part"
  timeout "${PART_TIMEOUT:-240}" "$PYTHON" benchmarks/gpu.py --parts "$part" "$@" || status=1
done
exit $status
