"""`corag build-examples` (corag/training/dataset.py): sampled chains become an Arrow dataset once, resumably."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from datasets import load_dataset, load_from_disk
from transformers import AutoTokenizer

from corag.cli import main as cli
from corag.errors import InputError
from corag.sampling import SampledChain, SamplingConfig, chain_record
from corag.training import dataset, examples


@pytest.fixture(scope="module")
def sampled(toy_world, tmp_path_factory) -> Path:
    """Chains as `corag sample` writes them (its own record writer): documents per step in steps[].doc_ids."""
    path = tmp_path_factory.mktemp("chains") / "chains.jsonl"
    with open(path, "w") as f:
        for i, ex in enumerate(toy_world.train):
            chain = SampledChain(tuple(ex.decomposition), -0.1 * i, len(ex.decomposition), None)
            record = chain_record(ex, chain, list(ex.supporting_ids), SamplingConfig(), "hash")
            f.write(json.dumps(record) + "\n")
    return path


def config(sampled: Path, toy_dir: Path, tiny_model_dir: Path, out: Path, **kw) -> dataset.ExamplesConfig:
    return dataset.ExamplesConfig(
        chains=str(sampled),
        corpus=str(toy_dir / "corpus.jsonl"),
        dataset=str(out),
        tokenizer=str(tiny_model_dir),
        shard_chains=kw.pop("shard_chains", 25),
        **kw,
    )


def rows(folder: Path) -> list[dict]:
    return load_from_disk(str(folder)).to_list()


def test_sampled_chains_become_examples_without_any_retriever(sampled, toy_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "examples"
    assert cli(["build-examples", *_flags(config(sampled, toy_dir, tiny_model_dir, out))]) == 0
    built = rows(out)
    # The same examples as building all chains in memory (the step the recipe used to run), shard by shard.
    from corag.data.corpus import Corpus

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "doc_ids" not in json.loads(sampled.read_text().splitlines()[0])  # only steps[].doc_ids
    expected = examples.build_examples(
        examples.load_chains(sampled),
        Corpus.load(toy_dir / "corpus.jsonl"),
        truncator=examples.TokenizerTruncator(tokenizer),
    )
    assert built == expected
    # Sub-answer prompts read the documents of the step (steps[].doc_ids), in order.
    corpus = Corpus.load(toy_dir / "corpus.jsonl")
    records = {r["query_id"]: r for r in map(json.loads, sampled.read_text().splitlines())}
    subanswers = [e for e in built if e["task"] == "subanswer"]
    assert subanswers
    for e in subanswers:
        (doc_id, *_) = records[e["chain_id"]]["steps"][e["step"]]["doc_ids"]
        assert corpus.get_many([doc_id])[0].contents in e["prompt"][0]["content"]
    manifest = dataset.read_manifest(out)
    assert manifest["chains"] == len(records) == sum(e["task"] == "final" for e in built)
    assert manifest["tasks"] == {t: sum(e["task"] == t for e in built) for t in examples.TASKS}
    assert not (tmp_path / "dataset.partial").exists()


def test_a_step_without_doc_ids_and_no_retriever_names_the_setting(
    sampled, toy_dir, tiny_model_dir, tmp_path, capsys
):
    lines = sampled.read_text().splitlines()
    record = json.loads(lines[3])
    for step in record["steps"]:
        step["doc_ids"] = []
    chains = tmp_path / "chains.jsonl"
    chains.write_text("\n".join([*lines[:3], json.dumps(record)]) + "\n")
    cfg = config(chains, toy_dir, tiny_model_dir, tmp_path / "out", ratio=1.0)
    assert cli(["build-examples", *_flags(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set `index`" in err and "retriever_url" in err
    assert not (tmp_path / "out").exists()
    # the user fixes the chains file: the refused run does not block the rerun
    chains.write_text("\n".join(lines[:4]) + "\n")
    assert cli(["build-examples", *_flags(cfg)]) == 0
    assert dataset.read_manifest(tmp_path / "out")["chains"] == 4


def test_building_twice_or_after_an_interruption_gives_the_same_dataset(
    sampled, toy_dir, tiny_model_dir, tmp_path, monkeypatch
):
    whole = dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "a"))
    first = rows(whole)
    stamp = (whole / dataset.MANIFEST).stat().st_mtime_ns
    assert dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "a")) == whole
    assert (whole / dataset.MANIFEST).stat().st_mtime_ns == stamp and rows(whole) == first
    # The same chains elsewhere, with a new time stamp: the same dataset, found, not rebuilt.
    moved = tmp_path / "moved-chains.jsonl"
    moved.write_bytes(Path(sampled).read_bytes())
    assert dataset.build(config(moved, toy_dir, tiny_model_dir, tmp_path / "a")) == whole
    assert (whole / dataset.MANIFEST).stat().st_mtime_ns == stamp

    # Killed while building the third shard: two shards are kept, no dataset appears.
    real, calls = examples.build_examples, []

    def dies_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dataset, "build_examples", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "b"))
    partial = tmp_path / "b.partial"
    assert not (tmp_path / "b").exists()
    assert sorted(p.name for p in partial.iterdir() if p.is_dir()) == ["shard-00000", "shard-00001"]

    # Resumed (in two processes): only the missing shards are built, and the dataset is the uninterrupted one.
    monkeypatch.setattr(dataset, "build_examples", real)
    resumed = dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "b", num_proc=2))
    assert rows(resumed) == first and len({e["id"] for e in first}) == len(first)
    assert dataset.read_manifest(resumed) == dataset.read_manifest(whole)
    assert not partial.exists()
    with pytest.raises(InputError, match=r"b[/\\]examples\.json: was built with other settings \(ratio\)"):
        dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "b", ratio=0.5))

    # One shard or many: the same rows, also through plain `arrow` data files as `trl sft` reads them.
    single = dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "c", shard_chains=10_000))
    assert len(list(whole.glob("data-*.arrow"))) > 1 == len(list(single.glob("data-*.arrow")))
    assert rows(single) == first
    plain = load_dataset("arrow", data_files=str(whole / "data-*.arrow"), split="train")
    assert sorted(plain.to_list(), key=lambda e: e["id"]) == sorted(first, key=lambda e: e["id"])


def test_tokenized_once_and_cut_to_max_length(sampled, toy_dir, tiny_model_dir, tmp_path, monkeypatch):
    out = dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "ex", shard_chains=1000))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    full = dataset.tokenized(out, tokenizer)
    lengths = sorted(full["length"])
    assert lengths == sorted(len(ids) for ids in full["input_ids"])
    cap = lengths[len(lengths) // 2]
    cut = dataset.tokenized(out, tokenizer, max_length=cap)
    assert len(cut) == sum(n <= cap for n in lengths) < len(full)
    assert max(cut["length"]) <= cap
    # A second call reads the cache: nothing is tokenized again.
    monkeypatch.setattr(dataset, "tokenize_dataset", lambda *a, **k: pytest.fail("tokenized twice"))
    assert dataset.tokenized(out, tokenizer, max_length=cap)["id"] == cut["id"]
    with pytest.raises(InputError, match="no example fits max_length 3"):
        monkeypatch.undo()
        dataset.tokenized(out, tokenizer, max_length=3)


def test_processes_that_do_not_build_wait_for_the_finished_folders(
    sampled, toy_dir, tiny_model_dir, tmp_path, monkeypatch
):
    """Ranks other than the first never build or lock (file locks may not reach across nodes): they wait
    for the finished dataset and tokens, written by the first, and then read the very same folders."""
    monkeypatch.setattr("corag.data.jsonl.WAIT_POLL_S", 0.05)
    cfg = config(sampled, toy_dir, tiny_model_dir, tmp_path / "ex")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    real_lock = dataset.locked
    monkeypatch.setattr(dataset, "locked", lambda *a, **k: pytest.fail("a waiting process took the lock"))
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            lambda: dataset.tokenized(dataset.build(cfg, builder=False), tokenizer, builder=False)
        )
        time.sleep(0.5)
        assert not waiting.done() and not list(tmp_path.glob("ex*"))  # nothing written by the waiting one
        monkeypatch.setattr(dataset, "locked", real_lock)
        built = dataset.build(cfg)
        assert not waiting.done()  # still waiting: for the tokens now
        tokens = dataset.tokenized(built, tokenizer)
        assert waiting.result(timeout=60)["id"] == tokens["id"]
    assert len([p for p in (built / "tokenized").iterdir() if p.is_dir()]) == 1  # one cache, the first's


def _flags(cfg: dataset.ExamplesConfig) -> list[str]:
    from dataclasses import asdict

    return [part for k, v in asdict(cfg).items() if v is not None for part in (f"--{k}", str(v))]


def test_stop_examples_scored_by_the_model_when_records_lack_prefix_scores(
    sampled, toy_dir, tiny_model_dir, tmp_path, caplog
):
    n = len(sampled.read_text().splitlines())
    with pytest.raises(InputError, match=rf"field 'scorer_model': {n} of {n} chains have no prefix_scores"):
        dataset.build(config(sampled, toy_dir, tiny_model_dir, tmp_path / "none", stop_examples=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none.lock"]  # refused before any shard
    cfg = config(sampled, toy_dir, tiny_model_dir, tmp_path / "stop", stop_examples=True)
    cfg.scorer_model = str(tiny_model_dir)
    with caplog.at_level("INFO", logger="corag.training.dataset"):
        built = rows(dataset.build(cfg))
    said = [r.getMessage() for r in caplog.records if "prefix_scores" in r.getMessage()]
    assert said == [  # one line for the file, not one a shard
        f"{n} of {n} chains have no prefix_scores (written before `corag sample` kept them): scoring their "
        f"prefixes with scorer_model {tiny_model_dir} for stop examples"
    ]
    records = [json.loads(line) for line in sampled.read_text().splitlines()]
    stops = [e for e in built if e["task"] == "stop"]
    assert len(stops) == sum(len(r["steps"]) for r in records)
    assert {e["completion"][0]["content"] for e in stops} <= {"Yes", "No"}
    assert sorted((e["chain_id"], e["step"]) for e in stops) == sorted(
        (r["query_id"], i) for r in records for i in range(1, len(r["steps"]) + 1)
    )


def test_stop_examples_come_from_the_recorded_prefix_scores_without_loading_a_model(
    sampled, toy_dir, tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """Records as `corag sample` writes them now: their prefix scores decide each stop target (Yes from
    the best prefix on), and no model is loaded, even with a scorer_model set (as the SFT recipe sets it);
    a file mixing old and new records scores only the old ones, and says how many."""
    from corag.lm.settings import EngineSettings

    lines = sampled.read_text().splitlines()
    best = {}
    with open(tmp_path / "scored.jsonl", "w") as f:
        for i, line in enumerate(lines):
            record = json.loads(line)
            steps = len(record["steps"])
            best[record["query_id"]] = i % (steps + 1)  # every prefix is the best of some chain
            record["prefix_scores"] = [-abs(j - best[record["query_id"]]) - 0.5 for j in range(steps + 1)]
            f.write(json.dumps(record) + "\n")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(EngineSettings, "load", no_model)
    cfg = config(tmp_path / "scored.jsonl", toy_dir, tiny_model_dir, tmp_path / "stop", stop_examples=True)
    cfg.scorer_model = str(tiny_model_dir)
    with caplog.at_level("INFO", logger="corag.training.dataset"):
        built = rows(dataset.build(cfg))
    assert "prefix_scores" not in caplog.text
    stops = [e for e in built if e["task"] == "stop"]
    assert len(stops) == sum(len(json.loads(line)["steps"]) for line in lines)
    for e in stops:
        expected = "Yes" if e["step"] >= best[e["chain_id"]] else "No"
        assert e["completion"][0]["content"] == expected, e["id"]

    new = (tmp_path / "scored.jsonl").read_text().splitlines()
    mixed = tmp_path / "mixed.jsonl"  # new records, then old ones appended by an older run
    mixed.write_text("\n".join(new[:-10] + lines[-10:]) + "\n")
    cfg = config(mixed, toy_dir, tiny_model_dir, tmp_path / "mixed", stop_examples=True)
    with pytest.raises(InputError, match=rf"10 of {len(lines)} chains have no prefix_scores"):
        dataset.build(cfg)
