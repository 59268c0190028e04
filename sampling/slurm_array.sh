#!/usr/bin/env bash
# A Slurm array job: one task per node, each running the node launcher (sampling/launch_node.sh) on
# the node's GPUs. Submit from the folder the config's paths are relative to.
#
#   sbatch --array=0-1 sampling/slurm_array.sh CONFIG [launcher flags] [-- flags for corag sample]
#   sbatch --array=0-1 sampling/slurm_array.sh configs/sampling/llama3.1-8b.yaml \
#       --serve-index data/index/e5-large-v2
#
# Launcher flags (python -m corag.cluster.node --help): --num-shards S (else the config's
# num_shards), --tensor-parallel-size T, and where retrieval comes from:
#   --serve-index INDEX (the shipped configs' layout): each task first starts its node's retrieval
#     service over INDEX (the index's shards over the node's GPUs), waits until it answers, then starts
#     the engines beside it and passes every shard --retriever URL; the service stops with the task.
#   --retriever-url-file FILE (a service on a node of its own, sampling/serve_retriever.sh): each task
#     waits at run time for FILE and for the service to answer, then passes --retriever URL; chain it with
#     --dependency=after:<service job id> to start it only once the service job runs (`after`, not
#     `afterok`: the service runs until cancelled).
# --wait-minutes M (default 30) bounds either wait; then the task fails with one line saying why.
#
# Any array range works (--array=16-31, --array=0-30:2): task i of the array is node i of the run.
# Logs go to logs/ (created here; CORAG_LOG_DIR sets another), named by array task:
# sample-<array>_<task>-shard-<S>.log, retriever-<array>_<task>-node<i>.log; Slurm's own log goes to the
# submission folder (Slurm opens it before the script runs).
# At the time limit: Slurm warns the task 10 minutes before (--signal=B:USR1@600; give another margin
# with sbatch --signal=B:USR1@SECONDS, more than a block of questions takes); its shards finish the block
# in hand and stop, and the task requeues itself (python -m corag.cluster.requeue; the same task id,
# logs appended) and resumes them, at most CORAG_MAX_REQUEUES times (default 3), then fails in one line.
# Resubmitting the same array also resumes every shard where it stopped; then merge:
#   corag merge --questions <questions> --out chains.jsonl <out_dir>/chains-*.jsonl
# CPUs and host memory are the cluster's defaults unless given (nodes differ): pass them to sbatch, e.g.
# --cpus-per-task=32 --mem=256G for 8 vLLM engines (each loads its weights through host memory; --mem=0
# takes all of a node's memory). `corag submit sampling/slurm_array.sh [sbatch flags] -- ARGS` checks
# them against the partition's nodes first.
#SBATCH --job-name=corag-sample
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-sample-%A_%a.out
set -euo pipefail
usage="usage: sbatch --array=A-B sampling/slurm_array.sh CONFIG [launcher flags] [-- flags]"
config=${1:?$usage}
shift
own=()
while [[ $# -gt 0 && "$1" != "--" ]]; do own+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
task=${SLURM_ARRAY_TASK_ID:?not an array task: submit with sbatch --array=A-B}
first=${SLURM_ARRAY_TASK_MIN:-$task}
step=${SLURM_ARRAY_TASK_STEP:-1}
count=${SLURM_ARRAY_TASK_COUNT:-$(( (${SLURM_ARRAY_TASK_MAX:-$task} - first) / step + 1 ))}
node=$(( (task - first) / step ))
cd "${SLURM_SUBMIT_DIR:-.}"
export CORAG_LOG_DIR=${CORAG_LOG_DIR:-logs}
mkdir -p "$CORAG_LOG_DIR"
python=${PYTHON:-python}
exec "$python" -m corag.cluster.requeue "$python" -m corag.cluster.node "$config" --node-index "$node" \
  --num-nodes "$count" --log-dir "$CORAG_LOG_DIR" ${own[@]+"${own[@]}"} -- "$@"
