#!/usr/bin/env bash
# A retrieval service on a node of its own (the alternative to the shipped layout, where each node's
# launcher starts its own with --serve-index): serves INDEX to other nodes and writes its URL to URL_FILE
# once it answers (python -m corag.cluster.node_service --remote). Jobs take the FILE, not its text, and
# wait for it at run time:
# `sampling/slurm_array.sh ... --retriever-url-file URL_FILE`, `evaluation/slurm_eval.sh ...
# --retriever-url-file URL_FILE` (reading it at submission, `$(cat URL_FILE)`, races the queue).
#
#   sbatch --gpus=1 --cpus-per-task=16 --mem=160G sampling/serve_retriever.sh INDEX URL_FILE [flags]
#   bash sampling/serve_retriever.sh data/index/e5-large-v2 runs/retriever.url --workers 4   # without Slurm
#
# It binds to every interface (other nodes must reach it; the service has no authentication, so run it
# inside the cluster's network only). PORT (default 8000) picks the port; the URL file is removed when
# the service stops. A requeued service writes it again (clients retry for 10 minutes meanwhile).
# Host memory is the cluster's default unless given: the index is read through it (an fp16 E5 index of
# the KILT corpus is ~68 GiB, hence --mem=160G above). `corag submit sampling/serve_retriever.sh [sbatch
# flags] -- ARGS` checks the flags against the partition's nodes first.
#SBATCH --job-name=corag-retriever
#SBATCH --nodes=1
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=corag-retriever-%j.out
set -euo pipefail
index=${1:?usage: serve_retriever.sh INDEX URL_FILE [serve-retriever flags]}
url_file=${2:?usage: serve_retriever.sh INDEX URL_FILE [serve-retriever flags]}
shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
exec "${PYTHON:-python}" -m corag.cluster.node_service "$index" "$url_file" --remote --port "${PORT:-8000}" -- "$@"
