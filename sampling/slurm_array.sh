#!/usr/bin/env bash
# A SLURM array job: one task per node, each running one sampling process per GPU.
#
#   sbatch --array=0-15 sampling/slurm_array.sh configs/sampling/llama3.1-8b.yaml
#
# Resubmitting the same array resumes every shard where it stopped; then merge:
#   python sampling/merge.py --questions <questions> --out chains.jsonl <out_dir>/chains-*.jsonl
#SBATCH --job-name=corag-sample
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=logs/sample-%A_%a.out
set -euo pipefail
config=${1:?usage: sbatch --array=0-N sampling/slurm_array.sh CONFIG [flags]}
shift
nodes=$(( SLURM_ARRAY_TASK_MAX - SLURM_ARRAY_TASK_MIN + 1 ))
exec bash sampling/launch_node.sh "$config" "$SLURM_ARRAY_TASK_ID" "$nodes" -- "$@"
