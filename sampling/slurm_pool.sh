#!/usr/bin/env bash
# The pool stage of a `corag iterate` round under `launcher: slurm`: the round's sampler, on one GPU with
# the sampling config's engine settings, scores the earlier rounds' chains again, and the best chain per
# question over the rounds becomes the round's training set (python -m corag.cluster.pool). corag iterate
# submits it; by hand, from the folder the paths are relative to:
#
#   sbatch --wait sampling/slurm_pool.sh configs/sampling/llama3.1-8b.yaml --model runs/iterate/llama3.1-8b/round1/model \
#       --questions data/multihopqa/train.jsonl --corpus data/kilt-corpus --out runs/iterate/llama3.1-8b/round2/pool.jsonl \
#       0=data/chains/multihopqa.jsonl 1=runs/iterate/llama3.1-8b/round1/chains.jsonl 2=runs/iterate/llama3.1-8b/round2/chains.jsonl
#
# Scoring is one forward pass a chain (no generation, no retrieval), by one engine: at 8B about 300
# tokens a chain without documents, 125k chains an earlier round. Each new score is kept as it comes
# (beside the pool, in its .scores.jsonl); at the time limit Slurm warns the job 10 minutes before
# (--signal=B:USR1@600), the batch shell (python -m corag.cluster.requeue) passes the warning on, the
# scoring stops after the chain in hand, and the job requeues itself and goes on from the scores kept; a
# job resubmitted after a crash goes on from them too. The pool is written once every chain is scored.
#SBATCH --job-name=corag-pool
#SBATCH --nodes=1
#SBATCH --gpus-per-node=1
#SBATCH --time=12:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-pool-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
python=${PYTHON:-python}
exec "$python" -m corag.cluster.requeue "$python" -m corag.cluster.pool "$@"
