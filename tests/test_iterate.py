"""corag iterate (corag/iterate.py): rounds of sample, pool, train and evaluate, each round's model sampling
the next and training on the best chain per question over all rounds, resumable at every stage."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import corag.cluster.rounds
import corag.iterate
from corag.cli import main as cli
from corag.data.corpus import Corpus
from corag.data.formats import load_examples
from corag.data.jsonl import read_jsonl, write_jsonl
from corag.errors import InputError
from corag.lm import load_lm
from corag.retrieval.bm25 import build_bm25_folder
from corag.sampling import SampledChain, SamplingConfig, chain_record, score_chains

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def flags(toy_world, toy_dir, tiny_model_dir, tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("iterate")
    index = folder / "index"
    build_bm25_folder([toy_world.passages], index, num_docs=len(toy_world.passages))
    (folder / "iterate.yaml").write_text("rounds: 2\n")  # not the packaged toy config's settings
    return [
        "--config", str(folder / "iterate.yaml"),
        "--model", str(tiny_model_dir), "--questions", str(toy_dir / "train.jsonl"),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--retriever", str(index),
        "--eval_data", str(toy_dir / "test.jsonl"), "--limit", "4", "--eval_limit", "3",
        "--methods", "greedy:L=1", "--num_chains", "2", "--max_length", "1", "--rounds", "2",
        "--recipe", str(REPO / "recipes/sft.py"), "--sft_config", str(REPO / "configs/sft/toy.yaml"),
        "--sft_args=--max_steps 1 --bf16 false",
    ]  # fmt: skip


def test_each_round_samples_with_the_last_model_and_resumes(flags, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "rounds"
    assert cli(["iterate", *flags, "--out_dir", str(out)]) == 0
    rows = json.loads((out / "rounds.json").read_text())
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["sampled_by"] == rows[0]["trained_from"] == str(tiny_model_dir)
    assert rows[1]["sampled_by"] == rows[1]["trained_from"] == str(out / "round1" / "model")  # init: last
    assert all(r["chains"] == 4 and "greedy:L=1 em" in r for r in rows)
    assert rows[0]["from_earlier_rounds"] == 0 and rows[1]["learning_rate"] == "sft_config"
    assert (out / "rounds.md").read_text().count("\n") == 4
    # the second round sampled anew (another model, the next seed)
    first, second = ((out / f"round{r}" / "chains.jsonl").read_text() for r in (1, 2))
    assert first != second
    # a rerun resumes: every stage done; with the second round's model gone, only it is trained again
    shutil.rmtree(out / "round2" / "model")
    capsys.readouterr()
    assert cli(["iterate", *flags, "--out_dir", str(out)]) == 0
    log = capsys.readouterr().out
    assert "[round 1: sample] already done" in log and "[round 1: train] already done" in log
    assert "[round 2: sample] already done" in log and "[round 2: train] done" in log
    assert json.loads((out / "rounds.json").read_text())[0] == rows[0]


def test_a_round_trains_on_the_best_chain_per_question_over_all_rounds(
    flags, toy_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "rounds"
    args = ["iterate", *flags, "--out_dir", str(out), "--last_learning_rate", "5e-5"]
    assert cli(args) == 0
    first, second = (read_jsonl(out / f"round{r}" / "chains.jsonl") for r in (1, 2))
    differ = [i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a["steps"] != b["steps"]]
    assert len(differ) >= 2
    worse, better = differ[:2]
    # round 2's sampler found a worse chain than round 1's for one question, a perfect one for another
    second[worse]["score"], second[better]["score"] = -100.0, 0.0
    write_jsonl(out / "round2" / "chains.jsonl", second)
    (out / "round2" / "pool.jsonl").unlink()  # pool, train and evaluate round 2 again
    for done in ("model", "model-examples", "eval"):  # the recipe's dataset of the old pool too
        shutil.rmtree(out / "round2" / done)
    calls = []
    train = corag.iterate.run_recipe
    monkeypatch.setattr(corag.iterate, "run_recipe", lambda *a: (calls.append(a), train(*a))[1])
    assert cli(args) == 0
    pool = read_jsonl(out / "round2" / "pool.jsonl")
    assert pool[worse]["steps"] == first[worse]["steps"] and pool[worse]["round"] == 1
    questions = {e.id: e for e in load_examples(str(toy_dir / "train.jsonl"))}
    judge = load_lm(out / "round1" / "model")  # round 2's sampler scores round 1's chain again
    corpus = Corpus.load(str(toy_dir / "corpus.jsonl"))
    rescored = score_chains([first[worse]], questions, corpus, judge)[0]
    assert pool[worse]["score"] == pytest.approx(rescored, abs=1e-4) and rescored > -100
    assert pool[better]["steps"] == second[better]["steps"] and pool[better]["round"] == 2
    assert pool[better]["score"] == 0.0
    assert json.loads((out / "rounds.json").read_text())[1]["from_earlier_rounds"] >= 1
    # round 2 trained on the pool, from round 1's checkpoint at the lower learning rate
    [(_, _, start, _, data, extra)] = calls
    assert start == str(out / "round1" / "model")
    assert data["chains"] == str(out / "round2" / "pool.jsonl") and extra[-1] == "--learning_rate=5e-05"
    # the pool is a finished stage: a rerun keeps it
    capsys.readouterr()
    assert cli(args) == 0
    assert "[round 2: pool] already done" in capsys.readouterr().out
    assert read_jsonl(out / "round2" / "pool.jsonl") == pool


def test_round0_chains_are_candidates_too(flags, toy_world, toy_dir, tiny_model_dir, tmp_path):
    """The chains `model` was fine-tuned on (here: the gold chains) compete in round 1's pool."""
    questions = {e.id: e for e in load_examples(str(toy_dir / "train.jsonl"))}
    gold = [
        chain_record(
            e, SampledChain(e.decomposition, 0.0, 3, None), list(e.supporting_ids), SamplingConfig(), ""
        )
        for e in toy_world.train[:4]
    ]
    write_jsonl(tmp_path / "gold.jsonl", gold)
    out = tmp_path / "rounds"
    args = [*flags, "--out_dir", str(out), "--rounds", "1", "--round0_chains", str(tmp_path / "gold.jsonl")]
    assert cli(["iterate", *args]) == 0
    own, pool = read_jsonl(out / "round1" / "chains.jsonl"), read_jsonl(out / "round1" / "pool.jsonl")
    corpus = Corpus.load(str(toy_dir / "corpus.jsonl"))
    rescored = score_chains(gold, questions, corpus, load_lm(tiny_model_dir))
    assert [r["query_id"] for r in pool] == [r["query_id"] for r in own] == [r["query_id"] for r in gold]
    for g, o, p, score in zip(gold, own, pool, rescored, strict=True):
        assert p["score"] == pytest.approx(max(score, o["score"]), abs=1e-4)
        if abs(score - o["score"]) > 1e-4:
            assert (p["round"], p["steps"]) == ((0, g["steps"]) if score > o["score"] else (1, o["steps"]))
    rows = json.loads((out / "rounds.json").read_text())
    assert rows[0]["from_earlier_rounds"] == sum(p["round"] == 0 for p in pool)


