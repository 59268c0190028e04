#!/usr/bin/env bash
# The shards of a sampling run on this node's GPUs, without Slurm (python -m corag.cluster.node sample):
# one engine per `tensor_parallel_size` GPUs, each sampling its share of the config's `num_shards` shards.
#
#   sampling/launch_node.sh CONFIG [--node-index I --num-nodes N] [--log-dir logs] [-- flags for corag sample]
#
# Shard names come from the config, not the hardware: resubmit anywhere and unfinished shards resume.
# SIGUSR1 stops every running shard after the block in hand and ends the runner with status 75.
exec "${PYTHON:-python}" -m corag.cluster.node sample "$@"
