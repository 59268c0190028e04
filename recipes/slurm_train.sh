#!/usr/bin/env bash
# Training on N nodes under Slurm (the SFT or the GRPO recipe): one task per node, each running
# `accelerate launch` over its node's GPUs, all joining one training world by c10d rendezvous at the job's
# first node.
#
#   sbatch --nodes=2 recipes/slurm_train.sh sft zero3 configs/sft/llama3.1-8b-full.yaml [--key value ...]
#   sbatch --nodes=1 recipes/slurm_train.sh grpo zero3 configs/grpo/llama3.1-8b.yaml \
#       --serve-index data/index/e5-large-v2 [--key value ...]
#
# The first argument picks the recipe (recipes/sft.py or recipes/grpo.py), the second
# configs/accelerate/<zero3|fsdp|ddp>.yaml (or give a path); the rest go to the recipe. GRPO searches
# while it trains: `--serve-index INDEX` starts a retrieval service on each node first (the index's fp16
# shards over the node's GPUs, on loopback; python -m corag.cluster.node_service, log in
# logs/retriever-<job>-node<i>.log), waits until it answers (up to CORAG_SERVICE_WAIT_MINUTES, default 30)
# and gives the node's processes its URL as `--retriever`; the service stops with the task.
# Submit from the folder the config's paths are relative to. Processes: the node's GPUs as Slurm gives
# them (SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES; accelerate uses CUDA_VISIBLE_DEVICES, never the
# physical ids of SLURM_JOB_GPUS); CORAG_PROCS_PER_NODE overrides. The SFT configs' effective_batch_size
# keeps the batch the same on any number of nodes (gradient accumulation = effective batch /
# (per-device batch x processes)). A requeued job (node failure, preemption, `scontrol requeue`) starts
# again and the recipe resumes from the last checkpoint in output_dir; resume on the same number of GPUs,
# so that the data order and the steps already done stay what they were.
# At the time limit: Slurm warns the batch shell 15 minutes before (--signal=B:USR1@900; another margin
# with sbatch --signal=B:USR1@SECONDS, more than a step and a checkpoint take), which passes the warning
# to every process of the nodes (python -m corag.cluster.requeue, then srun); the training processes save
# a checkpoint after the step in hand and stop, and the job requeues itself (the same job id, logs
# appended) and resumes from that checkpoint, at most CORAG_MAX_REQUEUES times (default 3), then fails in
# one line.
#
# Logs: Slurm's own in the submission folder; one per node in logs/ (CORAG_LOG_DIR), named by job id
# (corag-<recipe>-<job>-node<i>.log, retriever-<job>-node<i>.log), appended on requeue.
# MAIN_PORT (default 29500 + job id mod 1000) is the rendezvous port on the first node.
# CPUs and host memory per node are the cluster's defaults unless given (nodes differ): pass them to
# sbatch, e.g. --cpus-per-task=64 --mem=512G on nodes of 8 GPUs (8 processes loading an 8B model, the
# dataloaders, the checkpoint writes; --mem=0 takes all of a node's memory). `corag submit
# recipes/slurm_train.sh [sbatch flags] -- ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-train-%j.out
set -euo pipefail
usage="usage: sbatch --nodes=N recipes/slurm_train.sh <sft|grpo> <zero3|fsdp|ddp|ACCELERATE_YAML> CONFIG [--serve-index INDEX] [--key value ...]"
recipe=${1:?$usage}
accel=${2:?$usage}
config=${3:?$usage}
shift 3
[[ "$recipe" == sft || "$recipe" == grpo ]] || { echo "slurm_train.sh: the recipe is sft or grpo, not $recipe ($usage)" >&2; exit 2; }
[[ "$accel" == *.yaml ]] || accel="configs/accelerate/$accel.yaml"
serve_index="" args=()
while [[ $# -gt 0 ]]; do
  if [[ "$1" == --serve-index ]]; then serve_index=${2:?$usage}; shift 2; else args+=("$1"); shift; fi
done
[[ -z "$serve_index" || "$recipe" == grpo ]] || { echo "slurm_train.sh: --serve-index is for grpo (SFT searches nothing)" >&2; exit 2; }
cd "${SLURM_SUBMIT_DIR:-.}"
[[ -f "$accel" ]] || { echo "slurm_train.sh: no accelerate config $accel" >&2; exit 2; }
[[ -f "$config" ]] || { echo "slurm_train.sh: no $recipe config $config" >&2; exit 2; }
[[ -z "$serve_index" || -d "$serve_index" ]] || { echo "slurm_train.sh: no index folder $serve_index" >&2; exit 2; }
nodes=${SLURM_NNODES:?not a Slurm job: submit with sbatch --nodes=N}
if [[ -n "${CORAG_PROCS_PER_NODE:-}" ]]; then
  per_node=$CORAG_PROCS_PER_NODE
elif [[ -n "${SLURM_GPUS_ON_NODE:-}" ]]; then
  per_node=$SLURM_GPUS_ON_NODE
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  per_node=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  echo "slurm_train.sh: no GPUs in this job (ask for --gpus-per-node, or set CORAG_PROCS_PER_NODE)" >&2
  exit 2
fi
# sed reads the whole list: head would close the pipe early and fail scontrol (SIGPIPE) under pipefail
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
# The address other nodes reach it at (Slurm's NodeAddr; the node name where Slurm reports none).
head_addr=$( (scontrol show node "$head_node" 2>/dev/null || true) | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
head_addr=${head_addr:-$head_node}
port=${MAIN_PORT:-$(( 29500 + ${SLURM_JOB_ID:-0} % 1000 ))}
log_dir=${CORAG_LOG_DIR:-logs}
mkdir -p "$log_dir"
echo "slurm_train.sh: $recipe on $nodes node(s) x $per_node process(es), rendezvous at $head_addr:$port, logs in $log_dir/"
# One task per node; the first task that fails ends the others (a hung collective would hold every GPU).
# Over several nodes the rendezvous store lives in this batch shell, on the first node (where Slurm runs
# it), until every node has ended, and every node only connects to it (is_host=0: said outright, because
# torch's guess, does the address name this machine?, can be yes on two nodes at once). Hosted by the first
# node's launcher, it would end with that launcher, and a node leaving a moment later would fail its
# rendezvous heartbeat and shutdown (seen on a real Slurm); python -m corag.cluster.accelerate_join runs
# accelerate without its check that machine 0's port is free. On one node its launcher hosts the store.
# Ranks follow the order the nodes join: rank 0 may log on any node. Within a task only the training
# processes act on the warning signal (srun passes it to every process of the task): the rest ignore it.
export CORAG_SERVE_INDEX=$serve_index CORAG_LOG_DIR=$log_dir
python=${PYTHON:-python}
if (( nodes > 1 )); then "$python" -m corag.cluster.rendezvous_store "$port" $$ & fi
exec "$python" -m corag.cluster.requeue \
  srun --kill-on-bad-exit=1 --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --open-mode=append \
  --output="$log_dir/corag-$recipe-%j-node%t.log" \
  bash -c 'set -euo pipefail
    trap "" USR1
    python=${PYTHON:-python} retriever=()
    if [[ -n "$CORAG_SERVE_INDEX" ]]; then  # this node'"'"'s retrieval service, for its processes only
      base="$CORAG_LOG_DIR/retriever-${SLURM_JOB_ID:-$$}-node$SLURM_PROCID"
      rm -f "$base.url"
      "$python" -m corag.cluster.node_service "$CORAG_SERVE_INDEX" "$base.url" --log "$base.log" \
        --wait-minutes "${CORAG_SERVICE_WAIT_MINUTES:-30}" &
      service=$!
      trap '"'"'kill "$service" 2>/dev/null || true; wait "$service" 2>/dev/null || true'"'"' EXIT
      url=$("$python" -m corag.cluster.wait_service "$base.url" --service-pid "$service" \
        --wait-minutes "${CORAG_SERVICE_WAIT_MINUTES:-30}")
      echo "slurm_train.sh: node $SLURM_PROCID searches $url" >&2
      retriever=(--retriever "$url")
    fi
    launch=("$0")  # several nodes: each joins the store of the batch shell
    (( $2 == 1 )) || launch=("$python" -m corag.cluster.accelerate_join "$0")
    "${launch[@]}" launch --config_file "$1" --num_machines "$2" --num_processes "$3" \
      --machine_rank "$SLURM_PROCID" --main_process_ip "$4" --main_process_port "$5" --rdzv_backend c10d \
      --rdzv_conf "is_host=$(( $2 == 1 ))" "${@:6}" ${retriever[@]+"${retriever[@]}"}' \
  "${ACCELERATE:-accelerate}" "$accel" "$nodes" "$(( nodes * per_node ))" "$head_addr" "$port" \
  "recipes/$recipe.py" --config "$config" ${args[@]+"${args[@]}"}
