"""`corag index`: chunked, atomic, resumable dense builds; killed mid-way and resumed gives the same index."""

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
from corag.retrieval import load_retriever
from corag.retrieval.dense import Encoder
from corag.retrieval.index import CHUNK_DIR, build_dense
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
    from corag.data.toyworld import generate_world

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
    cmd += ["--chunk-size", str(chunk_size), "--device", "cpu"]
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
    assert not (out / "index.faiss").exists()
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    with pytest.raises(InputError, match="did not finish"):
        load_retriever(out)
    before = {p.name: p.stat().st_mtime_ns for p in written}

    # the re-run (in-process here, with the same model) picks up where the killed one stopped
    build_dense(corpus, out, encoder, chunk_size=chunk_size)
    assert f"reused {len(written)} finished chunk(s) of {n_chunks}" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in written} == before  # finished chunks were not redone

    reference = build_dense(corpus, tmp_path / "uninterrupted", encoder, chunk_size=chunk_size)
    got, want = folder_state(out), folder_state(reference)
    assert sorted(got) == sorted(want)
    assert len([n for n in got if n.startswith(CHUNK_DIR)]) == n_chunks
    for name in want:
        if name.endswith(".npy"):
            assert np.array_equal(np.load(out / name), np.load(reference / name)), name
        else:
            assert got[name] == want[name], name


def test_manifest_ids_and_fp16_chunks(encoder, tmp_path):
    passages = [
        Passage(f"doc-{i}", f"Title {i}", f"Passage number {i} about topic {i % 4}.") for i in range(10)
    ]
    write_corpus_jsonl(tmp_path / "c.jsonl", passages)
    out = build_dense(
        Corpus.load(tmp_path / "c.jsonl"), tmp_path / "idx", encoder, chunk_size=4, dtype="float16"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["num_chunks"] == 3 and manifest["corpus_size"] == 10
    assert manifest["model"] == encoder.name and manifest["dim"] == 384 and manifest["dtype"] == "float16"
    assert len(manifest["corpus_fingerprint"]) == 32 and not manifest["ids_are_rows"]
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


def test_resume_refuses_other_settings_or_a_changed_corpus(encoder, tmp_path):
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
    # --overwrite starts afresh
    build_dense(Corpus.load(tmp_path / "b.jsonl"), out, encoder, chunk_size=4, overwrite=True)
    assert load_retriever(out, device="cpu").search(["edited contents"], 1)[0][0].doc_id == "5"
