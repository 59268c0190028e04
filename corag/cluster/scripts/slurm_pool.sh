#!/usr/bin/env bash
# The pool stage of a `corag iterate` round under `launcher: slurm`: the round's sampler, on one GPU with
# the sampling config's engine settings, scores the earlier rounds' chains again, and the best chain per
# question over the rounds becomes the round's training set (python -m corag.cluster.node pool). corag
# iterate submits it; by hand, from the folder the paths are relative to:
#
#   sbatch --wait sampling/slurm_pool.sh configs/sampling/llama3.1-8b.yaml --model runs/iterate/llama3.1-8b/round1/model \
#       --questions data/multihopqa/train.jsonl --corpus data/kilt-corpus --out runs/iterate/llama3.1-8b/round2/pool.jsonl \
#       0=data/chains/multihopqa.jsonl 1=runs/iterate/llama3.1-8b/round1/chains.jsonl 2=runs/iterate/llama3.1-8b/round2/chains.jsonl
#
# Scoring is one forward pass a chain (no generation, no retrieval), by one engine. Each new score is kept
# as it comes (beside the pool, in its .scores.jsonl); warned 10 minutes before the time limit
# (--signal=B:USR1@600) the scoring stops after the chain in hand and the job requeues itself and goes on
# from the scores kept. The pool is written once every chain is scored.
#SBATCH --job-name=corag-pool
#SBATCH --nodes=1
#SBATCH --gpus-per-node=1
#SBATCH --time=12:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-pool-%j.out
exec "${PYTHON:-python}" -m corag.cluster.requeue "${PYTHON:-python}" -m corag.cluster.node pool "$@"
