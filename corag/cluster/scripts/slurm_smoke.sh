#!/usr/bin/env bash
# The smoke job: `corag smoke` on one node of GPUs, every stage of the cluster path small with the
# configs you will run (the shipped 8B ones unless given), within SMOKE_MINUTES (default 60), offline
# (HF_HUB_OFFLINE=1 unless set: `corag models fetch CONFIG...` on the login node first). Its table:
# runs/smoke/smoke.md (and this job's output); `corag plan --config FILE --calibrate runs/smoke/smoke.json`
# then uses the measured rates.
#
#   sbatch --wait sampling/slurm_smoke.sh [corag smoke flags, e.g. --sft_config configs/sft/qwen3-8b-full.yaml]
#   bash sampling/slurm_smoke.sh --small      # without Slurm, on a CPU: the toy world
#SBATCH --job-name=corag-smoke
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --time=1:30:00
#SBATCH --output=corag-smoke-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python}" -m corag.cli smoke --minutes "${SMOKE_MINUTES:-60}" "$@"
