"""Rejection sampling on the toy world with the real tiny model and a real BM25 index."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corag.commands.sample import main
from corag.data.corpus import Corpus
from corag.data.formats import load_examples, load_multihopqa
from corag.data.jsonl import write_jsonl
from corag.errors import InputError
from corag.lm import load_lm
from corag.lm.base import ScoreRequest
from corag.metrics import exact_match, max_over_golds
from corag.prompts import final_answer_messages, task_description
from corag.retrieval.bm25 import BM25Retriever, build_bm25_folder
from corag.sampling import (
    SamplingConfig,
    chain_lengths,
    merge_shards,
    run_sampling,
    shard_path,
    validate_questions,
)
from corag.types import Example, Step

NUM_QUESTIONS = 12
FLAGS = ["--num_chains", "3", "--max_length", "3", "--batch_size", "32", "--block_size", "2"]


@pytest.fixture(scope="module")
def setup(toy_world, toy_dir, short_model_dir, tmp_path_factory):
    """A BM25 index folder, the first questions of the toy world and the loaded pieces."""
    root = tmp_path_factory.mktemp("sampling")
    build_bm25_folder([list(toy_world.passages)], root / "bm25")
    questions = root / "questions.jsonl"
    lines = (toy_dir / "train.jsonl").read_text().splitlines()[:NUM_QUESTIONS]
    questions.write_text("\n".join(lines) + "\n")
    args = [
        "--model", str(short_model_dir), "--questions", str(questions),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--retriever", str(root / "bm25"), *FLAGS,
    ]  # fmt: skip
    return {"root": root, "questions": questions, "args": args, "toy_dir": toy_dir, "model": short_model_dir}


@pytest.fixture(scope="module")
def reference(setup):
    """One uninterrupted in-process run with every candidate kept."""
    out = setup["root"] / "reference"
    assert main([*setup["args"], "--out_dir", str(out), "--keep_candidates", "true"]) == 0
    return shard_path(out, 0, 1)


def _recompute(lm, record: dict, steps: list[Step]) -> float:
    messages = final_answer_messages(record["query"], steps, task_description(record["task"]), [], tok=lm)
    return lm.score([ScoreRequest(tuple(messages), record["answers"][0])])[0].mean


def _steps(candidate: dict, upto: int | None = None) -> list[Step]:
    pairs = list(zip(candidate["subqueries"], candidate["subanswers"], candidate["doc_ids"], strict=True))
    return [Step(q, a, tuple(d)) for q, a, d in pairs[:upto]]


def test_output_follows_the_schema(reference, setup):
    examples = load_multihopqa(reference)  # validates the corag/multihopqa schema
    records = [json.loads(line) for line in reference.read_text().splitlines()]
    assert [e.id for e in examples] == [r["query_id"] for r in records]
    assert len(records) == NUM_QUESTIONS
    for record in records:
        assert len(record["context_doc_ids"]) == 20
        assert len(record["subqueries"]) == len(record["subanswers"]) == len(record["steps"]) >= 1
        # BM25 returns only passages sharing a word with the sub-query (a random model may share none).
        assert all(len(step["doc_ids"]) <= 5 for step in record["steps"])
        assert record["scoring_prompt"] == "final_no_docs"
        assert record["tokens"] > 0 and record["model_calls"] > 0
        assert len(record["candidates"]) == 3
        lengths = chain_lengths(record["query_id"], SamplingConfig(num_chains=3, max_length=3))
        assert [c["max_length"] for c in record["candidates"]] == lengths


def test_kept_chain_is_the_argmax_of_recomputed_scores(reference, setup):
    lm = load_lm(setup["model"])
    for line in reference.read_text().splitlines():
        record = json.loads(line)
        scores = [_recompute(lm, record, _steps(c)) for c in record["candidates"]]
        for candidate, score in zip(record["candidates"], scores, strict=True):
            assert candidate["score"] == pytest.approx(score, abs=1e-4)
        best = record["candidates"][max(range(len(scores)), key=scores.__getitem__)]
        assert record["subqueries"] == best["subqueries"]
        assert record["score"] == pytest.approx(max(scores), abs=1e-4)


def test_every_chain_keeps_its_score_after_each_prefix(reference, setup):
    """prefix_scores[i] is the gold answer's score given the first i steps, the empty chain's first and the
    chain's own score last: what learned-stop examples are built from without loading the model again."""
    lm = load_lm(setup["model"])
    for line in reference.read_text().splitlines():
        record = json.loads(line)
        chains = [record, *record["candidates"]]
        for chain in chains:
            n = len(chain["subqueries"])
            steps = _steps(chain) if "doc_ids" in chain else [Step(**s) for s in chain["steps"]]
            assert len(chain["prefix_scores"]) == n + 1 and chain["prefix_scores"][-1] == chain["score"]
            recomputed = [_recompute(lm, record, steps[:i]) for i in range(n + 1)]
            assert chain["prefix_scores"] == pytest.approx(recomputed, abs=1e-4)


