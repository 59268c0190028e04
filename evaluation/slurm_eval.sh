#!/usr/bin/env bash
# Evaluation over every GPU of the job: each questions file (and each method of the config) is split into
# as many parts as the job has engines, so that all engines finish about together, then each file's parts
# are merged and one table is written.
#
#   sbatch --nodes=2 evaluation/slurm_eval.sh CONFIG --serve-index data/index/e5-large-v2 \
#       --data data/multihopqa/hotpotqa_validation.jsonl --data data/multihopqa/musique_validation.jsonl \
#       [--out-root runs/eval] [--gpus-per-run 1] [--wait-minutes 30] [-- flags for corag evaluate]
#
# One task per node (srun); each node starts one engine per --gpus-per-run of its GPUs. With N nodes of
# G GPUs there are S = N x G / gpus-per-run engines, and engine s answers part s of S of every file, file
# after file (`corag evaluate --shard s --num-shards S`, into OUT_ROOT/<file>/parts/). Then each file's
# parts are joined into exactly what one process writes (`corag evaluate --num-shards S --merge`:
# OUT_ROOT/<file name without .jsonl>/<run>/), and one table over all files goes to OUT_ROOT/results.md
# (`corag results OUT_ROOT`). A requeued or resubmitted job on as many GPUs skips the finished parts and
# resumes the others.
# At the time limit: Slurm warns the job 10 minutes before (--signal=B:USR1@600; another margin with sbatch
# --signal=B:USR1@SECONDS, more than a question takes); the batch shell (python -m corag.cluster.requeue)
# passes the warning to srun, which passes it to every process of the nodes, and each part ends after the
# question in hand, its answers whole lines, and starts no other file (exit status 75); a part between two
# files, or still starting, reads the warning from the batch shell's file (CORAG_WARNED_FILE) and stops
# before it loads anything. Once any part stopped, no file is merged and the job requeues itself (the same
# job id, logs appended); the rerun skips the finished parts and resumes the others, then merges every file
# and writes the table; at most CORAG_MAX_REQUEUES times (default 3), then it fails in one line. A part
# that failed fails the job (not requeued, nothing merged), whatever the other parts did; resubmitting
# resumes it.
# --serve-index INDEX (the shipped layout) starts each node's own retrieval service first (its shards over
# the node's GPUs, on loopback; python -m corag.cluster.node_service), waits until it answers, and stops it
# at the end; the node's engines run beside it and search it. With --retriever-url-file instead (a service
# on a node of its own, sampling/serve_retriever.sh) the job waits at run time (at most --wait-minutes) for
# the URL file that sampling/serve_retriever.sh writes and for the service to answer, then passes
# --retriever URL; after that long without one it fails with one line naming the file. Chain it with
# `--dependency=after:<service job id>` to start it only once the service job runs.
# Logs in logs/ (CORAG_LOG_DIR): corag-eval-<job>-<file>-part<s>.log for each part, retriever-<job>-node<i>.log
# for each node's service. Devices: each node's CUDA_VISIBLE_DEVICES as Slurm set it, else every GPU
# nvidia-smi lists; none runs one engine a node on the CPU. Outside Slurm, `bash evaluation/slurm_eval.sh
# ...` runs as one node.
# CPUs and host memory are the cluster's defaults unless given (nodes differ): pass them to sbatch, e.g.
# --cpus-per-task=32 --mem=256G for 8 engines a node (each loads its weights through host memory). `corag
# submit evaluation/slurm_eval.sh [sbatch flags] -- ARGS` checks them against the partition's nodes first.
#SBATCH --job-name=corag-eval
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=corag-eval-%j.out
set -euo pipefail
usage="usage: sbatch [--nodes=N] evaluation/slurm_eval.sh CONFIG [--serve-index INDEX | --retriever-url-file F] --data FILE [--data FILE ...] [-- flags]"
config=${1:?$usage}
shift
url_file="" serve_index="" wait_minutes=30 out_root=runs/eval per_run=1 data=()
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
[[ -z "$serve_index" || -z "$url_file" ]] || { echo "slurm_eval.sh: give --serve-index or --retriever-url-file, not both" >&2; exit 2; }
[[ "$per_run" =~ ^[1-9][0-9]*$ ]] || { echo "slurm_eval.sh: --gpus-per-run must be 1 or more, got $per_run" >&2; exit 2; }
cd "${SLURM_SUBMIT_DIR:-.}"
python=${PYTHON:-python}
command=${CORAG_EVAL_COMMAND:-$python -m corag.cli evaluate}
log_dir=${CORAG_LOG_DIR:-logs}
mkdir -p "$log_dir"
job=${SLURM_JOB_ID:-$$}
retriever=""
if [[ -n "$url_file" ]]; then
  retriever=$("$python" -m corag.cluster.wait_service "$url_file" --wait-minutes "$wait_minutes")
  echo "slurm_eval.sh: retrieval service at $retriever (from $url_file)" >&2
