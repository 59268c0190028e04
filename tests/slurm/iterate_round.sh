#!/usr/bin/env bash
# One round of `corag iterate` with `launcher: slurm` on the toy world under the Slurm stand-ins, in the
# work folder tests/slurm/run.sh prepared (its toy world and index, step 1's chains, step 3's SFT model):
# the sampling array over 2 nodes and its 4 shards merged, the pool job scoring round 0 (step 1's chains)
# under the round's sampler, SFT over 2 nodes, evaluation over 2 nodes x 2 GPUs with its parts merged, and
# rounds.md; then a rerun that resumes with every stage done and submits no job.
#
#   bash tests/slurm/iterate_round.sh WORK_DIR      # tests/slurm/run.sh runs it after its steps
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "${1:?usage: bash tests/slurm/iterate_round.sh WORK_DIR (a folder tests/slurm/run.sh prepared)}"
[[ "${CORAG_SLURM:-}" == real ]] || export PATH="$repo/tests/slurm/bin:$PATH"  # as run.sh chooses
export PATH="$repo/.venv/bin:$PATH" FAKE_SLURM_DIR=${FAKE_SLURM_DIR:-$PWD/slurm}
export CORAG_PROCS_PER_NODE=1 OMP_NUM_THREADS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
out=runs/iterate/toy
rm -rf iterate "$out"
mkdir -p iterate
head -n 16 data/chains/toy.jsonl > iterate/round0.jsonl  # the SFT model's chains of the round's 16 questions
cat > iterate/sampling.yaml << 'YAML'
base: ../configs/sampling/toy.yaml
num_shards: 4   # 4 blocks of 4 questions over 4 shards, 2 array tasks
block_size: 4
num_chains: 2
max_length: 2
YAML
cat > iterate/toy.yaml << 'YAML'
model: runs/sft/toy
questions: data/toy/train.jsonl
corpus: data/toy/corpus.jsonl
retriever: data/index/toy
eval_data: data/toy/test.jsonl
out_dir: runs/iterate/toy
rounds: 1
round0_chains: iterate/round0.jsonl
limit: 16
eval_limit: 6
methods: ["greedy:L=2"]
launcher: slurm
sampling_config: iterate/sampling.yaml
sft_config: configs/sft/toy.yaml
accelerate: ddp
sft_args: "--max_steps 2 --bf16 false"
eval_config: configs/eval/toy.yaml
sbatch_args: "--gpus-per-node=1 --cpus-per-task=1 --mem=4G"
sample_sbatch: "--array=0-1"
train_sbatch: "--nodes=2"
eval_sbatch: "--nodes=2 --gpus-per-node=2"
YAML
export CORAG_POLL_SECONDS=2  # how often the driver asks Slurm whether its job has ended
corag iterate --config iterate/toy.yaml > iterate/run.log
cat iterate/run.log
mapfile -t jobs < <(sed -n 's/^\[round1\/[a-z]*\] job \([0-9]*\) submitted.*/\1/p' iterate/run.log)
test "${#jobs[@]}" = 4  # sample, pool, train, evaluate
# sampled by the array: both tasks served the index and sampled; 4 shards merged, 16 questions once each
grep -q "retrieval service at http://127.0.0.1:" "corag-sample-${jobs[0]}_0.out" "corag-sample-${jobs[0]}_1.out"
for shard in 0 1 2 3; do test -s "$out/round1/shards/chains-0000$shard-of-00004.jsonl"; done
test "$(wc -l < "$out/round1/chains.jsonl")" = 16
# the pool job scored round 0's chains under the round's sampler: 16 records, each from round 0 or 1
grep -q "pool of 2 round(s)" "corag-pool-${jobs[1]}.out"
test "$(grep -c '"scoring_prompt"' "$out/round1/pool.jsonl")" = 16
# SFT over 2 nodes x 1 process, on the pool's examples
test "$(cat logs/corag-sft-"${jobs[2]}"-node*.log | grep -c "processes: 2")" = 1
test -f "$out/round1/model/config.json" && test -d "$out/round1/model-examples"
# evaluation over 2 nodes x 2 GPUs: 4 parts, merged into the run's metrics
for part in 0 1 2 3; do test -s "logs/corag-eval-${jobs[3]}-test-part$part.log"; done
test -f "$out/round1/eval/test/greedy_L2/metrics.json"
grep -q "greedy:L=2 em" "$out/rounds.md" && grep -q "^| 1 | runs/sft/toy |" "$out/rounds.md"
# a rerun resumes: every stage done, no job submitted, the same table
cp "$out/rounds.md" iterate/rounds-before.md
corag iterate --config iterate/toy.yaml > iterate/rerun.log
test "$(grep -c "already done" iterate/rerun.log)" = 4
if grep "sbatch\|Submitted batch job" iterate/rerun.log; then echo "the rerun submitted a job"; exit 1; fi
cmp "$out/rounds.md" iterate/rounds-before.md
# the driver killed while its sampling array runs, and rerun: it waits for that array, submits no other
killed=runs/iterate/killed
sed "s#^out_dir: .*#out_dir: $killed#" iterate/toy.yaml > iterate/killed.yaml
corag iterate --config iterate/killed.yaml > iterate/killed.log 2> iterate/killed.err &
driver=$!
until grep -q '"round1/sample"' "$killed/jobs.json" 2> /dev/null; do
  kill -0 "$driver" 2> /dev/null || { echo "the driver ended before it submitted"; exit 1; }
  sleep 0.5
done
kill -TERM "$driver"
wait "$driver" && { echo "the killed driver exited 0"; exit 1; }
sample_job=$(sed -n 's/.*"round1\/sample": "\([0-9]*\)".*/\1/p' "$killed/jobs.json")
grep -q "ended by SIGTERM while job $sample_job (round1/sample) runs; the job goes on" iterate/killed.err
corag iterate --config iterate/killed.yaml > iterate/killed-rerun.log 2>&1 &
rerun=$!
until grep -q "waiting for it, not submitting again" iterate/killed-rerun.log; do
  kill -0 "$rerun" 2> /dev/null || { cat iterate/killed-rerun.log; echo "the rerun ended before it waited"; exit 1; }
  sleep 0.5
done
grep -q "\[round1/sample\] job $sample_job recorded in $killed/jobs.json is" iterate/killed-rerun.log
if grep -q "\[round1/sample\] job [0-9]* submitted" iterate/killed-rerun.log; then echo "the rerun submitted a second array"; exit 1; fi
if [[ "${CORAG_SLURM:-}" == real ]]; then  # one sampling array in the queue, not two
  test "$(squeue -h -n corag-sample -o %F | sort -u | wc -l)" = 1
fi
kill -TERM "$rerun"; wait "$rerun" || true
scancel "$sample_job" 2> /dev/null || true
echo "tests/slurm/iterate_round.sh: one round through the launchers, and its rerun, in $PWD/$out"