def test_chains_stop_exactly_when_the_rule_says(reference, setup):
    """A chain grows until its max length unless a step's answer matches or the likelihood passes."""
    lm = load_lm(setup["model"])
    threshold = SamplingConfig().early_stop_logprob
    for line in reference.read_text().splitlines():
        record = json.loads(line)
        golds = record["answers"]
        for candidate in record["candidates"]:
            n = len(candidate["subqueries"])
            for i in range(1, n + 1):
                matched = max_over_golds(exact_match, candidate["subanswers"][i - 1], golds) == 1.0
                likely = _recompute(lm, record, _steps(candidate, i)) > threshold
                if i < n:
                    assert not matched and not likely
                elif candidate["early_stop"] == "no_subquery":  # the next sub-query came out empty
                    assert not matched and not likely and n < candidate["max_length"]
                else:
                    expected = "answer_match" if matched else "likelihood" if likely else None
                    assert candidate["early_stop"] == expected
                    assert expected is not None or n == candidate["max_length"]


def test_early_stop_on_likelihood_ends_every_chain_after_one_step(setup, tmp_path):
    """With a threshold no chain can miss, every chain stops after its first step."""
    corpus = Corpus.load(setup["toy_dir"] / "corpus.jsonl")
    examples = load_examples(setup["questions"])[:2]
    config = SamplingConfig(
        num_chains=3, max_length=5, min_length=5, early_stop_logprob=-1e9, keep_candidates=True
    )
    lm = load_lm(setup["model"])
    retriever = BM25Retriever.load(setup["root"] / "bm25")
    summary = run_sampling(examples, corpus, lm, retriever, config, tmp_path / "c.jsonl", progress=False)
    assert summary["early_stop_rate"] == 1.0
    stepped = 0
    for line in (tmp_path / "c.jsonl").read_text().splitlines():
        for candidate in json.loads(line)["candidates"]:
            assert len(candidate["subqueries"]) <= 1  # none grew past its first step
            if candidate["subqueries"]:
                stepped += 1
                assert candidate["early_stop"] in {"likelihood", "answer_match"}
            else:
                assert candidate["early_stop"] == "no_subquery"
    assert stepped > 0


def test_same_seed_same_bytes_and_another_seed_differs(setup, reference, tmp_path):
    again = tmp_path / "again"
    assert main([*setup["args"], "--out_dir", str(again), "--keep_candidates", "true"]) == 0
    assert shard_path(again, 0, 1).read_bytes() == reference.read_bytes()
    other = tmp_path / "other"
    assert main([*setup["args"], "--out_dir", str(other), "--keep_candidates", "true", "--seed", "1"]) == 0
    assert shard_path(other, 0, 1).read_bytes() != reference.read_bytes()


def _cli(setup, *extra: str) -> list[str]:
    return [sys.executable, "-m", "corag.cli", "sample", *setup["args"], *extra]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_kill_nine_five_times_then_resume_equals_an_uninterrupted_run(setup, reference, tmp_path):
    out = tmp_path / "crashy"
    target = shard_path(out, 0, 1)
    rng = random.Random(7)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    kills, partial = 0, 0
    while kills < 5:
        before = _lines(target)
        proc = subprocess.Popen(
            _cli(setup, "--out_dir", str(out), "--keep_candidates", "true"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if kills % 2 == 0:  # after the next block lands, somewhere inside the one after
            deadline = time.time() + 300
            while _lines(target) <= before and proc.poll() is None and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.5))
        else:  # at any moment, start-up included
            time.sleep(rng.uniform(0.5, 6.0))
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        partial += 0 < _lines(target) < NUM_QUESTIONS
    assert partial >= 3  # most kills left a half-done output behind
    subprocess.run(
        _cli(setup, "--out_dir", str(out), "--keep_candidates", "true"), check=True, capture_output=True
    )
    examples = load_examples(setup["questions"])
    merge_shards([target], examples, tmp_path / "merged.jsonl")
    merge_shards([reference], examples, tmp_path / "merged_ref.jsonl")
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "merged_ref.jsonl").read_bytes()