fi
# Engines a node: the GPUs of this (the first) node, gpus-per-run each; every node has as many.
if [[ -n "${SLURM_GPUS_ON_NODE:-}" ]]; then
  node_gpus=$SLURM_GPUS_ON_NODE
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  node_gpus=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  node_gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ' || true)
fi
nodes=${SLURM_NNODES:-1}
per_node=$(( node_gpus / per_run ))
(( per_node >= 1 )) || per_node=1
parts=$(( nodes * per_node ))
echo "slurm_eval.sh: ${#data[@]} file(s), each in $parts part(s): $nodes node(s) x $per_node engine(s) of ${per_run} GPU(s) (cpu without GPUs)" >&2
export CORAG_EVAL_CONFIG=$config CORAG_EVAL_OUT_ROOT=$out_root CORAG_EVAL_COMMAND=$command
export CORAG_EVAL_PER_RUN=$per_run CORAG_EVAL_PER_NODE=$per_node CORAG_EVAL_PARTS=$parts
export CORAG_EVAL_JOB=$job CORAG_EVAL_RETRIEVER=$retriever CORAG_SERVE_INDEX=$serve_index
export CORAG_EVAL_WAIT_MINUTES=$wait_minutes CORAG_LOG_DIR=$log_dir PYTHON=$python CORAG_EVAL_NODES=$nodes
# One node: its service (with --serve-index), then its engines, each answering its part of every file
# in turn. Arguments: the files, --, the flags for corag evaluate. Status 1 if a part failed, else 75 if
# one stopped on the warning; a node that fails, however, leaves the job's failure mark (srun reports the
# highest status of its nodes, and a failed node beside a stopped one must not read as a stop). srun passes
# the warning to every process of the node: only corag evaluate acts on it, the rest ignore it.
node_task='set -euo pipefail
  trap "" USR1
  node=${SLURM_PROCID:-0} files=() retriever=() pids=() failed=0 stopped=0 service=""
  on_exit() {
    local code=$?
    [[ -z "$service" ]] || { kill "$service" 2>/dev/null || true; wait "$service" 2>/dev/null || true; }
    (( code == 0 || code == 75 )) || : > "$CORAG_LOG_DIR/failed-$CORAG_EVAL_JOB"
  }
  trap on_exit EXIT
  while [[ "$1" != "--" ]]; do files+=("$1"); shift; done
  shift
  [[ -z "$CORAG_EVAL_RETRIEVER" ]] || retriever=(--retriever "$CORAG_EVAL_RETRIEVER")
  if [[ -n "$CORAG_SERVE_INDEX" ]]; then  # this node'"'"'s retrieval service, for its engines only
    base="$CORAG_LOG_DIR/retriever-$CORAG_EVAL_JOB-node$node"
    rm -f "$base.url"
    "$PYTHON" -m corag.cluster.node_service "$CORAG_SERVE_INDEX" "$base.url" --log "$base.log" \
      --wait-minutes "$CORAG_EVAL_WAIT_MINUTES" &
    service=$!
    url=$("$PYTHON" -m corag.cluster.wait_service "$base.url" --service-pid "$service" \
      --wait-minutes "$CORAG_EVAL_WAIT_MINUTES")
    echo "slurm_eval.sh: node $node searches $url" >&2
    retriever=(--retriever "$url")
  fi
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
  else
    mapfile -t gpus < <(nvidia-smi --list-gpus 2>/dev/null | awk '"'"'/^GPU /{print NR-1}'"'"' || true)
  fi
  if (( ${#gpus[@]} > 0 && ${#gpus[@]} < CORAG_EVAL_PER_NODE * CORAG_EVAL_PER_RUN )); then
    echo "slurm_eval.sh: node $node has ${#gpus[@]} GPU(s), the first node $(( CORAG_EVAL_PER_NODE * CORAG_EVAL_PER_RUN )): give every node as many (--gpus-per-node)" >&2
    exit 2
  fi
  for (( slot = 0; slot < CORAG_EVAL_PER_NODE; slot++ )); do
    part=$(( node * CORAG_EVAL_PER_NODE + slot ))
    devices=$(IFS=,; echo "${gpus[*]:$(( slot * CORAG_EVAL_PER_RUN )):$CORAG_EVAL_PER_RUN}")
    (
      failed=0
      for file in "${files[@]}"; do
        name=$(basename "$file" .jsonl)
        log="$CORAG_LOG_DIR/corag-eval-$CORAG_EVAL_JOB-$name-part$part.log"
        echo "slurm_eval.sh: part $part of $CORAG_EVAL_PARTS of $file on ${devices:-cpu} (node $node), log $log" >&2
        code=0
        # shellcheck disable=SC2086  # the command is words, as CORAG_EVAL_COMMAND gives them
        CUDA_VISIBLE_DEVICES=${devices:-${CUDA_VISIBLE_DEVICES:-}} $CORAG_EVAL_COMMAND \
          --config "$CORAG_EVAL_CONFIG" --data "$file" --out-dir "$CORAG_EVAL_OUT_ROOT/$name" \
          --shard "$part" --num-shards "$CORAG_EVAL_PARTS" ${retriever[@]+"${retriever[@]}"} "$@" \
          >> "$log" 2>&1 || code=$?
        # 75: stopped on the warning; 138 (SIGUSR1): the warning came as it exited; either way whole lines
        if (( code == 75 || code == 138 )); then
          echo "slurm_eval.sh: part $part of $file stopped on the warning before the time limit (see $log)" >&2
          exit $(( failed ? 1 : 75 ))
        elif (( code != 0 )); then
          failed=1
          echo "slurm_eval.sh: part $part of $file failed (see $log)" >&2
        fi
      done
      exit "$failed"
    ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    code=0
    wait "$pid" || code=$?
    if (( code == 75 )); then stopped=1; elif (( code != 0 )); then failed=1; fi
  done
  (( failed == 0 )) || exit 1
  (( stopped == 0 )) || exit 75'
# The job: every node's parts, then, once every part finished, each file's merge and one table. The batch
# shell (python -m corag.cluster.requeue) passes Slurm's warning to this shell, which passes it to srun;
# a part that stopped on it makes this shell exit 75, and the batch shell requeues the job.
# Arguments: the node task, the files, --, the flags for corag evaluate.
job_task='set -euo pipefail
  node_task=$1 files=()
  shift
  while [[ "$1" != "--" ]]; do files+=("$1"); shift; done
  shift
  failed_mark="$CORAG_LOG_DIR/failed-$CORAG_EVAL_JOB"
  rm -f "$failed_mark"
  runner=(bash -c "$node_task" slurm-eval-node)
  if [[ -n "${SLURM_JOB_ID:-}" ]]; then
    runner=(srun --nodes="$CORAG_EVAL_NODES" --ntasks="$CORAG_EVAL_NODES" --ntasks-per-node=1 "${runner[@]}")
  fi
  trap "" USR1
  "${runner[@]}" "${files[@]}" -- "$@" &
  runner_pid=$!
  trap '"'"'kill -USR1 "$runner_pid" 2>/dev/null || true'"'"' USR1
  # a warning passed on ends a wait early: wait again until the nodes are done, then take their status
  while kill -0 "$runner_pid" 2>/dev/null; do wait "$runner_pid" || true; done
  status=0
  wait "$runner_pid" || status=$?
  if [[ -e "$failed_mark" ]]; then  # a node failed, whatever the others did
    rm -f "$failed_mark"
    (( status != 0 && status != 75 )) || status=1
  fi
  logs="$CORAG_LOG_DIR/corag-eval-$CORAG_EVAL_JOB-*-part*.log"
  if (( status == 75 )); then
    echo "slurm_eval.sh: a part stopped on the warning before the time limit (see $logs); no file merged, the rerun resumes" >&2
    exit 75
  elif (( status != 0 )); then
    echo "slurm_eval.sh: a part failed (see $logs); resubmit to resume" >&2
    exit "$status"
  fi
  if (( CORAG_EVAL_PARTS > 1 )); then
    for file in "${files[@]}"; do
      # shellcheck disable=SC2086
      $CORAG_EVAL_COMMAND --config "$CORAG_EVAL_CONFIG" --data "$file" \
        --out-dir "$CORAG_EVAL_OUT_ROOT/$(basename "$file" .jsonl)" --num-shards "$CORAG_EVAL_PARTS" --merge "$@" \
        > /dev/null
    done
  fi
  "$PYTHON" -m corag.cli results "$CORAG_EVAL_OUT_ROOT"
  echo "slurm_eval.sh: results in $CORAG_EVAL_OUT_ROOT/ (one table: $CORAG_EVAL_OUT_ROOT/results.md)" >&2'
exec "$python" -m corag.cluster.requeue bash -c "$job_task" slurm-eval-job "$node_task" "${data[@]}" -- "$@"
