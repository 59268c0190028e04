#!/usr/bin/env bash
# One sampling process per GPU on this node; each takes its own shard of the questions.
#
#   sampling/launch_node.sh CONFIG [NODE_INDEX NUM_NODES] [-- extra flags]
#
# With NUM_NODES > 1, shard ids are NODE_INDEX * GPUS + local GPU index, out of NUM_NODES * GPUS.
# A finished or interrupted shard is resumed by running the same command again.
set -euo pipefail
config=${1:?usage: launch_node.sh CONFIG [NODE_INDEX NUM_NODES] [-- flags]}
node=${2:-0}
nodes=${3:-1}
shift $(( $# < 3 ? $# : 3 ))
[[ "${1:-}" == "--" ]] && shift
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
gpus=$(( gpus > 0 ? gpus : 1 ))
total=$(( nodes * gpus ))
pids=()
for (( g = 0; g < gpus; g++ )); do
  shard=$(( node * gpus + g ))
  CUDA_VISIBLE_DEVICES=$g python sampling/sample.py --config "$config" \
    --shard "$shard" --num_shards "$total" "$@" > "sampling-shard-$shard.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
