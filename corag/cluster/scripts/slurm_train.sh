#!/usr/bin/env bash
# Training on N nodes under Slurm (the SFT or the GRPO recipe): one task per node, each running
# `accelerate launch` over its node's GPUs, all joining one training world by c10d rendezvous at the job's
# first node (python -m corag.cluster.node train).
#
#   sbatch --nodes=2 recipes/slurm_train.sh sft zero3 configs/sft/llama3.1-8b-full.yaml [--key value ...]
#   sbatch --nodes=1 recipes/slurm_train.sh grpo zero3 configs/grpo/llama3.1-8b.yaml \
#       --serve-index data/index/e5-large-v2 [--key value ...]
#
# The first argument picks the recipe (recipes/sft.py or recipes/grpo.py), the second
# configs/accelerate/<zero3|fsdp|ddp>.yaml (or give a path); the rest go to the recipe. GRPO searches
# while it trains: `--serve-index INDEX` starts a retrieval service on each node first (log in
# logs/retriever-<job>-node<i>.log), waits until it answers (up to CORAG_SERVICE_WAIT_MINUTES, default 30)
# and gives the node's processes its URL as `--retriever`; the service stops with the task.
# Submit from the folder the config's paths are relative to. Processes: one a GPU of the node (the node
# runner's device rule), or CORAG_PROCS_PER_NODE. The SFT configs' effective_batch_size keeps the batch the
# same on any number of nodes. A requeued job resumes from the last checkpoint in output_dir (on the same
# number of GPUs); one resumed at max_steps only saves its final model.
# At the time limit: Slurm warns the batch shell 15 minutes before (--signal=B:USR1@900; another margin
# with sbatch --signal=B:USR1@SECONDS, more than a step and a checkpoint take; `corag submit` refuses a
# --time shorter than the margin), the training processes save a checkpoint after the step in hand and
# stop, and the job requeues itself (the same job id, logs appended), at most CORAG_MAX_REQUEUES times
# (default 3), then fails in one line.
# Logs: Slurm's own in the submission folder; one per node in logs/ (CORAG_LOG_DIR), named by job id
# (corag-<recipe>-<job>-node<i>.log, retriever-<job>-node<i>.log), appended on requeue.
# MAIN_PORT (default 29500 + job id mod 1000) is the rendezvous port on the first node.
# CPUs and host memory per node are the cluster's defaults unless given: pass them to sbatch, e.g.
# --cpus-per-task=64 --mem=0 on nodes of 8 GPUs (--mem=0: all of a node's memory; --mem=512G is more than a
# 512 GB node grants, since Slurm counts its RealMemory). `corag submit recipes/slurm_train.sh [sbatch
# flags] -- ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-train-%j.out
exec "${PYTHON:-python}" -m corag.cluster.requeue "${PYTHON:-python}" -m corag.cluster.node train "$@"
