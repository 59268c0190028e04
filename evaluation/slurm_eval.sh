#!/usr/bin/env bash
# Evaluation on one node: one `corag evaluate` per questions file, each on its own GPU(s) of the node, all
# at once (a file per GPU; more files than GPUs run in turns), answering through a retrieval service.
#
#   sbatch evaluation/slurm_eval.sh CONFIG --retriever-url-file runs/retriever.url \
#       --data data/multihopqa/hotpotqa_validation.jsonl --data data/multihopqa/musique_validation.jsonl \
#       [--out-root runs/eval] [--gpus-per-run 1] [--wait-minutes 30] [-- flags for corag evaluate]
#
# With --retriever-url-file the job waits at run time (at most --wait-minutes) for the URL file that
# sampling/serve_retriever.sh writes and for the service to answer, then passes --retriever URL; after
# that long without one it fails with one line naming the file. Chain it with
# `--dependency=after:<service job id>` to start it only once the service job runs. Each file's results
# go to OUT_ROOT/<file name without .jsonl>; logs to logs/ (CORAG_LOG_DIR). Devices: CUDA_VISIBLE_DEVICES
# as Slurm set it, else every GPU nvidia-smi lists; none runs the files one after another on the CPU.
# --mem: host memory of the node's engines (each loads its weights through host memory).
#SBATCH --job-name=corag-eval
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --mem=256G
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --output=corag-eval-%j.out
set -euo pipefail
usage="usage: sbatch evaluation/slurm_eval.sh CONFIG [--retriever-url-file F] --data FILE [--data FILE ...] [-- flags]"
config=${1:?$usage}
shift
url_file="" wait_minutes=30 out_root=runs/eval per_run=1 data=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --retriever-url-file) url_file=$2; shift 2 ;;
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
extra=()
if [[ -n "$url_file" ]]; then
  url=$("$python" -m corag.commands.wait_service "$url_file" --wait-minutes "$wait_minutes")
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
log_dir=${CORAG_LOG_DIR:-logs}
mkdir -p "$log_dir"
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
echo "slurm_eval.sh: results in $out_root/" >&2
