#!/usr/bin/env bash
# A retrieval service on a node of its own (the alternative to the shipped layout, where each node's
# runner starts its own with --serve-index): serves INDEX to other nodes and writes its URL to URL_FILE
# once it answers (python -m corag.cluster.node serve --remote). Jobs take the FILE, not its text, and
# wait for it at run time: `sampling/slurm_array.sh ... --retriever-url-file URL_FILE`,
# `evaluation/slurm_eval.sh ... --retriever-url-file URL_FILE`.
#
#   sbatch --gpus=1 --cpus-per-task=16 --mem=160G sampling/serve_retriever.sh INDEX URL_FILE [flags]
#   bash sampling/serve_retriever.sh data/index/e5-large-v2 runs/retriever.url --workers 4   # without Slurm
#
# It binds to every interface (the service has no authentication: run it inside the cluster's network
# only). PORT (default 8000) picks the port; the URL file is removed when the service stops. A requeued
# service writes it again (clients retry for 10 minutes meanwhile). An fp16 E5 index of the KILT corpus
# is ~68 GiB read through host memory, hence --mem=160G above (below the RealMemory of a 192 GB node).
# `corag submit sampling/serve_retriever.sh [sbatch flags] -- INDEX URL_FILE` checks a partition has such a node.
#SBATCH --job-name=corag-retriever
#SBATCH --nodes=1
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=corag-retriever-%j.out
exec "${PYTHON:-python}" -m corag.cluster.node serve --remote "$@"
