#!/usr/bin/env bash
# A Slurm array job: one task per node, each running the node launcher (sampling/launch_node.sh) on
# the node's GPUs. Submit from the folder the config's paths are relative to.
#
#   sbatch --array=0-15 sampling/slurm_array.sh configs/sampling/llama3.1-8b.yaml [-- flags]
#
# Any array range works (--array=16-31, --array=0-30:2): task i of the array is node i of the run.
# Shard logs go to logs/ (created here); Slurm's own log goes to the submission folder (Slurm opens it
# before the script runs). Resubmitting the same array resumes every shard where it stopped; then merge:
#   corag merge --questions <questions> --out chains.jsonl <out_dir>/chains-*.jsonl
#SBATCH --job-name=corag-sample
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=corag-sample-%A_%a.out
set -euo pipefail
config=${1:?usage: sbatch --array=A-B sampling/slurm_array.sh CONFIG [-- flags]}
shift
[[ "${1:-}" == "--" ]] && shift
task=${SLURM_ARRAY_TASK_ID:?not an array task: submit with sbatch --array=A-B}
first=${SLURM_ARRAY_TASK_MIN:-$task}
step=${SLURM_ARRAY_TASK_STEP:-1}
count=${SLURM_ARRAY_TASK_COUNT:-$(( (${SLURM_ARRAY_TASK_MAX:-$task} - first) / step + 1 ))}
node=$(( (task - first) / step ))
cd "${SLURM_SUBMIT_DIR:-.}"
log_dir=${CORAG_LOG_DIR:-logs}
mkdir -p "$log_dir"
exec "${PYTHON:-python}" -m corag.commands.launch "$config" --node-index "$node" --num-nodes "$count" \
  --log-dir "$log_dir" -- "$@"
