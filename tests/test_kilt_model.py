"""The KILT model's own path (the paper trains a model of its own on the KILT tasks): its sampling,
examples, SFT and evaluation configs follow one another, with the paper's KILT settings where they differ
from multi-hop QA."""

from __future__ import annotations

from pathlib import Path

from corag.config import load_yaml

CONFIGS = Path(__file__).resolve().parents[1] / "corag" / "configs"


def kilt(name: str) -> dict:
    return load_yaml(CONFIGS / name)


def test_kilt_sampling_is_the_multihop_sampling_over_the_kilt_training_questions() -> None:
    sampling, multihop = kilt("sampling/llama3.1-8b-kilt.yaml"), kilt("sampling/llama3.1-8b.yaml")
    assert sampling["questions"] == "data/kilt/train.jsonl"  # every corag/kilt train split (prepare-data)
    assert {key for key in multihop if sampling[key] != multihop[key]} == {
        "questions",
        "out_dir",
        "num_shards",
    }
    assert sampling["out_dir"] != multihop["out_dir"]  # the two runs never share shard files
    assert sampling["num_shards"] % 8 == 0 and sampling["num_shards"] >= 8 * multihop["num_shards"]


def test_each_kilt_stage_reads_what_the_one_before_writes() -> None:
    sampling, examples = kilt("sampling/llama3.1-8b-kilt.yaml"), kilt("examples/llama3.1-8b-kilt.yaml")
    shards = f"{sampling['out_dir']}/chains-*-of-{sampling['num_shards']:05d}.jsonl"
    header = (CONFIGS / "examples/llama3.1-8b-kilt.yaml").read_text()
    assert f"--out {examples['chains']}" in header and shards in header  # its merge command
    sft = kilt("sft/llama3.1-8b-kilt-full.yaml")
    assert sft["dataset"] == examples["dataset"] and examples["tokenizer"] == sft["model_name_or_path"]
    assert (sft["learning_rate"], sft["effective_batch_size"]) == (1e-5, 1024)  # the paper's KILT run
    evaluation = kilt("eval/corag-llama3.1-8b-kilt.yaml")
    assert evaluation["model"] == sft["output_dir"]
    assert evaluation["data"].startswith("data/kilt/") and evaluation["rules"] == "official"


def test_the_cluster_page_fetches_the_knowledge_source_and_runs_every_kilt_config() -> None:
    from corag.kilt import KNOWLEDGE_SOURCE_URL

    page = (CONFIGS.parents[1] / "docs" / "cluster.md").read_text()
    page_ids = kilt("eval/corag-llama3.1-8b-kilt.yaml")["page_ids"]
    assert f"wget -P downloads {KNOWLEDGE_SOURCE_URL}\n" in page
    assert f"corag kilt-pages downloads/kilt_knowledgesource.json --out {page_ids} " in page
    for name in ("sampling/llama3.1-8b-kilt", "examples/llama3.1-8b-kilt", "sft/llama3.1-8b-kilt-full",
                 "eval/corag-llama3.1-8b-kilt"):  # fmt: skip
        assert f"configs/{name}.yaml" in page, name
