#!/usr/bin/env bash
# Evaluation over every GPU of the job: each questions file (and each method of the config) is split into
# as many parts as the job has engines, so that all engines finish about together, then each file's parts
# are merged and one table is written (python -m corag.cluster.node evaluate).
#
#   sbatch --nodes=2 evaluation/slurm_eval.sh CONFIG --serve-index data/index/e5-large-v2 \
#       --data data/multihopqa/hotpotqa_validation.jsonl --data data/multihopqa/musique_validation.jsonl \
#       [--out-root runs/eval] [--gpus-per-run 1] [--wait-minutes 30] [-- flags for corag evaluate]
#
# One task per node (srun); each node starts one engine per --gpus-per-run of its GPUs. With N nodes of
# G GPUs there are S = N x G / gpus-per-run engines, and engine s answers part s of S of every file, file
# after file (`corag evaluate --shard s --num-shards S`, into OUT_ROOT/<file>/parts/). Then each file's
# parts are joined into exactly what one process writes (`corag evaluate --num-shards S --merge`), and one
# table over all files goes to OUT_ROOT/results.md (`corag results OUT_ROOT`). A requeued or resubmitted
# job on as many GPUs skips the finished parts and resumes the others.
# At the time limit: Slurm warns the job 10 minutes before (--signal=B:USR1@600); each part ends after the
# question in hand and starts no other file (exit status 75); no file is merged and the job requeues
# itself, at most CORAG_MAX_REQUEUES times (default 3). A part that failed fails the job (not requeued,
# nothing merged), whatever the other parts did; resubmitting resumes it.
# --serve-index INDEX (the shipped layout) starts each node's own retrieval service first; with
# --retriever-url-file instead (a service on a node of its own, sampling/serve_retriever.sh) the job
# waits at run time (at most --wait-minutes) for the URL file and for the service to answer.
# Logs in logs/ (CORAG_LOG_DIR): corag-eval-<job>-<file>-part<s>.log for each part, retriever-<job>-node<i>.log
# for each node's service. Outside Slurm, `bash evaluation/slurm_eval.sh ...` runs as one node.
# CPUs and host memory are the cluster's defaults unless given: pass them to sbatch, e.g.
# --cpus-per-task=32 --mem=0 for 8 engines a node. `corag submit evaluation/slurm_eval.sh [sbatch flags]
# -- ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-eval
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-eval-%j.out
exec "${PYTHON:-python}" -m corag.cluster.requeue "${PYTHON:-python}" -m corag.cluster.node evaluate "$@"