def test_the_warning_signal_stops_after_the_block_in_hand_and_a_rerun_completes_the_run(
    setup, reference, tmp_path
):
    """Slurm's warning before the time limit (SIGUSR1): the shard ends after the block it is sampling,
    with whole blocks written and exit status 75; the rerun samples the rest, every question once."""
    out = tmp_path / "warned"
    target = shard_path(out, 0, 1)
    proc = subprocess.Popen(
        _cli(setup, "--out_dir", str(out), "--keep_candidates", "true"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    while _lines(target) == 0 and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err[-2000:]
    assert "stopped on the warning signal" in err
    written = _lines(target)
    assert 0 < written < NUM_QUESTIONS and written % 2 == 0  # whole blocks of 2, the rest left to do
    subprocess.run(
        _cli(setup, "--out_dir", str(out), "--keep_candidates", "true"), check=True, capture_output=True
    )
    examples = load_examples(setup["questions"])
    merge_shards([target], examples, tmp_path / "merged.jsonl")  # every question exactly once
    merge_shards([reference], examples, tmp_path / "merged_ref.jsonl")
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "merged_ref.jsonl").read_bytes()


@pytest.mark.slow
def test_two_shards_in_two_processes_merge_to_the_one_process_run(setup, reference, tmp_path):
    out = tmp_path / "shards"
    procs = [
        subprocess.Popen(
            _cli(
                setup,
                "--out_dir",
                str(out),
                "--keep_candidates",
                "true",
                "--shard",
                str(i),
                "--num_shards",
                "2",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-2000:]
    examples = load_examples(setup["questions"])
    shards = [shard_path(out, i, 2) for i in range(2)]
    assert all(_lines(s) == NUM_QUESTIONS // 2 for s in shards)
    merge_shards(shards, examples, tmp_path / "merged.jsonl")
    merge_shards([reference], examples, tmp_path / "merged_ref.jsonl")
    assert (tmp_path / "merged.jsonl").read_bytes() == (tmp_path / "merged_ref.jsonl").read_bytes()


def test_merge_refuses_missing_and_duplicated_ids(reference, setup, tmp_path):
    examples = load_examples(setup["questions"])
    lines = reference.read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(InputError, match="missing"):
        merge_shards([tmp_path / "a.jsonl"], examples, tmp_path / "m.jsonl")
    (tmp_path / "b.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(InputError, match="duplicate") as err:
        merge_shards([reference, tmp_path / "b.jsonl"], examples, tmp_path / "m.jsonl")
    assert "b.jsonl" in str(err.value) and "query_id" in str(err.value)
    assert not (tmp_path / "m.jsonl").exists()


def _bad_questions(setup, tmp_path: Path, kind: str) -> Path:
    records = [json.loads(line) for line in setup["questions"].read_text().splitlines()[:2]]
    if kind == "duplicate":
        records.append(dict(records[0]))
    elif kind == "no_answers":
        records[1]["answers"] = []
    elif kind == "unknown_doc":
        records[1]["supporting_ids"] = ["no-such-passage"]
    path = tmp_path / f"{kind}.jsonl"
    write_jsonl(path, records)
    return path


@pytest.mark.parametrize(
    ("kind", "field"), [("duplicate", "id"), ("no_answers", "answers"), ("unknown_doc", "doc_ids")]
)
def test_bad_questions_fail_before_any_work(setup, tmp_path, kind, field):
    questions = _bad_questions(setup, tmp_path, kind)
    args = [*setup["args"], "--questions", str(questions), "--out_dir", str(tmp_path / "out")]
    with pytest.raises(InputError) as err:
        main(args)
    message = str(err.value)
    assert str(questions) in message and repr(field) in message
    assert not (tmp_path / "out").exists()


def test_skip_invalid_counts_and_skips(setup, tmp_path, capsys):
    corpus = Corpus.load(setup["toy_dir"] / "corpus.jsonl")
    good = load_examples(setup["questions"])[:3]
    bad = [
        Example(good[0].id, "again?", ("x",)),
        Example("q-no-doc", "what?", ("y",), supporting_ids=("no-such-passage",)),
    ]
    valid, skipped = validate_questions([*good, *bad], corpus, "q.jsonl", skip_invalid=True)
    assert [e.id for e in valid] == [e.id for e in good]
    assert skipped == {"id": 1, "doc_ids": 1}
    questions = _bad_questions(setup, tmp_path, "no_answers")
    out = tmp_path / "out"
    flags = [
        "--questions",
        str(questions),
        "--out_dir",
        str(out),
        "--skip_invalid",
        "true",
        "--num_chains",
        "1",
    ]
    assert main([*setup["args"], *flags, "--max_length", "1"]) == 0
    assert _lines(shard_path(out, 0, 1)) == 1
    assert '"answers": 1' in capsys.readouterr().out


def test_kilt_page_ids_are_not_checked_as_corpus_passages(shared_data, setup):
    """KILT provenance names Wikipedia pages, not rows of the corpus: validation checks passage ids
    only (a page id like 10520 would be a row of a large corpus, and unrelated to the page)."""
    from corag.sampling import referenced_ids

    corpus = Corpus.load(setup["toy_dir"] / "corpus.jsonl")  # about 100 passages: no row 10520
    kilt = load_examples(shared_data / "kilt" / "hotpotqa-dev-kilt.sample.jsonl")[:20]
    assert all(referenced_ids(e) == [] and e.supporting_pages for e in kilt)
    valid, skipped = validate_questions(kilt, corpus, "hotpotqa-dev-kilt.jsonl", skip_invalid=True)
    assert len(valid) == 20 and not skipped


def test_resume_survives_moved_model_questions_index_and_a_service_url(setup, reference, tmp_path, capsys):
    """The run hash names what changes the chains, not where things live."""
    import shutil

    from corag.retrieval import index_fingerprint
    from corag.retrieval.service import BackgroundServer, create_app

    moved = tmp_path / "moved"
    shutil.copytree(setup["model"], moved / "model")
    shutil.copytree(setup["root"] / "bm25", moved / "bm25")
    shutil.copy(setup["questions"], moved / "questions.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(reference, shard_path(out, 0, 1))
    index = BM25Retriever.load(moved / "bm25")
    app = create_app(index, fingerprint=index_fingerprint(moved / "bm25"))
    args = [
        "--model", str(moved / "model"), "--questions", str(moved / "questions.jsonl"),
        "--corpus", str(setup["toy_dir"] / "corpus.jsonl"), *FLAGS, "--keep_candidates", "true",
        "--out_dir", str(out),
    ]  # fmt: skip
    with BackgroundServer(app) as server:
        capsys.readouterr()
        assert main([*args, "--retriever", server.url]) == 0
    summary = json.loads(capsys.readouterr().out.split("\nchains written")[0])
    assert summary["sampled_now"] == 0 and summary["resumed_from"] == NUM_QUESTIONS
    assert shard_path(out, 0, 1).read_bytes() == reference.read_bytes()

    # other questions (one answer changed) are another run
    lines = (moved / "questions.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["answers"] = ["something else"]
    (moved / "questions.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    with pytest.raises(InputError, match="another config"):
        main([*args, "--retriever", str(moved / "bm25")])


def test_identical_calls_computed_once_give_the_same_records(setup, tmp_path):
    corpus = Corpus.load(setup["toy_dir"] / "corpus.jsonl")
    examples = load_examples(setup["questions"])[:6]
    lm = load_lm(setup["model"], batch_size=32)
    retriever = BM25Retriever.load(setup["root"] / "bm25")
    # near-greedy sub-queries: chains ask the same questions, so sub-answers and scorings repeat
    config = SamplingConfig(num_chains=4, max_length=3, temperature=0.05, keep_candidates=True)
    runs = {}
    for dedup in (False, True):
        path = tmp_path / f"chains-{dedup}.jsonl"
        summary = run_sampling(
            examples, corpus, lm, retriever, config, path, block_size=3, progress=False, dedup=dedup
        )
        runs[dedup] = (path.read_bytes(), summary["dedup_saved_share"])
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > 0 and runs[False][1] == 0


def _split_floats(value, floats: list[float]):
    """A record with each float replaced by None and appended to `floats`."""
    if isinstance(value, float):
        floats.append(value)
        return None
    if isinstance(value, dict):
        return {k: _split_floats(v, floats) for k, v in value.items()}
    if isinstance(value, list):
        return [_split_floats(v, floats) for v in value]
    return value


def test_async_executor_streams_the_same_records_in_question_order_and_resumes(setup, reference, tmp_path):
    out = tmp_path / "async"
    run = [*setup["args"], "--out_dir", str(out), "--keep_candidates", "true", "--executor", "async"]
    # Stopped after five questions (in the middle of a block), then resumed: no block barrier, and the
    # records are those of the stepped run (texts exact, scores to rounding), in question order.
    assert main([*run, "--limit", "5"]) == 0
    assert _lines(shard_path(out, 0, 1)) == 5
    assert main(run) == 0
    records, scores = {}, {}
    for name, path in (("ours", shard_path(out, 0, 1)), ("stepped", reference)):
        scores[name] = []
        records[name] = [
            _split_floats(json.loads(line), scores[name]) for line in path.read_text().splitlines()
        ]
    assert records["ours"] == records["stepped"]  # batches of another composition round scores differently
    assert scores["ours"] == pytest.approx(scores["stepped"], abs=1e-4)
    with pytest.raises(InputError, match="executor"):
        main([*run, "--executor", "waves"])
