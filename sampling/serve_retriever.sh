#!/usr/bin/env bash
# The retrieval service of a sampling or evaluation run: serves INDEX on this node and writes its URL to
# URL_FILE once it answers. Jobs on other nodes take the FILE, not its text, and wait for it at run time:
# `sampling/slurm_array.sh ... --retriever-url-file URL_FILE`, `evaluation/slurm_eval.sh ...
# --retriever-url-file URL_FILE` (reading it at submission, `$(cat URL_FILE)`, races the queue).
#
#   sbatch --gpus=1 --cpus-per-task=16 sampling/serve_retriever.sh INDEX URL_FILE [serve-retriever flags]
#   bash sampling/serve_retriever.sh data/index/e5-large-v2 runs/retriever.url --workers 4   # without Slurm
#
# It binds to every interface (other nodes must reach it; the service has no authentication, so run it
# inside the cluster's network only). PORT (default 8000) picks the port; the URL file is removed when
# the service stops. A requeued service writes it again (clients retry for 10 minutes meanwhile).
# --mem: the index is read through host memory (an fp16 E5 index of the KILT corpus is ~68 GiB).
#SBATCH --job-name=corag-retriever
#SBATCH --nodes=1
#SBATCH --mem=160G
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=corag-retriever-%j.out
set -euo pipefail
index=${1:?usage: serve_retriever.sh INDEX URL_FILE [serve-retriever flags]}
url_file=${2:?usage: serve_retriever.sh INDEX URL_FILE [serve-retriever flags]}
shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
port=${PORT:-8000}
host=${CORAG_SERVICE_HOST:-$(hostname)}
"${PYTHON:-python}" -m corag.cli serve-retriever "$index" --host 0.0.0.0 --allow-remote --port "$port" "$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null; rm -f "$url_file"' EXIT INT TERM
url="http://$host:$port"
until "${PYTHON:-python}" -c "import httpx, sys; httpx.get(sys.argv[1] + '/health', timeout=5).raise_for_status()" "http://127.0.0.1:$port" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }
  sleep 0.5
done
mkdir -p "$(dirname "$url_file")"
echo "$url" > "$url_file.tmp" && mv "$url_file.tmp" "$url_file"
echo "retrieval service of $index at $url (written to $url_file)"
wait "$pid"
