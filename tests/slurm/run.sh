#!/usr/bin/env bash
# The cluster path end to end under simulated Slurm on one CPU machine (.ci/run runs it after the tests):
# the README's cluster commands, on the toy world with the shipped warm model, through sbatch/srun
# stand-ins (tests/slurm/fakeslurm.py) that run each job as local processes with Slurm's environment
# (array ids, a 2-node list, fake GPU ids), every "node" being this machine.
#
#   bash tests/slurm/run.sh [WORK_DIR]      # default: a new temporary folder
#   CORAG_SLURM=real bash tests/slurm/run.sh [WORK_DIR]   # on a real Slurm instead (tests/slurm/real_slurm.sh)
#
# Steps: toy data and index -> sampling array over 2 nodes, each node starting its own retrieval service
# and waiting for it (--serve-index) -> merge -> build examples -> SFT on 2 nodes x 1 process (gloo)
# -> GRPO on 2 nodes x 1 process, each node with its own retrieval service -> evaluation of two question sets through the node's service -> one table
# -> a sampling array task warned before its time limit: it saves, requeues itself and its rerun ends
# with every question once -> a retrieval service job of its own and an array that starts after it and
# finds it through the URL file. Exits non-zero at the first step that fails or leaves the wrong files.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d -t corag-slurm-XXXXXX)}
mkdir -p "$work"
cd "$work"
for folder in configs recipes sampling evaluation; do ln -sfn "$repo/$folder" "$folder"; done
# CORAG_SLURM=real: the real Slurm that SLURM_CONF names (tests/slurm/real_slurm.sh), not the stand-ins
if [[ "${CORAG_SLURM:-}" == real ]]; then
  : "${SLURM_CONF:?CORAG_SLURM=real needs SLURM_CONF: eval "\$(bash tests/slurm/real_slurm.sh)"}"
  export PATH="$repo/.venv/bin:$PATH"
else
  export PATH="$repo/tests/slurm/bin:$repo/.venv/bin:$PATH"