class WarnedAfter:
    """Slurm's warning, come once `checks` looks at it were made."""

    def __init__(self, checks: int) -> None:
        self.checks = checks

    @property
    def received(self) -> bool:
        self.checks -= 1
        return self.checks < 0


def test_a_stopped_pool_goes_on_with_the_chains_it_scored(
    toy_world, toy_dir, tiny_model_dir, tmp_path, monkeypatch
):
    """Warned while it scores the earlier rounds' chains, the pool keeps each score as it came and writes no
    pool; its rerun scores only the rest, and the pool is an uninterrupted run's."""
    questions = load_examples(str(toy_dir / "train.jsonl"))
    corpus = Corpus.load(str(toy_dir / "corpus.jsonl"))
    files = {}
    for k, depth in enumerate((3, 1, 2)):  # three rounds' chains for 4 questions: 8 earlier ones
        records = [
            chain_record(
                e, SampledChain(e.decomposition[:depth], -float(k), depth, None), [], SamplingConfig(), ""
            )
            for e in toy_world.train[:4]
        ]
        files[k] = tmp_path / f"round{k}.jsonl"
        write_jsonl(files[k], records)
    scored = []
    score = corag.iterate.iter_chain_scores
    monkeypatch.setattr(
        corag.iterate,
        "iter_chain_scores",
        lambda chains, *a: (scored.append(len(chains)), score(chains, *a))[1],
    )

    def pool(path: Path, stop=None, sampler: str = "m") -> bool:
        def load(name: str):  # the sampler's name goes into the scores file; the tiny model scores
            return load_lm(tiny_model_dir)

        return corag.iterate.pool_chains(files, questions, corpus, sampler, load, "final", path, stop=stop)

    assert pool(tmp_path / "whole.jsonl") and scored == [8]
    assert not (tmp_path / "whole.scores.jsonl").exists()  # gone once the pool is written
    assert not pool(tmp_path / "pool.jsonl", stop=WarnedAfter(3))
    kept = read_jsonl(tmp_path / "pool.scores.jsonl")[1:]
    assert not (tmp_path / "pool.jsonl").exists() and 1 <= len(kept) < 8
    with pytest.raises(InputError, match="made with other inputs") as err:
        pool(tmp_path / "pool.jsonl", sampler="another model")
    assert err.value.field == "inputs"
    assert pool(tmp_path / "pool.jsonl")
    assert scored == [8, 8, 8 - len(kept)]  # the rerun scored only what was left
    # The same chain kept for every question; a score may move in its last digit, the rest of the chains
    # being batched otherwise after the stop (seen on a real Slurm: 3 of 600 scores, by 1e-6).
    resumed, whole = read_jsonl(tmp_path / "pool.jsonl"), read_jsonl(tmp_path / "whole.jsonl")
    assert [{**r, "score": 0} for r in resumed] == [{**r, "score": 0} for r in whole]
    assert [r["score"] for r in resumed] == pytest.approx([r["score"] for r in whole], abs=2e-6)


