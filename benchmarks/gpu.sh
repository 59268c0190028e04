#!/usr/bin/env bash
# One GPU measured in about ten minutes, prepared and checked on a CPU:
#  1. `corag smoke --gpus 1 --minutes 10`: every stage of the cluster path with the shipped 8B configs, in
#     the variants one GPU holds (LoRA SFT and GRPO, the transformers backend where vLLM is missing, random
#     weights of each model's and the E5 encoder's shape where none are here): rates and peak memory beside
#     the plan's figures (runs/smoke-gpu/smoke.md; smoke.json for `corag plan --calibrate`);
#  2. exact fp16 search over the KILT corpus's 35.7M x 1024 vectors at batch 256 (benchmarks/gpu.py;
#     PARTS=decoding,search,training adds the executor against one question at a time and an SFT step's MFU).
# The last line is one JSON object: the smoke's stages and the search figures.
#
#   bash benchmarks/gpu.sh --prepare   # where the package registry is: the wheels a bare GPU machine lacks
#                                      # (trl, datasets, bm25s, fastapi, uvicorn and theirs) into benchmarks/wheels/
#   bash benchmarks/gpu.sh             # on the GPU machine: installs those wheels offline, then measures
#   bash benchmarks/gpu.sh --small     # on a CPU: the toy world's smoke and a small search, to check it
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
WHEELS=benchmarks/wheels
# what the lent GPU machine lacks (it has torch, transformers, peft, accelerate, sentence-transformers):
# trl, datasets and bm25s, and the retrieval service's fastapi and uvicorn, with their own dependencies
PACKAGES=("trl==1.16.*" "datasets==5.2.*" "bm25s==0.3.16" dill multiprocess xxhash fastapi starlette uvicorn
          pydantic pydantic-core annotated-types typing-inspection anyio sniffio h11 click)
if [[ "${1:-}" == --prepare ]]; then
  # GPU_PYTHON: the GPU machine's Python version (multiprocess and xxhash are built per version)
  version=${GPU_PYTHON:-$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')}
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" -d "$WHEELS" "${PACKAGES[@]}"
  ls -1 "$WHEELS"; du -sh "$WHEELS"
  exit
fi
small=()
[[ "${1:-}" == --small ]] && small=(--small)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # no hub on the machine: models are here, in the cache, or random
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then  # what the machine lacks, offline; what it has stays
  missing=$("$PYTHON" -c 'import importlib.util as u; print(" ".join(m for m in ("trl", "datasets", "bm25s", "fastapi", "uvicorn") if not u.find_spec(m)))')
  if [[ -n "$missing" ]]; then
    "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" $missing \
      || "$PYTHON" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
  fi
fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
minutes=${SMOKE_MINUTES:-10}
echo "== smoke (${minutes} minutes)"
start=$SECONDS
timeout $((minutes * 60 + 120)) "$PYTHON" -m corag.cli smoke "${small[@]}" --gpus 1 --minutes "$minutes" \
  --out_dir runs/smoke-gpu --overwrite
status=$?
echo "smoke: exit status $status, $((SECONDS - start)) s of its ${minutes} minutes"
parts=${PARTS:-search}  # PARTS=decoding,search,training adds the executor's speed-up and an SFT step's MFU
echo "== $parts"
timeout "${PART_TIMEOUT:-240}" "$PYTHON" benchmarks/gpu.py --parts "$parts" --smoke runs/smoke-gpu/smoke.json \
  "${small[@]}" || status=1
exit $status