fi
export FAKE_SLURM_DIR="$work/slurm" CORAG_PROCS_PER_NODE=1 OMP_NUM_THREADS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
start=$SECONDS
step() { echo "== $* ($(( SECONDS - start )) s)"; }
show_logs() { tail -n 30 logs/* corag-*.out 2>/dev/null || true; }
trap 'echo "tests/slurm/run.sh: failed; logs:"; show_logs' ERR

step "toy data, index and the shipped warm model"
corag toyworld --out data/toy --seed 2 --num_entities 60 --num_distractors 15 --train_per_hop 24 \
  --test_per_hop 3 > /dev/null
corag index data/toy/corpus.jsonl --out data/index/toy --model minilm > /dev/null
mkdir -p models
ln -sfn "$(python -c 'from corag.toy.quickstart import WARM; print(WARM)')" models/warm

step "1. rejection sampling: 2 array tasks, each with its node's retrieval service"
sbatch --wait --array=0-1 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  sampling/slurm_array.sh configs/sampling/toy.yaml --serve-index data/index/toy --num-shards 4 \
  -- --model models/warm --questions data/toy/train.jsonl --corpus data/toy/corpus.jsonl \
  --out_dir runs/chains/toy --block_size 4
grep -q "retrieval service at http://127.0.0.1:" corag-sample-*_0.out corag-sample-*_1.out
for shard in runs/chains/toy/chains-0000[0-3]-of-00004.jsonl; do test -s "$shard"; done  # 72 questions, 18 blocks

grep -q "CPU(s) usable on" corag-sample-*_0.out corag-sample-*_1.out  # each node logs its usable CPUs
step "2. merge and build examples"
corag merge --questions data/toy/train.jsonl --out data/chains/toy.jsonl runs/chains/toy/chains-*-of-00004.jsonl
corag build-examples --chains data/chains/toy.jsonl --corpus data/toy/corpus.jsonl --tokenizer models/warm \
  --dataset data/sft/toy

step "3. SFT on 2 nodes x 1 process"
sbatch --wait --nodes=2 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  recipes/slurm_train.sh sft ddp configs/sft/toy.yaml --model_name_or_path models/warm --dataset data/sft/toy \
  --output_dir runs/sft/toy --max_steps 2 --save_strategy no
# Ranks follow the order the nodes join the rendezvous: the first process may be on either node.
test "$(cat logs/corag-sft-*-node*.log | grep -c "processes: 2")" = 1
test -f runs/sft/toy/model.safetensors
test "$(cat logs/corag-sft-*-node*.log | grep -c "CPU(s) usable on")" = 2  # each node's usable CPUs
# A clean end: no node's log holds a traceback, an error line or C++ frames (a node that ended after the
# rendezvous store's host did failed its exit barrier so).
if grep -E "Traceback|Error|^frame #|Exception raised from" logs/corag-sft-*-node*.log; then
  echo "tests/slurm/run.sh: a node's log of a finished SFT run holds errors"; exit 1
fi

step "3b. GRPO on 2 nodes x 1 process, each node searching its own retrieval service"
sbatch --wait --nodes=2 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  recipes/slurm_train.sh grpo ddp configs/grpo/toy.yaml --serve-index data/index/toy \
  --model_name_or_path runs/sft/toy --output_dir runs/grpo/toy --questions data/toy/train.jsonl \
  --corpus data/toy/corpus.jsonl --max_steps 2 --save_strategy no --per_device_train_batch_size 4
test "$(cat logs/corag-grpo-*-node*.log | grep -c "searches http://127.0.0.1:")" = 2
test "$(cat logs/corag-grpo-*-node*.log | grep -c "processes: 2")" = 1
grep -q "2 questions a step over 2 processes" logs/corag-grpo-*-node*.log  # the toy's 2, not 2 a process
test -f runs/grpo/toy/model.safetensors

step "4. evaluation of two question sets over 2 nodes x 2 GPUs, each node searching its own retrieval service"
sbatch --wait --nodes=2 --gpus-per-node=2 --cpus-per-task=1 --mem=4G \
  evaluation/slurm_eval.sh configs/eval/toy.yaml --serve-index data/index/toy \
  --data data/toy/test.jsonl --data data/toy/single_hop.jsonl --out-root runs/eval -- --model runs/sft/toy --limit 6
cat runs/eval/results.md
grep -q "| test | greedy:L=2 |" runs/eval/results.md
grep -q "| single_hop | greedy:L=2 |" runs/eval/results.md
test "$(grep -c "searches http://127.0.0.1:" corag-eval-*.out)" = 2  # node 0's service and node 1's
test "$(grep -c "CPU(s) usable on" corag-eval-*.out)" = 2  # each node logs its usable CPUs
for part in 0 1 2 3; do test -s logs/corag-eval-*-test-part$part.log; done  # 4 engines, each a part of a file
# the 4 parts merged are what one process writes, to the byte
corag evaluate --config configs/eval/toy.yaml --model runs/sft/toy --data data/toy/test.jsonl --limit 6 \
  --out-dir runs/eval-one/test > /dev/null
cmp runs/eval/test/greedy_L2/predictions.jsonl runs/eval-one/test/greedy_L2/predictions.jsonl

step "5. a sampling array task warned before its time limit saves, requeues itself and resumes"
# Task 0 samples shard 0 of 2 (blocks 0, 2, ..., 16 of 4 questions each): warned once block 0 is written, it
# ends after the block in hand, and the task requeues; its rerun (the same task id, its output appended)
# samples the rest. Blocks are sampled whole, so the chains are step 1's, however sharded or stopped.
sbatch --wait --array=0-1 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  sampling/slurm_array.sh configs/sampling/toy.yaml --serve-index data/index/toy --num-shards 2 \
  -- --model models/warm --questions data/toy/train.jsonl --corpus data/toy/corpus.jsonl \
  --out_dir runs/chains/requeue --block_size 4 > submitted.txt &
array=$!
until [[ -s runs/chains/requeue/chains-00000-of-00002.jsonl ]]; do
  kill -0 "$array" 2> /dev/null || { echo "the array ended before it was warned"; exit 1; }
  sleep 0.2
done
job=$(sed -n 's/^Submitted batch job //p' submitted.txt)
scancel --signal=USR1 --batch "${job}_0"  # what --signal=B:USR1@600 sends 10 minutes before the limit
wait "$array"
grep -q "requeueing it (1 of at most 3)" "corag-sample-${job}_0.out"
grep -q "stopped on the warning signal" "corag-sample-${job}_0.out"
test "$(grep -c "retrieval service at" "corag-sample-${job}_0.out")" = 2  # the run and its rerun
corag merge --questions data/toy/train.jsonl --out data/chains/requeue.jsonl \
  runs/chains/requeue/chains-*-of-00002.jsonl  # every question exactly once, or it fails
cmp data/chains/requeue.jsonl data/chains/toy.jsonl  # the same chains as the uninterrupted run of step 1
step "5b. an evaluation job warned before its time limit stops its parts, requeues itself and resumes"
# 2 nodes x 1 GPU: 2 parts of step 4's 6 questions, answered one at a time (--max_active 1). Warned once part
# 0 has written its first answer, the parts end after the question in hand and nothing is merged; the job
# requeues itself, and its rerun (the same job id, its output appended) answers the rest, merges and
# writes the table: the merged predictions are step 4's one-process run's, to the byte.
sbatch --wait --nodes=2 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  evaluation/slurm_eval.sh configs/eval/toy.yaml --serve-index data/index/toy --data data/toy/test.jsonl \
  --out-root runs/eval-requeue -- --model runs/sft/toy --limit 6 --max_active 1 > submitted-eval.txt &
evaluation=$!
until [[ -s runs/eval-requeue/test/parts/part-00000-of-00002/greedy_L2/predictions.jsonl ]]; do
  kill -0 "$evaluation" 2> /dev/null || { echo "the evaluation ended before it was warned"; exit 1; }
  sleep 0.2
done
eval_job=$(sed -n 's/^Submitted batch job //p' submitted-eval.txt)
scancel --signal=USR1 --batch "$eval_job"  # what --signal=B:USR1@600 sends 10 minutes before the limit
wait "$evaluation"
grep -q "no file merged, the rerun resumes" "corag-eval-$eval_job.out"
grep -q "requeueing it (1 of at most 3)" "corag-eval-$eval_job.out"
grep -q "stopped on the warning signal after" logs/corag-eval-"$eval_job"-test-part*.log  # in a part's log
test "$(grep -c "searches http://127.0.0.1:" "corag-eval-$eval_job.out")" = 4  # each node's service, run and rerun
cmp runs/eval-requeue/test/greedy_L2/predictions.jsonl runs/eval-one/test/greedy_L2/predictions.jsonl
grep -q "| test | greedy:L=2 |" runs/eval-requeue/results.md
step "6. a retrieval service job of its own, and the array submitted after it (--dependency=after)"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
service=$(PORT=$port sbatch --parsable --gpus=1 --mem=4G sampling/serve_retriever.sh data/index/toy runs/retriever.url)
sbatch --wait --dependency=after:"$service" --array=0-1 --gpus-per-node=1 --cpus-per-task=1 --mem=4G \
  sampling/slurm_array.sh configs/sampling/toy.yaml --retriever-url-file runs/retriever.url --num-shards 2 \
  -- --model models/warm --questions data/toy/train.jsonl --corpus data/toy/corpus.jsonl \
  --out_dir runs/chains/remote --block_size 4
scancel "$service"
grep -q "retrieval service at http://.*:$port" corag-sample-*_0.out
corag merge --questions data/toy/train.jsonl --out data/chains/remote.jsonl runs/chains/remote/chains-*-of-00002.jsonl
cmp data/chains/remote.jsonl data/chains/toy.jsonl  # the same chains through the service of its own
step "7. one round of corag iterate with launcher slurm, and its rerun"
bash "$repo/tests/slurm/iterate_round.sh" "$work"
if [[ "${CORAG_SLURM:-}" == real ]]; then  # the partition's nodes, as sinfo lists them (the stand-ins have none)
  step "8. corag submit: the launch scripts' headers fit these small nodes; a job larger than any node is refused"
  for script in sampling/slurm_array.sh recipes/slurm_train.sh sampling/serve_retriever.sh evaluation/slurm_eval.sh; do
    corag submit "$script" --gpus-per-node=1 --cpus-per-task=1 --mem=4G --test-only
  done
  if corag submit sampling/serve_retriever.sh --cpus-per-task=64 --mem=4G -- data/index/toy runs/x.url 2> refused.txt; then
    echo "tests/slurm/run.sh: corag submit let through a job no node can run"; exit 1
  fi
  grep -q -- "--cpus-per-task=64 asks 64 CPU(s) a node" refused.txt  # sbatch alone queues it for good (PartitionConfig)
  # --time over the partition's MaxTime (1 h): sbatch alone queues it for good (PartitionTimeLimit)
  if corag submit sampling/slurm_pool.sh -p short --time=02:00:00 --mem=4G 2> refused-time.txt; then
    echo "tests/slurm/run.sh: corag submit let through a job over the partition's time limit"; exit 1
  fi
  test "$(wc -l < refused-time.txt)" = 1
  grep -q -- "--time=02:00:00 asks 2 h, over partition 'short''s time limit of 1 h" refused-time.txt
fi
step "9. the smoke job (its first stages; tests/commands/test_smoke.py runs every one) and an encoding job"
sbatch --wait --gpus-per-node=1 --cpus-per-task=1 --mem=4G sampling/slurm_smoke.sh --small --out_dir runs/smoke \
  --stages weights data encode serve --minutes 20
grep -q "smoke: 4 ok, 0 failed, 0 skipped" corag-smoke-*.out
grep -q "| serve | ok |" runs/smoke/smoke.md
# 2 tasks, each encoding its half of the chunks, then the merge: the index a one-process build writes
sbatch --wait --ntasks=2 --gpus-per-task=1 --cpus-per-task=1 --mem=4G \
  sampling/slurm_encode.sh data/toy/corpus.jsonl data/index/toy-encoded minilm --chunk_size 16
test "$(ls logs/encode-*-shard*.log | wc -l)" = 2
python - << 'EOF'
import json
encoded, built = (json.load(open(f"data/index/{name}/manifest.json")) for name in ("toy-encoded", "toy"))
assert encoded["complete"] and encoded["corpus"] == built["corpus"], (encoded, built)
EOF
step "done: the cluster path ran end to end in $work"