def test_other_settings_in_the_same_folder_are_refused(flags, tmp_path):
    out = tmp_path / "rounds"
    assert cli(["iterate", *flags, "--out_dir", str(out), "--rounds", "1"]) == 0
    with pytest.raises(InputError, match=r"other settings \(init: 'last' -> 'base'\)"):
        from corag.commands.iterate import main

        main([*flags, "--out_dir", str(out), "--rounds", "1", "--init", "base"])


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--init", "first"], "init"),
        (["--rounds", "0"], "rounds"),
        (["--methods", "nope"], "methods"),
        (["--last_learning_rate", "0"], "last_learning_rate"),
        (["--round0_chains", "nowhere.jsonl"], "round0_chains"),
    ],
)
def test_bad_settings_are_one_line(flags, tmp_path, capsys, extra, field):
    try:  # argparse refuses a choice itself (SystemExit 2); corag refuses the rest (exit status 2)
        status = cli(["iterate", *flags, "--out_dir", str(tmp_path / "o"), *extra])
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag iterate: error:") and field in err[-1]


SLURM_SAMPLING = "num_shards: 2\nnum_chains: 2\nmax_length: 1\nseed: 5\nbackend: hf\n"


@pytest.fixture
def slurm_flags(flags, toy_world, tmp_path, monkeypatch) -> list[str]:
    """The local flags under `launcher: slurm`, run from a folder without the launch scripts (they are the
    package's); the
    sampling settings live in the sampling config, round 0 is the gold chains of the 4 questions."""
    monkeypatch.chdir(tmp_path)
    Path("sampling.yaml").write_text(SLURM_SAMPLING)
    Path("eval.yaml").write_text("backend: hf\n")
    gold = [
        chain_record(
            e, SampledChain(e.decomposition, 0.0, 3, None), list(e.supporting_ids), SamplingConfig(), ""
        )
        for e in toy_world.train[:4]
    ]
    write_jsonl("gold.jsonl", gold)
    sampling_flags = ("--num_chains", "--max_length")  # the sampling config's under slurm
    kept = [w for i, w in enumerate(flags) if w not in sampling_flags and flags[i - 1] not in sampling_flags]
    return [
        *kept, "--rounds", "1", "--launcher", "slurm", "--sampling_config", "sampling.yaml",
        "--eval_config", "eval.yaml", "--accelerate", "ddp", "--round0_chains", "gold.jsonl",
        "--sbatch_args=--partition=gpu", "--sample_sbatch=--array=0-1 --mem=8G",
        "--train_sbatch=--nodes=2", "--eval_sbatch=--nodes=2", "--out_dir", "rounds",
    ]  # fmt: skip


