"""`corag index --from-faiss`: a flat faiss index written by faiss here (as Search-R1's e5_Flat.index
is) becomes the project's exact index, searched to the same top-k ids and scores as faiss itself; what
is not a flat index of the corpus's size is refused in one line, before anything is written."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from corag.commands.index import main as index_main
from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.retrieval.dense import Encoder, L2Index, load_dense, resolve_model
from corag.retrieval.index import CHUNK_DIR, EncoderSettings, import_faiss

N, DIM, K = 10_000, 384, 10  # MiniLM's dimension, so the index loads with the packaged encoder


@pytest.fixture(scope="module")
def encoder():
    """MiniLM with queries cut at 256 tokens, as --from-faiss records by default."""
    return Encoder(resolve_model("minilm")[0], "", "", 256, device="cpu")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("faiss") / "corpus.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "title": f"T{i}", "contents": f"text {i}"}) + "\n" for i in range(N)
        )
    )
    return path


def fp16_exact(x: np.ndarray) -> np.ndarray:
    """Vectors that fp16 holds exactly, so the stored index loses nothing and any difference from faiss
    comes from reading the file, not from rounding."""
    return x.astype(np.float16).astype(np.float32)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return fp16_exact(np.random.default_rng(0).standard_normal((N, DIM)).astype(np.float32))


def write_faiss(path, index, vectors: np.ndarray):
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_imported_index_searches_as_faiss_does(metric, corpus_file, vectors, encoder, tmp_path):
    flat = faiss.IndexFlatIP(DIM) if metric == "ip" else faiss.IndexFlatL2(DIM)
    path = write_faiss(tmp_path / f"e5_{metric}.index", flat, vectors)
    out = tmp_path / "index"
    argv = [str(corpus_file), "--out", str(out), "--from-faiss", str(path), "--model", "minilm"]
    assert index_main([*argv, "--chunk_size", "3000"]) == 0  # 4 chunks, the last of 1,000 rows
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == "faiss" and manifest["metric"] == metric and manifest["dim"] == DIM
    assert manifest["faiss"]["kind"] == type(flat).__name__ and manifest["query_max_length"] == 256
    assert [c["rows"] for c in manifest["chunks"]] == [3000, 3000, 3000, 1000]

    rng = np.random.default_rng(1)
    queries = fp16_exact(rng.standard_normal((64, DIM)).astype(np.float32))
    want_scores, want_rows = flat.search(queries, K)
    retriever = load_dense(out, encoder=encoder, shard_devices=[])  # exact search on the CPU
    assert isinstance(retriever.index, L2Index) == (metric == "l2")
    hits = retriever.search_vectors(queries, K)
    assert [[h.doc_id for h in row] for row in hits] == [[f"p{r}" for r in row] for row in want_rows]
    got = np.array([[h.score for h in row] for row in hits])
    want = want_scores if metric == "ip" else -want_scores  # an L2 score is minus the squared distance
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)

    # the same rows through the torch shards (the GPU path, here on the CPU in fp16): a query next to a
    # stored vector finds it first, its score within fp16 rounding of faiss's
    near = fp16_exact(vectors[:32] + 0.01 * rng.standard_normal((32, DIM)).astype(np.float32))
    near_scores, _ = flat.search(near, 1)
    sharded = load_dense(out, encoder=encoder, shard_devices=["cpu"]).search_vectors(near, 1)
    assert [row[0].doc_id for row in sharded] == [f"p{i}" for i in range(32)]
    signed = near_scores[:, 0] if metric == "ip" else -near_scores[:, 0]
    scale = np.abs(np.einsum("ij,ij->i", near, near)) + 1
    assert np.all(np.abs([row[0].score for row in sharded] - signed) <= 4e-3 * scale)


def test_blocks_and_resume_give_the_same_chunks(corpus_file, vectors, tmp_path, monkeypatch):
    """Read block by block (1,000 rows at a time) or whole chunks at once, the stored rows are the same;
    an import killed after its first chunk resumes with the rest."""
    from corag.retrieval import index as index_module

    path = write_faiss(tmp_path / "l2.index", faiss.IndexFlatL2(DIM), vectors)
    corpus = Corpus.load(corpus_file)
    settings = EncoderSettings("minilm", "", "", 256)
    whole = import_faiss(corpus, tmp_path / "whole", path, settings, chunk_size=4000, block_rows=4000)
    real, written = index_module.atomic_write, []

    def dies_on_the_second_chunk(target, mode="w"):
        if target.parent.name == CHUNK_DIR:
            written.append(target)
            if len(written) == 2:
                raise KeyboardInterrupt
        return real(target, mode)

    monkeypatch.setattr(index_module, "atomic_write", dies_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        import_faiss(corpus, tmp_path / "blocks", path, settings, chunk_size=4000, block_rows=1000)
    monkeypatch.setattr(index_module, "atomic_write", real)
    first = (tmp_path / "blocks" / CHUNK_DIR / "000000-faiss.npy").stat().st_mtime_ns
    blocks = import_faiss(corpus, tmp_path / "blocks", path, settings, chunk_size=4000, block_rows=1000)
    assert (blocks / CHUNK_DIR / "000000-faiss.npy").stat().st_mtime_ns == first  # not redone
    for name in ("000000-faiss.npy", "000001-faiss.npy", "000002-faiss.npy"):
        assert (whole / CHUNK_DIR / name).read_bytes() == (blocks / CHUNK_DIR / name).read_bytes()
    stored = np.load(whole / CHUNK_DIR / "000000-faiss.npy")
    assert stored.shape == (4000, DIM + 2) and np.array_equal(stored[:, :DIM], vectors[:4000])
    norms = stored[:, DIM].astype(np.float64) + stored[:, DIM + 1]
    np.testing.assert_allclose(norms, np.einsum("ij,ij->i", vectors[:4000], vectors[:4000]), rtol=1e-6)


def test_the_manifest_records_the_release_encoder(tmp_path):
    corpus_file = tmp_path / "wiki.jsonl"
    corpus_file.write_text(
        "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i}'}) + "\n" for i in range(20))
    )
    path = write_faiss(tmp_path / "e5_Flat.index", faiss.IndexFlatIP(768), np.ones((20, 768), np.float32))
    index_main(
        [str(corpus_file), "--out", str(tmp_path / "out"), "--from-faiss", str(path), "--model", "e5-base-v2"]
    )
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {
        k: manifest[k] for k in ("model", "query_prefix", "passage_prefix", "query_max_length", "dim")
    } == {
        "model": "intfloat/e5-base-v2",
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
        "query_max_length": 256,
        "dim": 768,
    }


def refusal(corpus_file, path, out) -> str:
    with pytest.raises(InputError) as err:
        index_main([str(corpus_file), "--out", str(out), "--from-faiss", str(path), "--model", "minilm"])
    assert not out.exists()  # nothing written
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def test_what_is_not_a_flat_index_of_the_corpus_is_refused(corpus_file, vectors, tmp_path):
    (tmp_path / "notes.index").write_bytes(b"not a faiss index, just text")
    assert "not a faiss index" in refusal(corpus_file, tmp_path / "notes.index", tmp_path / "a")
    train = vectors[:2000]
    ivf = faiss.index_factory(DIM, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(train)
    assert "a IndexIVFFlat: only a flat index" in refusal(
        corpus_file, write_faiss(tmp_path / "ivf.index", ivf, vectors), tmp_path / "b"
    )
    pq = faiss.index_factory(DIM, "PQ8")
    pq.train(train)
    assert "a IndexPQ: only a flat index" in refusal(
        corpus_file, write_faiss(tmp_path / "pq.index", pq, vectors), tmp_path / "c"
    )
    short = write_faiss(tmp_path / "short.index", faiss.IndexFlatIP(DIM), vectors[:-1])
    assert f"holds {N - 1} vectors, the corpus has {N} passages" in refusal(
        corpus_file, short, tmp_path / "d"
    )
    cut = tmp_path / "cut.index"
    cut.write_bytes((tmp_path / "short.index").read_bytes()[:-4096])  # a download that stopped early
    assert refusal(corpus_file, cut, tmp_path / "e")
