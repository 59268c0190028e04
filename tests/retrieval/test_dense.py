"""Dense retrieval with the real MiniLM model: exact search streamed from chunks on CPU, torch shards,
rows read from `.npy` files by byte offset, saved folders loaded without reading their vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from corag.errors import InputError
from corag.retrieval import load_retriever
from corag.retrieval.dense import (
    DenseRetriever,
    Encoder,
    ExactIndex,
    NpyRows,
    TorchIndex,
    load_dense,
    resolve_model,
)
from corag.retrieval.index import build_dense


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder.from_preset("minilm", device="cpu")


@pytest.fixture(scope="module")
def toy_dense(encoder, toy_world) -> DenseRetriever:
    return DenseRetriever.from_passages(toy_world.passages, encoder)


def recall_at(retriever, questions, k: int) -> float:
    hits = retriever.search([q.query for q in questions], k)
    found = [q.supporting_ids[0] in {h.doc_id for h in hs} for q, hs in zip(questions, hits, strict=True)]
    return sum(found) / len(found)


def test_toy_world_single_hop_recall_at_5(toy_dense, toy_world):
    assert len(toy_world.single_hop) >= 50
    assert recall_at(toy_dense, toy_world.single_hop, 5) >= 0.9


def test_hits_are_sorted_normalised_scores_and_batching_does_not_change_them(toy_dense, toy_world):
    queries = [q.query for q in toy_world.test[:6]]
    batched = toy_dense.search(queries, 4)
    for q, row in zip(queries, batched, strict=True):
        single = toy_dense.search([q], 4)[0]
        assert [h.doc_id for h in single] == [h.doc_id for h in row]
        assert [h.score for h in single] == pytest.approx([h.score for h in row], abs=1e-5)
        scores = [h.score for h in row]
        assert scores == sorted(scores, reverse=True) and all(-1.0001 <= s <= 1.0001 for s in scores)
    n = len(toy_world.passages)
    assert len(toy_dense.search(["anything"], n + 10)[0]) == n
    assert toy_dense.search([], 3) == [] and toy_dense.search(["x"], 0) == [[]]


def test_prefixes_and_query_truncation(encoder):
    encoder.query_prefix, encoder.passage_prefix = "query: ", "passage: "
    try:
        with_prefix = encoder.encode_queries(["who founded the company"])
    finally:
        encoder.query_prefix, encoder.passage_prefix = "", ""
    assert np.allclose(with_prefix, encoder.encode_queries(["query: who founded the company"]), atol=1e-6)
    assert not np.allclose(with_prefix, encoder.encode_queries(["who founded the company"]), atol=1e-3)
    assert np.allclose(np.linalg.norm(with_prefix, axis=1), 1.0, atol=1e-5)

    long = "the river that flows through the old city " * 10
    full_length = encoder.model.max_seq_length
    full = encoder.encode_queries([long])
    encoder.query_max_length = 6
    try:
        cut = encoder.encode_queries([long])
    finally:
        encoder.query_max_length = None
    assert not np.allclose(cut, full, atol=1e-3)
    assert encoder.model.max_seq_length == full_length  # restored after a truncated encode
    assert np.allclose(encoder.encode_queries([long]), full, atol=1e-6)


def test_exact_search_over_chunks_files_and_shards_equals_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(1000, 40, replace=False)] + 0.1 * rng.standard_normal((40, 32)).astype(np.float32)
    brute = np.argsort(-(q @ x.T), axis=1)[:, :10]
    brute_scores = np.take_along_axis(q @ x.T, brute, axis=1)

    s32, i32 = ExactIndex([x[:333], x[333:700], x[700:]], block_rows=64).search(q, 10)
    assert (i32 == brute).all() and np.allclose(s32, brute_scores, atol=1e-5)
    # fp16 chunk files read by rows: the same top-1, scores to fp16 precision
    files = []
    for n, part in enumerate(np.split(x, [500, 501])):
        np.save(tmp_path / f"{n}.npy", part.astype(np.float16))
        files.append(NpyRows(tmp_path / f"{n}.npy"))
    assert [len(f) for f in files] == [500, 1, 499] and files[0].dtype == np.float16
    s16, i16 = ExactIndex(files, block_rows=100).search(q, 10)
    assert (i16[:, 0] == i32[:, 0]).all() and np.allclose(s16, s32, atol=1e-2)
    assert np.array_equal(files[2][7:9], x[508:510].astype(np.float16))
    assert np.array_equal(files[0][np.array([4, 2, 4])], x[[4, 2, 4]].astype(np.float16))
    rows = np.array([999, 0, 500, 501, 0])
    assert np.allclose(ExactIndex(files).vectors(rows), x[rows], atol=1e-3)

    # three uneven torch shards, fed from chunks that straddle shard borders, searched in blocks
    import torch

    for dtype in (torch.float32, torch.float16):
        shards = TorchIndex.from_chunks(
            files, 1000, 32, ["cpu"] * 3, dtype=dtype, block_rows=64, read_rows=77
        )
        st, it = shards.search(q, 10)
        assert (it[:, 0] == i32[:, 0]).all() and np.allclose(st, s32, atol=1e-2)
    st, it = TorchIndex.from_chunks([x], 1000, 32, ["cpu"] * 2).search(q[:2], 1005)
    assert (it[:, 1000:] == -1).all() and set(it[0, :1000]) == set(range(1000))
    _, ie = ExactIndex([x]).search(q[:2], 1005)
    assert (ie[:, 1000:] == -1).all() and set(ie[0, :1000]) == set(range(1000))


def test_saved_index_loads_streamed_on_cpu_and_on_shards(encoder, toy_world, tmp_path):
    from corag.data.corpus import Corpus, write_corpus_jsonl

    write_corpus_jsonl(tmp_path / "corpus.jsonl", toy_world.passages)
    corpus = Corpus.load(tmp_path / "corpus.jsonl")
    build_dense(corpus, tmp_path / "idx", encoder, chunk_size=16, dtype="float32")
    direct = DenseRetriever.from_passages(toy_world.passages, encoder)
    queries = [q.query for q in toy_world.test[:8]]
    expected = direct.search(queries, 5)

    loaded = load_retriever(tmp_path / "idx", device="cpu", shard_devices=[])
    assert isinstance(loaded.index, ExactIndex) and all(isinstance(c, NpyRows) for c in loaded.index.chunks)
    got = loaded.search(queries, 5)
    # chunked encoding batches passages differently, so scores agree to float precision only
    assert [[h.doc_id for h in row] for row in got] == [[h.doc_id for h in row] for row in expected]
    assert [h.score for row in got for h in row] == pytest.approx(
        [h.score for row in expected for h in row], abs=1e-5
    )
    # fp16 shards on two "devices" (CPU here; GPUs where present) keep the ranking
    sharded = load_dense(tmp_path / "idx", shard_devices=["cpu", "cpu"], encoder=encoder)
    assert isinstance(sharded.index, TorchIndex) and len(sharded.index.shards) == 2
    got = sharded.search(queries, 5)
    assert [[h.doc_id for h in row][:1] for row in got] == [[h.doc_id for h in row][:1] for row in expected]


def test_load_refuses_an_encoder_the_index_was_not_built_with(encoder, toy_world, tmp_path):
    from corag.data.corpus import Corpus, write_corpus_jsonl

    write_corpus_jsonl(tmp_path / "corpus.jsonl", toy_world.passages[:5])
    build_dense(Corpus.load(tmp_path / "corpus.jsonl"), tmp_path / "idx", encoder)
    assert len(load_dense(tmp_path / "idx", encoder=encoder, shard_devices=[]).search(["x"], 10)[0]) == 5
    encoder.query_prefix = "query: "
    try:
        with pytest.raises(InputError, match="query prefix") as err:
            load_dense(tmp_path / "idx", encoder=encoder)
    finally:
        encoder.query_prefix = ""
    assert err.value.field == "model"


def test_load_refuses_missing_or_unfinished_index(tmp_path):
    with pytest.raises(InputError, match="manifest.json"):
        load_dense(tmp_path)
    (tmp_path / "manifest.json").write_text('{"kind": "dense", "complete": false}')
    with pytest.raises(InputError, match="did not finish"):
        load_dense(tmp_path)


def test_model_presets_carry_their_prefixes():
    assert resolve_model("e5-large-v2") == ("intfloat/e5-large-v2", "query: ", "passage: ", 64)
    assert resolve_model("/models/intfloat/e5-base-v2")[1:] == ("query: ", "passage: ", 64)
    assert resolve_model("/models/all-mpnet-base-v2") == ("/models/all-mpnet-base-v2", "", "", None)
    path, qp, pp, qmax = resolve_model("minilm")
    assert (qp, pp, qmax) == ("", "", None) and (Path(path) / "config.json").is_file()


def test_torch_shards_are_searched_in_parallel_threads():
    import threading
    import time

    import torch

    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 16)).astype(np.float32)
    q = rng.standard_normal((5, 16)).astype(np.float32)
    index = TorchIndex.from_chunks([x], 400, 16, ["cpu"] * 4, dtype=torch.float32, block_rows=50)
    threads: set[int] = set()
    inner = index._search_shard

    def recording(*args):
        threads.add(threading.get_ident())
        time.sleep(0.05)  # every shard is handed out before the first one finishes
        return inner(*args)

    index._search_shard = recording
    scores, ids = index.search(q, 7)
    want_s, want_i = ExactIndex([x]).search(q, 7)
    assert (ids == want_i).all() and np.allclose(scores, want_s, atol=1e-4)
    assert len(threads) > 1 and threading.get_ident() not in threads


def test_e5_base_index_embeds_with_its_prefixes(tmp_path, monkeypatch):
    """`corag index --model e5-base-v2` loads intfloat/e5-base-v2 and embeds `passage: title\\ntext`; the
    index it writes searches with `query: ` queries cut to 64 tokens. The hub is out of reach here, so a
    spy stands in for the model: the real MiniLM, recording what it was asked to load and to embed."""
    import sentence_transformers

    import corag.commands.index as index_command
    from corag.cli import main
    from corag.data.corpus import write_corpus_jsonl
    from corag.types import Passage

    minilm, real = resolve_model("minilm")[0], sentence_transformers.SentenceTransformer
    loaded, embedded = [], []

    class Spy(real):
        def __init__(self, name: str, device: str | None = None) -> None:
            loaded.append(name)
            super().__init__(minilm, device="cpu")

        def encode(self, texts, **kwargs):
            embedded.append((list(texts), self.max_seq_length))
            return super().encode(texts, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", Spy)
    monkeypatch.setattr(index_command, "check_model_source", lambda name, field: None)
    passages = [Passage("a", "Rira", "Rira is a city in Kuto."), Passage("b", "", "Kuto is a country.")]
    write_corpus_jsonl(tmp_path / "corpus.jsonl", passages)
    args = ["index", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "e5"), "--model", "e5-base-v2"]
    assert main(args) == 0
    assert loaded == ["intfloat/e5-base-v2"]
    assert embedded == [(["passage: Rira\nRira is a city in Kuto.", "passage: Kuto is a country."], 256)]
    embedded.clear()
    hits = load_retriever(tmp_path / "e5").search(["where is Rira?"], 1)[0]
    assert loaded == ["intfloat/e5-base-v2"] * 2 and embedded == [(["query: where is Rira?"], 64)]
    assert [h.doc_id for h in hits] == ["a"]


class CountedRows(np.ndarray):
    """An fp32 array that counts the row ranges a search reads from it."""

    reads = 0

    def __getitem__(self, key):
        if isinstance(key, slice):
            CountedRows.reads += 1
        return np.asarray(self).__getitem__(key)


def test_rows_in_memory_are_searched_as_torch_does_and_stored_rows_in_blocks(tmp_path):
    """fp32 rows in memory need no copy: one matmul + top-k over a whole chunk, torch's own path (blocks
    of 32768 rows cost 0.89x of it on the CI machine kind, benchmarks/retrieval.py); rows converted from
    fp16 files are read `block_rows` at a time, so memory stays bounded."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100_000, 8)).astype(np.float32)
    q = rng.standard_normal((64, 8)).astype(np.float32)
    counted = x.view(CountedRows)
    scores, ids = ExactIndex([counted]).search(q, 10)
    assert CountedRows.reads == 1
    import torch

    want_s, want_i = (torch.from_numpy(q) @ torch.from_numpy(x).T).topk(10, dim=1)
    assert np.array_equal(ids, want_i.numpy()) and np.array_equal(scores, want_s.numpy())
    np.save(tmp_path / "rows.npy", x.astype(np.float16))
    blocks = []
    rows = NpyRows(tmp_path / "rows.npy")
    original = NpyRows.__getitem__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NpyRows, "__getitem__", lambda self, key: blocks.append(key) or original(self, key))
        _, ids16 = ExactIndex([rows]).search(q, 10)
    assert len(blocks) == 4 and (ids16 >= 0).all()  # 100,000 rows in blocks of 32768