class FakeSbatch:
    """Slurm as the launch scripts' jobs would end, for every command the driver runs: `sbatch
    --parsable` runs the job at once (each writes what its stage leaves; the pool job runs for real, in
    process) or fails it where told, and prints its id; squeue lists `running` jobs; `scontrol show job`
    gives the ended ones' states; sinfo lists `nodes`."""

    def __init__(
        self, fail: str | None = None, nodes: str = "gpu* 2 64 512000 gpu:8 2-00:00:00 idle"
    ) -> None:
        self.commands: list[list[str]] = []
        self.fail = fail
        self.nodes = nodes
        self.states: dict[str, str] = {}
        self.running: set[str] = set()

    def __call__(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        if command[0] == "sinfo":
            return subprocess.CompletedProcess(command, 0, self.nodes + "\n", "")
        if command[0] == "squeue":
            job = command[command.index("-j") + 1]
            return subprocess.CompletedProcess(command, 0, "RUNNING\n" if job in self.running else "", "")
        if command[:3] == ["scontrol", "show", "job"]:
            state = self.states.get(command[3])
            if state is None:
                return subprocess.CompletedProcess(
                    command, 1, "", "slurm_load_jobs error: Invalid job id specified"
                )
            return subprocess.CompletedProcess(
                command, 0, f"JobId={command[3]} JobState={state} ExitCode=0:0", ""
            )
        assert command[0] == "sbatch", command
        self.commands.append(command)
        job = str(1000 + len(self.commands))
        self.states[job] = "COMPLETED" if self.run(command) else "FAILED"
        return subprocess.CompletedProcess(command, 0, f"{job}\n", "")

    def run(self, command: list[str]) -> bool:
        from corag.cluster.pool import main as pool

        script = next(w for w in command if w in corag.cluster.rounds.SCRIPTS.values())
        args = command[command.index(script) + 1 :]
        value = dict(zip(args, [*args[1:], ""], strict=True))
        if script == self.fail:
            return False
        if script.endswith("slurm_array.sh"):  # question i in shard i % 2, each chain worse than gold's
            out = Path(value["--out_dir"])
            out.mkdir(parents=True)
            questions = load_examples(value["--questions"])[: int(value["--limit"])]
            for shard in (0, 1):
                chains = [{"query_id": e.id, "score": -100.0, "steps": []} for e in questions[shard::2]]
                write_jsonl(out / f"chains-{shard:05d}-of-00002.jsonl", chains)
        elif script.endswith("slurm_pool.sh"):
            assert pool(args) == 0
        elif script.endswith("slurm_train.sh"):
            Path(value["--output_dir"]).mkdir(parents=True)
            (Path(value["--output_dir"]) / "config.json").write_text("{}")
        else:
            run = Path(value["--out-root"]) / Path(value["--data"]).stem / "greedy_L1"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"em": 50.0, "f1": 60.0, "tokens_per_question": 7}))
        return True


