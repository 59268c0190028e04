#!/usr/bin/env bash
# A corpus encoded into a dense index over every GPU of the job, in resumable shards: one
# `corag index CORPUS --out OUT --model MODEL --shard i --num-shards n` per GPU (n: every GPU of the job,
# one srun task each), then `corag index CORPUS --out OUT --merge`, which checks every chunk and
# completes the folder. A rerun (requeued, or resubmitted after a failure) encodes only the chunks still
# missing. Wall time: `corag plan` of a service's config (KILT's 35.7M passages at 2,000 a second per GPU
# for E5-large-v2: about 37 minutes on 8 GPUs; a smoke's smoke.json calibrates it).
#
#   sbatch --nodes=1 sampling/slurm_encode.sh data/kilt-corpus data/index/e5-large-v2 e5-large-v2 [index flags]
#   NUM_SHARDS=2 bash sampling/slurm_encode.sh CORPUS OUT MODEL   # without Slurm: this machine (a GPU each)
#
# The encoder comes from the Hugging Face cache (HF_HUB_OFFLINE=1 unless set): `corag models fetch
# --model MODEL CONFIG` on the login node first. Logs: logs/encode-<job>-shard<i>.log (CORAG_LOG_DIR).
#SBATCH --job-name=corag-encode
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --time=4:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-encode-%j.out
set -euo pipefail
usage="usage: slurm_encode.sh CORPUS OUT MODEL [corag index flags]"
corpus=${1:?$usage}
out=${2:?$usage}
model=${3:?$usage}
shift 3
cd "${SLURM_SUBMIT_DIR:-.}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
PYTHON=${PYTHON:-python}
logs=${CORAG_LOG_DIR:-logs}
job=${SLURM_JOB_ID:-local}
mkdir -p "$logs"
encode() {  # shard $1 of $2, its log
  "$PYTHON" -m corag.cli index "$corpus" --out "$out" --model "$model" --shard "$1" --num-shards "$2" "${@:3}" \
    >> "$logs/encode-$job-shard$1.log" 2>&1
}
if [[ -n "${SLURM_JOB_ID:-}" ]]; then
  export -f encode
  export corpus out model PYTHON logs job
  shards=${SLURM_NTASKS:-1}  # every task of the job: one a GPU (#SBATCH --ntasks-per-node, --gpus-per-task)
  srun --kill-on-bad-exit=1 --ntasks="$shards" bash -c 'encode "$SLURM_PROCID" "$0" "$@"' "$shards" "$@"
else  # one process per GPU of this machine (on a CPU, NUM_SHARDS processes, default 1)
  gpus=$(nvidia-smi -L 2> /dev/null | wc -l || true)
  shards=${NUM_SHARDS:-$((gpus > 0 ? gpus : 1))}
  pids=()
  for ((i = 0; i < shards; i++)); do
    if ((gpus > 0)); then CUDA_VISIBLE_DEVICES=$((i % gpus)) encode "$i" "$shards" "$@" & else encode "$i" "$shards" "$@" & fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "slurm_encode.sh: a shard failed; logs in $logs"; exit 1; }; done
fi
if ((shards > 1)); then
  "$PYTHON" -m corag.cli index "$corpus" --out "$out" --model "$model" --merge
fi
echo "slurm_encode.sh: $out encoded over $shards shard(s); logs $logs/encode-$job-shard*.log"
