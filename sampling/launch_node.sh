#!/usr/bin/env bash
# The shards of a sampling run on this node's GPUs: one engine per `tensor_parallel_size` GPUs of the
# allocation (CUDA_VISIBLE_DEVICES as Slurm set it, else every GPU nvidia-smi lists), each engine
# sampling its share of the config's `num_shards` shards one after another.
#
#   sampling/launch_node.sh CONFIG [--node-index I --num-nodes N] [--log-dir logs] [-- flags for corag sample]
#
# Shard names come from the config, not the hardware: resubmit anywhere and unfinished shards resume.
# SIGUSR1 (Slurm's warning before a time limit) stops every running shard after the block in hand and
# ends the launcher with status 75; running it again resumes them.
# See `python -m corag.cluster.node --help`.
set -euo pipefail
exec "${PYTHON:-python}" -m corag.cluster.node "$@"