def test_the_slurm_launcher_submits_each_stage_as_the_cluster_path_and_resumes(
    slurm_flags, tiny_model_dir, toy_dir, monkeypatch, capsys
):
    sbatch = FakeSbatch()
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", sbatch)
    assert cli(["iterate", *slurm_flags]) == 0
    sample, pool, train, evaluate = sbatch.commands
    for command, script in zip(sbatch.commands, corag.cluster.rounds.SCRIPTS.values(), strict=True):
        assert command[:3] == ["sbatch", "--parsable", "--partition=gpu"] and script in command
    # the array: its flags, the sampling config with the index served on each node, the round's sampler
    # and seed (the sampling config's, round 1)
    assert sample[3:5] == ["--array=0-1", "--mem=8G"]
    assert sample[6:10] == [
        "sampling.yaml",
        "--serve-index",
        slurm_flags[slurm_flags.index("--retriever") + 1],
        "--",
    ]
    assert ["--model", str(tiny_model_dir)] == sample[10:12] and sample[-4:] == [
        "--seed",
        "5",
        "--limit",
        "4",
    ]
    # its 2 shards merged in question order
    own = read_jsonl(Path("rounds/round1/chains.jsonl"))
    assert [r["query_id"] for r in own] == [e.id for e in load_examples(str(toy_dir / "train.jsonl"))[:4]]
    # the pool job: round 0 and the round's chains, scored under the round's sampler
    assert pool[-2:] == ["0=gold.jsonl", "1=rounds/round1/chains.jsonl"]
    kept = read_jsonl(Path("rounds/round1/pool.jsonl"))
    assert [r["round"] for r in kept] == [0, 0, 0, 0] and all(r["score"] > -100 for r in kept)
    # SFT over 2 nodes from the model, on the pool's examples (not the SFT config's dataset)
    assert train[3:7] == ["--nodes=2", corag.cluster.rounds.SCRIPTS["train"], "sft", "ddp"]
    # each job's id recorded in the run folder, by round and stage
    assert json.loads(Path("rounds/jobs.json").read_text()) == {
        "round1/sample": "1001", "round1/pool": "1002", "round1/train": "1003", "round1/evaluate": "1004"
    }  # fmt: skip
    assert train[train.index("--chains") + 1] == "rounds/round1/pool.jsonl"
    assert train[train.index("--dataset") + 1] == "none" and train[-2:] == ["--bf16", "false"]
    # evaluation of the round's model with the round's methods; the table reads its metrics
    assert evaluate[evaluate.index("--model") + 1] == "rounds/round1/model"
    assert evaluate[-2:] == ["--methods", "greedy:L=1"] and "--limit" in evaluate
    [row] = json.loads(Path("rounds/rounds.json").read_text())
    assert row["greedy:L=1 em"] == 50.0 and row["from_earlier_rounds"] == 4
    # a rerun submits nothing
    capsys.readouterr()
    assert cli(["iterate", *slurm_flags]) == 0
    assert len(sbatch.commands) == 4 and capsys.readouterr().out.count("already done") == 4


