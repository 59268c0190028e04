"""Bad input across the commands (evaluate's own kinds are in test_cli.py, the HTTP service's bodies in
retrieval/test_service.py): each kind is one line on stderr naming what is wrong, exit status 2, no
traceback, and nothing half-written where the command would have written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corag.cli import main

HOTPOT = "hotpotqa/hotpot_dev_distractor_sample.json"
MUSIQUE = "musique/musique_ans_v1.0_dev_sample.jsonl"
KILT = "kilt/hotpotqa-dev-kilt.sample.jsonl"


def put(path: Path, data: bytes | str) -> str:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


QUESTION = {"id": "a", "query": "who?", "answers": ["x"], "task": "hotpotqa"}
CHAIN = {"query_id": "a", "query": "who?", "answers": ["x"], "subqueries": ["s"], "subanswers": ["t"],
         "doc_ids": [["0"]], "score": -1.0}  # fmt: skip


class Files:
    """Inputs for the cases, written into the test's folder on first use."""

    def __init__(self, tmp: Path, data: Path, tokenizer: Path) -> None:
        self.tmp, self.data, self.tokenizer = tmp, data, str(tokenizer)

    def corpus(self, rows: list[tuple[str, str]] | None = None) -> str:
        rows = rows if rows is not None else [("T", f"text {i}") for i in range(5)]
        return put(self.tmp / "corpus.jsonl", jsonl(*({"id": str(i), "title": t, "contents": c}
                                                      for i, (t, c) in enumerate(rows))))  # fmt: skip

    def questions(self, **change) -> str:
        return put(self.tmp / "q.jsonl", jsonl({**QUESTION, **change}))

    def musique_null_paragraphs(self) -> str:
        record = json.loads((self.data / MUSIQUE).read_text().splitlines()[0])
        return put(self.tmp / "musique.jsonl", jsonl({**record, "paragraphs": None}))

    def chains(self, **change) -> str:
        return put(self.tmp / "chains.jsonl", jsonl({**CHAIN, **change}))

    def other_index(self) -> str:
        """A BM25 index over another corpus than `corpus()`, in a folder of its own."""
        from corag.data.corpus import Corpus
        from corag.retrieval.bm25 import build_bm25_folder

        (self.tmp / "other").mkdir()
        other = Corpus.load(
            put(self.tmp / "other" / "c.jsonl", jsonl({"id": "x", "title": "X", "contents": "y"}))
        )
        return str(
            build_bm25_folder([[other.passage(0)]], self.tmp / "other" / "index", corpus=other.fingerprint())
        )


OUT = "{out}"  # where a command would write: checked to hold nothing afterwards

