"""`corag prepare-data` (corag.data.release): parquet folders laid out as `hf download` writes the released
corag/multihopqa and corag/kilt become the questions files the configs and the README name."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corag.cli import main as corag
from corag.data.formats import load_examples
from corag.data.jsonl import read_jsonl
from corag.data.release import MANIFEST, prepare_release
from corag.errors import InputError

REPO = Path(__file__).resolve().parents[2]
MULTIHOP_SPLITS = {
    "2wikimultihopqa": ("train", "validation"),
    "hotpotqa": ("train", "validation"),
    "musique": ("train", "validation"),
    "bamboogle": ("test",),
}


def release_rows(subset: str, split: str, n: int = 3) -> list[dict]:
    """Records of the released schema (METHODS.md 1.3): no `task` column."""
    return [
        {
            "query": f"{subset} {split} question {i}?",
            "answers": [f"answer {i}", f"alias {i}"],
            "query_id": f"{subset}-{split}-{i}",
            "context_doc_ids": [str(10 * i + k) for k in range(3)],
            "subqueries": [f"sub {i}"],
            "subanswers": [f"subanswer {i}"],
            "predictions": f"answer {i}",
        }
        for i in range(n)
    ]


def write_split(root: Path, subset: str, split: str, rows: list[dict], shards: int = 1) -> None:
    """`root/<subset>/<split>-0000i-of-0000n.parquet`, as `hf download --local-dir root` writes them."""
    (root / subset).mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // shards)
    for i in range(shards):
        table = pa.Table.from_pylist(rows[i * per : (i + 1) * per])
        pq.write_table(table, root / subset / f"{split}-{i:05d}-of-{shards:05d}.parquet")


@pytest.fixture
def multihopqa(tmp_path) -> Path:
    root = tmp_path / "downloads" / "multihopqa"
    for subset, splits in MULTIHOP_SPLITS.items():
        for split in splits:
            write_split(root, subset, split, release_rows(subset, split))
    (root / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    (root / ".cache" / "huggingface").mkdir(parents=True)
    return root


def named_questions_files(dataset: str) -> set[str]:
    """The `data/<dataset>/*.jsonl` questions files the shipped configs, the README and docs/cluster.md
    name."""
    texts = [p.read_text() for p in sorted((REPO / "configs").rglob("*.yaml"))]
    texts += [(REPO / "README.md").read_text(), (REPO / "docs" / "cluster.md").read_text()]
    return {m for t in texts for m in re.findall(rf"data/{dataset}/[\w.-]+\.jsonl", t)}


def test_every_questions_file_the_configs_and_readme_name_is_written(
    multihopqa, tmp_path, monkeypatch, capsys
):
    named = named_questions_files("multihopqa")
    assert {"data/multihopqa/train.jsonl", "data/multihopqa/hotpotqa_validation.jsonl"} <= named
    monkeypatch.chdir(tmp_path)
    assert corag(["prepare-data", str(multihopqa), "--out", "data/multihopqa"]) == 0
    missing = [name for name in named if not (tmp_path / name).is_file()]
    assert not missing
    written = sorted(p.name for p in (tmp_path / "data" / "multihopqa").glob("*.jsonl"))
    assert written == [
        "2wikimultihopqa_validation.jsonl",
        "bamboogle_test.jsonl",
        "hotpotqa_validation.jsonl",
        "musique_validation.jsonl",
        "train.jsonl",
    ]
    assert "5 questions files in data/multihopqa (5 written, 0 up to date" in capsys.readouterr().out


def test_each_record_carries_its_task_and_loads_back_to_the_same_questions(multihopqa, tmp_path):
    out = tmp_path / "out"
    prepare_release(multihopqa, out, progress=False)
    for subset, splits in MULTIHOP_SPLITS.items():
        for split in [s for s in splits if s != "train"]:
            path = out / f"{subset}_{split}.jsonl"
            assert {r["task"] for r in read_jsonl(path)} == {subset}
            published = load_examples(multihopqa / subset / f"{split}-00000-of-00001.parquet", task=subset)
            assert load_examples(path) == published  # no --task needed: the records say it
    # The columns are the published ones, plus `task`.
    (first, *_) = read_jsonl(out / "musique_validation.jsonl")
    assert first == {**release_rows("musique", "validation")[0], "task": "musique"}


def test_the_combined_train_file_has_every_multihop_subset(multihopqa, tmp_path):
    out = tmp_path / "out"
    prepare_release(multihopqa, out, progress=False)
    train = load_examples(out / "train.jsonl")
    expected = [
        e
        for subset in ("2wikimultihopqa", "hotpotqa", "musique")
        for e in load_examples(multihopqa / subset / "train-00000-of-00001.parquet", task=subset)
    ]
    assert train == expected
    assert {e.task for e in train} == {"2wikimultihopqa", "hotpotqa", "musique"}


def test_kilt_tasks_are_read_in_kilts_namespace_and_shards_are_joined(multihopqa, tmp_path):
    root = tmp_path / "kilt-download"
    for task in ("hotpotqa", "nq"):
        write_split(root, task, "validation", release_rows(task, "validation"))
        write_split(root, task, "train", release_rows(task, "train"))
    write_split(root, "eli5", "train", release_rows("eli5", "train", n=5), shards=2)
    test_rows = [{**r, "answers": []} for r in release_rows("nq", "test")]
    write_split(root, "nq", "test", test_rows)
    out = tmp_path / "data" / "kilt"
    done = prepare_release(root, out, dataset="kilt", progress=False)
    assert {d.path.name: d.records for d in done} == {
        "hotpotqa_validation.jsonl": 3,
        "nq_test.jsonl": 3,
        "nq_validation.jsonl": 3,
        "train.jsonl": 11,
    }
    assert {e.task for e in load_examples(out / "hotpotqa_validation.jsonl")} == {"kilt_hotpotqa"}
    assert [e.answers for e in load_examples(out / "nq_test.jsonl")] == [(), (), ()]
    train = load_examples(out / "train.jsonl")
    assert [e.task for e in train].count("eli5") == 5 and {e.task for e in train} == {
        "eli5",
        "kilt_hotpotqa",
        "nq",
    }
    with pytest.raises(
        InputError, match=r"written from corag/kilt, not corag/multihopqa \(and 1 more\)"
    ) as err:
        prepare_release(multihopqa, out, progress=False)  # the other release into the same folder
    assert err.value.file.endswith("hotpotqa_validation.jsonl")
    with pytest.raises(InputError, match="pass --dataset kilt") as err:
        prepare_release(root, tmp_path / "wrong", progress=False)  # corag/kilt read as corag/multihopqa
    assert err.value.field == "--dataset"


def test_a_bad_record_is_one_line_naming_file_and_field_and_nothing_is_written(multihopqa, tmp_path, capsys):
    bad = release_rows("musique", "train")
    bad[1]["subanswers"] = []  # one sub-query without its sub-answer
    write_split(multihopqa, "musique", "train", bad)
    out = tmp_path / "out"
    assert corag(["prepare-data", str(multihopqa), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "musique/train-00000-of-00001.parquet" in err and "'musique-train-1'" in err
    assert "field 'subanswers'" in err
    assert not out.exists() or not list(out.iterdir())


def test_duplicate_ids_across_the_combined_file_are_an_error(multihopqa, tmp_path):
    write_split(multihopqa, "musique", "train", release_rows("hotpotqa", "train"))  # hotpotqa's ids again
    with pytest.raises(InputError, match=r"duplicate id across the files of train.jsonl") as err:
        prepare_release(multihopqa, tmp_path / "out", progress=False)
    assert (err.value.record, err.value.field) == ("hotpotqa-train-0", "query_id")
    assert "musique" in err.value.file


def test_an_incomplete_download_is_refused(tmp_path):
    root = tmp_path / "kilt"
    write_split(root, "eli5", "train", release_rows("eli5", "train", n=4), shards=2)
    (root / "eli5" / "train-00001-of-00002.parquet").unlink()
    with pytest.raises(
        InputError, match=r"split 'train': shards \[1\] of 2 are missing: the download looks incomplete"
    ):
        prepare_release(root, tmp_path / "out", dataset="kilt", progress=False)
    with pytest.raises(InputError, match="point at the folder that `hf download corag/multihopqa"):
        prepare_release(tmp_path / "kilt" / "eli5", tmp_path / "out", progress=False)


def test_rerunning_is_a_no_op_and_a_changed_input_is_rewritten(multihopqa, tmp_path, capsys):
    out = tmp_path / "out"
    prepare_release(multihopqa, out, progress=False)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    done = prepare_release(multihopqa, out, progress=False)
    assert not any(d.written for d in done)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before
    assert corag(["prepare-data", str(multihopqa), "--out", str(out)]) == 0
    assert "(0 written, 5 up to date" in capsys.readouterr().out

    write_split(multihopqa, "bamboogle", "test", release_rows("bamboogle", "test", n=5))  # a new download
    (out / "train.jsonl").unlink()  # and a run cut short before train.jsonl
    done = prepare_release(multihopqa, out, progress=False)
    assert sorted(d.path.name for d in done if d.written) == ["bamboogle_test.jsonl", "train.jsonl"]
    assert len(load_examples(out / "bamboogle_test.jsonl")) == 5


def test_a_file_it_did_not_write_is_never_replaced_unless_asked(multihopqa, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "hotpotqa_validation.jsonl").write_text('{"id": "mine", "query": "q", "answers": ["a"]}\n')
    with pytest.raises(InputError, match="not written by `corag prepare-data`.*--overwrite") as err:
        prepare_release(multihopqa, out, progress=False)
    assert err.value.file.endswith("hotpotqa_validation.jsonl")
    assert not (out / "train.jsonl").exists()  # refused before writing anything
    prepare_release(multihopqa, out, overwrite=True, progress=False)
    assert {e.task for e in load_examples(out / "hotpotqa_validation.jsonl")} == {"hotpotqa"}

    with open(out / "musique_validation.jsonl", "a") as f:  # edited by hand after it was written
        f.write('{"query": "q", "answers": ["a"], "query_id": "extra", "task": "musique"}\n')
    with pytest.raises(InputError, match="or was changed since"):
        prepare_release(multihopqa, out, progress=False)
    assert (out / MANIFEST).is_file()


def test_subsets_choose_folders(multihopqa, tmp_path):
    done = prepare_release(multihopqa, tmp_path / "out", subsets=["hotpotqa"], progress=False)
    assert [d.path.name for d in done] == ["hotpotqa_validation.jsonl", "train.jsonl"]
    assert {e.task for e in load_examples(tmp_path / "out" / "train.jsonl")} == {"hotpotqa"}
    with pytest.raises(InputError, match="no subset folder 'nq'") as err:
        prepare_release(multihopqa, tmp_path / "out", subsets=["nq"], progress=False)
    assert err.value.field == "--subsets"


def test_one_e5_index_path_across_configs_readme_and_launchers():
    """The dense E5 index of the KILT corpus has one name wherever a config, the README, docs/cluster.md or
    a launcher names it."""
    files = [*sorted((REPO / "configs").rglob("*.yaml")), REPO / "README.md", REPO / "docs" / "cluster.md"]
    files += [*sorted((REPO / "sampling").glob("*.sh")), *sorted((REPO / "evaluation").glob("*.py"))]
    names = {
        m
        for path in files
        for m in re.findall(r"[\w./-]*index[\w./-]*", path.read_text())
        # E5-base: Search-R1's index of wiki-18, another corpus, and its released faiss file
        if "e5" in m.lower() and "e5-base" not in m and m != "e5_Flat.index"
    }
    assert names == {"data/index/e5-large-v2"}