def test_a_failed_job_ends_the_run_in_one_line_and_the_rerun_resumes_it(slurm_flags, monkeypatch, capsys):
    sbatch = FakeSbatch(fail=corag.cluster.rounds.SCRIPTS["train"])
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", sbatch)
    assert cli(["iterate", *slurm_flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag iterate: the job 1003 of slurm_train.sh ended FAILED")
    sbatch.fail = None
    assert cli(["iterate", *slurm_flags]) == 0
    scripts = [next(w for w in c if w in corag.cluster.rounds.SCRIPTS.values()) for c in sbatch.commands]
    assert scripts == [
        *list(corag.cluster.rounds.SCRIPTS.values())[:3],
        *list(corag.cluster.rounds.SCRIPTS.values())[2:],
    ]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--sampling_config", "none"], "sampling_config"),
        (["--eval_config", "missing.yaml"], "eval_config"),
        (["--sample_sbatch=--nodes=2"], "sample_sbatch"),
        (["--num_chains", "3"], "num_chains"),  # the sampling config's setting under slurm
        (["--sampling_config", "eval.yaml"], "num_shards"),  # a sampling config needs num_shards
    ],
)
def test_bad_slurm_settings_are_one_line(slurm_flags, monkeypatch, capsys, extra, field):
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", FakeSbatch())
    assert cli(["iterate", *slurm_flags, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag iterate: error:") and f"field '{field}'" in err[-1]


def test_iterate_refuses_a_stage_no_node_can_run_before_submitting_any_job(slurm_flags, monkeypatch, capsys):
    """Nodes of 2 CPUs, 9000 MB and a 2-day limit: the train stage's --mem and --time are both named, in
    one line, before round 1 submits anything."""
    sbatch = FakeSbatch(nodes="gpu* 2 2 9000 gpu:8 2-00:00:00 idle")
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", sbatch)
    flags = [*slurm_flags, "--train_sbatch=--nodes=2 --mem=512G --time=3-00:00:00"]
    assert cli(["iterate", *flags]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("corag iterate: error: ") and "stage train (slurm_train.sh)" in line
    assert "--mem=512G asks 524288 MB of memory a node" in line and "--time=3-00:00:00 asks 72 h" in line
    assert "field 'train_sbatch'" in line
    assert sbatch.commands == [] and not Path("rounds").exists()


class RecordedJobRunning(FakeSbatch):
    """Job 555, submitted by an earlier driver for round 1's sampling, runs for two more polls, then ends
    having written the round's shards."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.polls = {"555"}, 0

    def __call__(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        if command[0] == "squeue" and "555" in command:
            self.polls += 1
            if self.polls == 3:
                out = Path("rounds/round1/shards")
                out.mkdir(parents=True)
                for shard in (0, 1):
                    chains = [
                        {"query_id": e["id"], "score": -100.0, "steps": []} for e in QUESTIONS[shard::2]
                    ]
                    write_jsonl(out / f"chains-{shard:05d}-of-00002.jsonl", chains)
                self.running, self.states["555"] = set(), "COMPLETED"
        return super().__call__(command, **kwargs)


QUESTIONS: list[dict] = []


def test_a_rerun_whose_recorded_job_still_runs_waits_for_it_and_submits_nothing_for_it(
    slurm_flags, toy_dir, monkeypatch, capsys
):
    QUESTIONS[:] = [{"id": e.id} for e in load_examples(str(toy_dir / "train.jsonl"))[:4]]
    monkeypatch.setenv("CORAG_POLL_SECONDS", "0")
    Path("rounds").mkdir()
    Path("rounds/jobs.json").write_text('{"round1/sample": "555"}')
    sbatch = RecordedJobRunning()
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", sbatch)
    assert cli(["iterate", *slurm_flags]) == 0
    out = capsys.readouterr().out
    assert (
        "[round1/sample] job 555 recorded in rounds/jobs.json is RUNNING: waiting for it, not submitting again"
        in out
    )
    scripts = [
        Path(next(w for w in c if w in corag.cluster.rounds.SCRIPTS.values())).name for c in sbatch.commands
    ]
    assert scripts == ["slurm_pool.sh", "slurm_train.sh", "slurm_eval.sh"]  # no second sampling array
    assert json.loads(Path("rounds/jobs.json").read_text())["round1/sample"] == "555"


def test_a_recorded_job_unknown_to_slurm_is_one_line_and_submitted_anew(slurm_flags, monkeypatch, capsys):
    Path("rounds").mkdir()
    Path("rounds/jobs.json").write_text('{"round1/sample": "777"}')
    sbatch = FakeSbatch()
    monkeypatch.setattr(corag.cluster.rounds.subprocess, "run", sbatch)
    assert cli(["iterate", *slurm_flags]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "777" in line]
    assert lines == [
        "[round1/sample] job 777 recorded in rounds/jobs.json is unknown to Slurm (ended long ago?): submitting anew"
    ]
    assert json.loads(Path("rounds/jobs.json").read_text())["round1/sample"] == "1001"