# (name, argv of files f, the one line's part, what else it must name)
CASES = [
    ("parquet that is not parquet (corpus)", lambda f: ["corpus", "prepare", put(f.tmp / "c.parquet", b"id,text\n"), "--out", OUT],
     "not a parquet file", "c.parquet"),
    ("corpus of an unknown kind", lambda f: ["corpus", "prepare", put(f.tmp / "c.txt", "x"), "--out", OUT],
     "unknown corpus suffix", "c.txt"),
    ("questions without paragraphs (from-contexts)", lambda f: ["corpus", "from-contexts", f.questions(), "--out", OUT],
     "no context paragraphs in the questions", "q.jsonl"),
    ("null MuSiQue paragraphs", lambda f: ["corpus", "from-contexts", f.musique_null_paragraphs(), "--out", OUT],
     "field 'paragraphs': null", "musique.jsonl, line 1"),
    ("a corpus of empty passages only", lambda f: ["index", f.corpus([("", "")] * 4), "--out", OUT, "--kind", "bm25"],
     "all 4 passages are empty", "corpus.jsonl"),
    ("an index built over another corpus", lambda f: ["predict", "--data", f.questions(), "--model", "m", "--corpus",
     f.corpus(), "--retriever", f.other_index(), "--out", OUT], "the index was built over another corpus", "field 'corpus'"),
    ("chunk size 0", lambda f: ["index", f.corpus(), "--out", OUT, "--chunk_size", "0"],
     "must be 1 or more, got 0", "field '--chunk_size'"),
    ("an encoder that is only on the hub (offline)", lambda f: ["index", f.corpus(), "--out", OUT, "--model", "e5-large-v2"],
     "not in the Hugging Face cache, and HF_HUB_OFFLINE is set", "intfloat/e5-large-v2, field '--model'"),
    ("a model name the hub cannot give (offline)", lambda f: ["predict", "--data", f.questions(), "--model", "nope/model",
     "--corpus", f.corpus(), "--retriever", "r", "--out", OUT], "HF_HUB_OFFLINE is set", "nope/model, field '--model'"),
    ("parquet that is not parquet (questions)", lambda f: ["predict", "--data", put(f.tmp / "q.parquet", b"{}"), "--model", "m",
     "--corpus", f.corpus(), "--retriever", "r", "--out", OUT], "not a parquet file", "q.parquet"),
    ("an empty question", lambda f: ["predict", "--data", f.questions(query="  "), "--model", "m", "--corpus", f.corpus(),
     "--retriever", "r", "--out", OUT], "empty question", "id 'a', field 'query'"),
    ("a limit of 0", lambda f: ["predict", "--data", f.questions(), "--model", "m", "--corpus", f.corpus(),
     "--retriever", "r", "--out", OUT, "--limit", "0"], "must be 1 or more", "--limit"),
    ("a budget of 0", lambda f: ["predict", "--data", f.questions(), "--model", "m", "--corpus", f.corpus(),
     "--retriever", "r", "--out", OUT, "--budget", "0"], "must be a positive number of tokens", "--budget"),
    ("a resume file of other data", lambda f: ["predict", "--data", f.questions(), "--model", "m", "--corpus", f.corpus(),
     "--retriever", "r", "--out", put(f.tmp / "p.jsonl", jsonl({"query_id": "zz", "prediction": "x"}))],
     "holds predictions for 1 question(s) that", "p.jsonl, id 'zz', field 'query_id'"),
    ("a resume file that is not UTF-8", lambda f: ["predict", "--data", f.questions(), "--model", "m", "--corpus", f.corpus(),
     "--retriever", "r", "--out", put(f.tmp / "p.jsonl", b'{"query_id": "a"}\n{"query_id": "\xe9"}\n')],
     "not UTF-8 text (byte 0xe9", "p.jsonl, line 2"),
    ("a shard beyond the shards", lambda f: ["sample", "--model", "m", "--questions", f.questions(), "--corpus", f.corpus(),
     "--retriever", "r", "--out_dir", OUT, "--shard", "2", "--num_shards", "2"], "need 0 <= --shard < --num-shards", "field '--shard'"),
    ("sampling without a model", lambda f: ["sample", "--questions", f.questions(), "--corpus", f.corpus(),
     "--retriever", "r", "--out_dir", OUT], "required to sample", "field '--model'"),
    ("a sampling question without text", lambda f: ["sample", "--model", "m", "--questions", f.questions(query=""),
     "--corpus", f.corpus(), "--retriever", "r", "--out_dir", OUT], "empty question", "field 'query'"),
    ("a chain score that is not a number", lambda f: ["build-examples", "--chains", f.chains(score="bad"), "--corpus",
     f.corpus(), "--tokenizer", f.tokenizer, "--dataset", OUT], "expected a number, got str", "id 'a', field 'score'"),
    ("prefix scores that are not numbers", lambda f: ["build-examples", "--chains", f.chains(prefix_scores=[0, None]),
     "--corpus", f.corpus(), "--tokenizer", f.tokenizer, "--dataset", OUT], "expected a number, got NoneType", "field 'prefix_scores'"),
    ("a chains file that is not UTF-8", lambda f: ["build-examples", "--chains", put(f.tmp / "c.jsonl", b'{"query_id": "\xff"}\n'),
     "--corpus", f.corpus(), "--tokenizer", f.tokenizer, "--dataset", OUT], "not UTF-8 text (byte 0xff", "c.jsonl, line 1"),
    ("a tokenizer only on the hub (offline)", lambda f: ["build-examples", "--chains", f.chains(), "--corpus", f.corpus(),
     "--tokenizer", "org/tok", "--dataset", OUT], "HF_HUB_OFFLINE is set", "field '--tokenizer'"),
    ("a shard that is not UTF-8 (merge)", lambda f: ["merge", put(f.tmp / "chains-0.jsonl", b'{"query_id": "a\xfe"}\n'),
     "--questions", f.questions(), "--out", OUT], "not UTF-8 text (byte 0xfe", "chains-0.jsonl, line 1"),
    ("a gold record without an id (kilt-score)", lambda f: ["kilt-score", put(f.tmp / "s.jsonl", "{}\n"), put(f.tmp / "g.jsonl", "{}\n")],
     "missing or invalid id", "g.jsonl, line 1, field 'id'"),
    ("a knowledge source that is not one", lambda f: ["kilt-pages", put(f.tmp / "ks.json", "not json\n"), "--out", OUT],
     "not a knowledge-source page", "ks.json, line 1"),
    ("a toy world too small", lambda f: ["toyworld", "--out", OUT, "--num_entities", "-1"],
     "num_entities must be at least 30, got -1", "field '--num_entities'"),
    ("no worlds to draw from", lambda f: ["warmstart", "--out", OUT, "--worlds", "0"],
     "must be 1 or more, got 0", "field '--worlds'"),
    ("one distractor bound", lambda f: ["demos", "--toy", str(f.tmp), "--distractors", "1", "--out", OUT],
     "expected two numbers, MIN MAX", "field '--distractors'"),
    ("demonstrations from nothing", lambda f: ["demos", "--out", OUT], "give one of --musique and --toy", "field '--musique'"),
    ("a release folder without the release", lambda f: ["prepare-data", str(f.tmp), "--out", OUT],
     "point at the folder that `hf download", "{tmp}"),
    ("a results folder without results", lambda f: ["results", str(f.tmp)], "no <dataset>/<run>/metrics.json", ""),
    ("a plan of a config that is not there", lambda f: ["plan", str(f.tmp / "nope.yaml")], "cannot read YAML", "nope.yaml"),
    ("a service over a folder that is no index", lambda f: ["serve-retriever", str(f.tmp)], "not an index folder", ""),
    ("a config that is not YAML", lambda f: ["predict", "--config", put(f.tmp / "c.yaml", "a: [1,"), "--out", OUT],
     "cannot read YAML", "c.yaml"),
    ("a config key no option has", lambda f: ["predict", "--config", put(f.tmp / "c.yaml", "nosuch: 1\n"), "--out", OUT],
     "unknown config key", "field 'nosuch'"),
    ("an evaluation folder that is a file", lambda f: ["evaluate", "--data", str(f.data / KILT), "--predictions", f.questions(),
     "--out-dir", put(f.tmp / "o.txt", "mine")], "--out-dir names a folder, and this is not one", "o.txt"),
    ("an evaluation folder under a file", lambda f: ["evaluate", "--data", str(f.data / KILT), "--predictions",
     f.questions(), "--out-dir", put(f.tmp / "o.txt", "mine") + "/run"], "is a file, so --out-dir cannot be made under it",
     "o.txt"),
    ("a corpus under a file (from-contexts)", lambda f: ["corpus", "from-contexts", str(f.data / HOTPOT), "--out",
     put(f.tmp / "o.txt", "mine") + "/corpus.jsonl"], "is a file, so --out cannot be made under it", "o.txt"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "build", "message", "names"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_of_bad_input_is_one_line(
    name, build, message, names, tmp_path, shared_data, tiny_model_dir, capsys, monkeypatch
):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    inputs = tmp_path / "in"
    inputs.mkdir()
    out = tmp_path / "out"
    argv = [out.as_posix() if a == OUT else a for a in build(Files(inputs, shared_data, tiny_model_dir))]
    before = sorted(p.relative_to(inputs) for p in inputs.rglob("*"))
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(f"corag {argv[0]}") and err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err and names.format(tmp=inputs) in err, err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] in ([], ["out.lock"]), (
        "half-written"
    )
    # nothing beside the inputs either (a corpus store prepared before the refusal is removed)
    assert sorted(p.relative_to(inputs) for p in inputs.rglob("*")) == before


def test_there_are_at_least_thirty_kinds_here():
    """With evaluate's kinds (test_cli.py) and the service's bodies (retrieval/test_service.py): 60 or more."""
    assert len({c[0] for c in CASES}) >= 30
