#!/usr/bin/env bash
# A Slurm array job: one task per node, each running the node runner's sampling stage on the node's GPUs
# (python -m corag.cluster.node sample: one engine per tensor_parallel_size GPUs, each sampling its share
# of the config's num_shards shards). Submit from the folder the config's paths are relative to.
#
#   sbatch --array=0-1 sampling/slurm_array.sh CONFIG [runner flags] [-- flags for corag sample]
#   sbatch --array=0-1 sampling/slurm_array.sh configs/sampling/llama3.1-8b.yaml \
#       --serve-index data/index/e5-large-v2
#
# Runner flags (python -m corag.cluster.node sample --help): --num-shards S (else the config's num_shards),
# --tensor-parallel-size T, and where retrieval comes from:
#   --serve-index INDEX (the shipped configs' layout): each task first starts its node's retrieval
#     service over INDEX, waits until it answers, then starts the engines beside it and passes every shard
#     --retriever URL; the service stops with the task.
#   --retriever-url-file FILE (a service on a node of its own, sampling/serve_retriever.sh): each task
#     waits at run time for FILE and for the service to answer; chain it with --dependency=after:<service
#     job id> (`after`, not `afterok`: the service runs until cancelled).
# --wait-minutes M (default 30) bounds either wait; then the task fails with one line saying why.
# Any array range works (--array=16-31, --array=0-30:2): task i of the array is node i of the run.
# Logs in logs/ (CORAG_LOG_DIR): sample-<array>_<task>-shard-<S>.log, retriever-<array>_<task>-node<i>.log.
# At the time limit: Slurm warns the task 10 minutes before (--signal=B:USR1@600; another margin with
# sbatch --signal=B:USR1@SECONDS, more than a block of questions takes); its shards finish the block in
# hand and stop, and the task requeues itself (python -m corag.cluster.requeue; the same task id, logs
# appended) and resumes them, at most CORAG_MAX_REQUEUES times (default 3), then fails in one line.
# Then merge: corag merge --questions <questions> --out chains.jsonl <out_dir>/chains-*.jsonl
# CPUs and host memory are the cluster's defaults unless given: pass them to sbatch, e.g.
# --cpus-per-task=32 --mem=0 for 8 vLLM engines (each loads its weights through host memory; --mem=0 is
# all of a node's memory, which no node refuses). `corag submit sampling/slurm_array.sh [sbatch flags] --
# ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-sample
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-sample-%A_%a.out
exec "${PYTHON:-python}" -m corag.cluster.requeue "${PYTHON:-python}" -m corag.cluster.node sample --array "$@"
