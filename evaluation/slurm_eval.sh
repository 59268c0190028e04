#!/usr/bin/env bash
# Evaluation on one node: one `corag evaluate` per questions file, each on its own GPU(s) of the node, all
# at once (a file per GPU; more files than GPUs run in turns), answering through a retrieval service.
#
#   sbatch evaluation/slurm_eval.sh CONFIG --serve-index data/index/e5-large-v2 \
#       --data data/multihopqa/hotpotqa_validation.jsonl --data data/multihopqa/musique_validation.jsonl \
#       [--out-root runs/eval] [--gpus-per-run 1] [--wait-minutes 30] [-- flags for corag evaluate]
#
# --serve-index INDEX (the shipped layout) starts this node's retrieval service first (its shards over the
# node's GPUs, on loopback; python -m corag.commands.node_service), waits until it answers, and stops it at
# the end; the engines then run beside it. With --retriever-url-file instead (a service on a node of its
# own, sampling/serve_retriever.sh) the job waits at run time (at most --wait-minutes) for the URL file that
# sampling/serve_retriever.sh writes and for the service to answer, then passes --retriever URL; after
# that long without one it fails with one line naming the file. Chain it with
# `--dependency=after:<service job id>` to start it only once the service job runs. Each file's results
# go to OUT_ROOT/<file name without .jsonl>, and one table over all of them to OUT_ROOT/results.md
# (`corag results OUT_ROOT`); logs to logs/ (CORAG_LOG_DIR). Devices: CUDA_VISIBLE_DEVICES
# as Slurm set it, else every GPU nvidia-smi lists; none runs the files one after another on the CPU.
# CPUs and host memory are the cluster's defaults unless given (nodes differ): pass them to sbatch, e.g.
# --cpus-per-task=32 --mem=256G for 8 engines (each loads its weights through host memory). `corag submit
# evaluation/slurm_eval.sh [sbatch flags] -- ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-eval
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --output=corag-eval-%j.out
set -euo pipefail
usage="usage: sbatch evaluation/slurm_eval.sh CONFIG [--serve-index INDEX | --retriever-url-file F] --data FILE [--data FILE ...] [-- flags]"
config=${1:?$usage}
shift
url_file="" serve_index="" service="" wait_minutes=30 out_root=runs/eval per_run=1 data=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --retriever-url-file) url_file=$2; shift 2 ;;
    --serve-index) serve_index=$2; shift 2 ;;
    --wait-minutes) wait_minutes=$2; shift 2 ;;
    --data) data+=("$2"); shift 2 ;;
    --out-root) out_root=$2; shift 2 ;;
    --gpus-per-run) per_run=$2; shift 2 ;;
    *) echo "slurm_eval.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
  esac
done
[[ "${1:-}" == "--" ]] && shift
[[ ${#data[@]} -gt 0 ]] || { echo "slurm_eval.sh: give at least one --data FILE ($usage)" >&2; exit 2; }
cd "${SLURM_SUBMIT_DIR:-.}"
python=${PYTHON:-python}
command=${CORAG_EVAL_COMMAND:-$python -m corag.cli evaluate}
log_dir=${CORAG_LOG_DIR:-logs}
mkdir -p "$log_dir"
extra=()
if [[ -n "$serve_index" ]]; then
  [[ -z "$url_file" ]] || { echo "slurm_eval.sh: give --serve-index or --retriever-url-file, not both" >&2; exit 2; }
  url_file="$log_dir/retriever-${SLURM_JOB_ID:-$$}.url"
  rm -f "$url_file"
  "$python" -m corag.commands.node_service "$serve_index" "$url_file" --wait-minutes "$wait_minutes" \
    --log "$log_dir/retriever-${SLURM_JOB_ID:-$$}.log" &
  service=$!
  trap 'kill "$service" 2>/dev/null || true; wait "$service" 2>/dev/null || true' EXIT
fi
if [[ -n "$url_file" ]]; then
  url=$("$python" -m corag.commands.wait_service "$url_file" --wait-minutes "$wait_minutes" \
    ${service:+--service-pid "$service"})
  echo "slurm_eval.sh: retrieval service at $url (from $url_file)" >&2
  extra=(--retriever "$url")
fi
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
else
  mapfile -t gpus < <(nvidia-smi --list-gpus 2>/dev/null | awk '/^GPU /{print NR-1}' || true)
fi
slots=$(( ${#gpus[@]} / per_run ))
(( slots >= 1 )) || slots=1
pids=() failed=0
for i in "${!data[@]}"; do
  file=${data[$i]}
  name=$(basename "$file" .jsonl)
  slot=$(( i % slots ))
  devices=$(IFS=,; echo "${gpus[*]:$(( slot * per_run )):$per_run}")
  echo "slurm_eval.sh: $file on ${devices:-cpu} -> $out_root/$name" >&2
  # shellcheck disable=SC2086  # the command is words, as CORAG_EVAL_COMMAND gives them
  CUDA_VISIBLE_DEVICES=${devices:-${CUDA_VISIBLE_DEVICES:-}} $command --config "$config" --data "$file" \
    --out-dir "$out_root/$name" ${extra[@]+"${extra[@]}"} "$@" > "$log_dir/corag-eval-$name.log" 2>&1 &
  pids+=($!)
  if (( ${#pids[@]} == slots )); then
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    pids=()
  fi
done
for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" || failed=1; done
(( failed == 0 )) || { echo "slurm_eval.sh: a run failed (see $log_dir/corag-eval-*.log)" >&2; exit 1; }
"$python" -m corag.cli results "$out_root"
echo "slurm_eval.sh: results in $out_root/ (one table: $out_root/results.md)" >&2
