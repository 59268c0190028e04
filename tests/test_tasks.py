"""Tasks: names, the descriptions the prompts carry, scoring rules, and what file names say."""

from __future__ import annotations

import pytest

from corag.errors import InputError
from corag.prompts import task_description
from corag.tasks import TASKS, get_task, named_tasks, split_from_path

# The KILT tasks the CoRAG paper reports (hidden test set), with its Table 10 descriptions.
PAPER = {
    "aidayago2": "link the mention surrounded by [START_ENT] and [END_ENT] to the title of the correct "
    "Wikipedia page",
    "wned": "link the mention surrounded by [START_ENT] and [END_ENT] to the title of the correct "
    "Wikipedia page",
    "cweb": "link the mention surrounded by [START_ENT] and [END_ENT] to the title of the correct "
    "Wikipedia page",
    "trex": "given head entity and relation separated by [SEP], find the correct tail entity, return the "
    "title of its Wikipedia page",
    "structured_zeroshot": "given head entity and relation separated by [SEP], find the correct tail entity, "
    "return the title of its Wikipedia page",
    "nq": "answer natural questions from Google search",
    "kilt_hotpotqa": "answer multi-hop questions",
    "triviaqa": "answer trivia questions",
    "fever": "verify if the claim is supported or refuted",
}


def test_every_kilt_task_of_the_release_has_a_description_and_the_kilt_rule():
    released = {"aidayago2", "blink", "cweb", "eli5", "fever", "hotpotqa", "nq", "structured_zeroshot"}
    released |= {"trex", "triviaqa", "wned", "wow"}  # the configs of the hub's corag/kilt
    kilt = {t.kilt: t for t in TASKS.values() if t.is_kilt}
    assert set(kilt) == released
    assert all(t.rule == "kilt" and t.description for t in kilt.values())
    for name, description in PAPER.items():
        assert task_description(name) == description and TASKS[name].official_description
    assert not TASKS["wow"].official_description and not TASKS["eli5"].official_description
    assert {TASKS[n].headline for n in ("fever", "aidayago2", "trex")} == {"accuracy"}
    assert (TASKS["wow"].headline, TASKS["eli5"].headline, TASKS["nq"].headline) == ("f1", "rougel", "em")


def test_multihop_tasks_keep_their_official_rules():
    assert {
        n: TASKS[n].rule for n in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "multihopqa")
    } == {
        "hotpotqa": "hotpotqa",
        "2wikimultihopqa": "2wikimultihopqa",
        "musique": "musique",
        "bamboogle": "squad",
        "multihopqa": "squad",
    }
    assert {task_description(n) for n in ("hotpotqa", "musique", "bamboogle")} == {
        "answer multi-hop questions"
    }


def test_names_aliases_and_the_kilt_namespace():
    assert get_task("2wiki").name == "2wikimultihopqa"
    assert get_task("zsRE").name == "structured_zeroshot" and get_task("kilt_nq").name == "nq"
    assert get_task("hotpotqa").name == "hotpotqa"  # the original benchmark ...
    assert get_task("hotpotqa", kilt=True).name == "kilt_hotpotqa"  # ... and KILT's, in a KILT file
    with pytest.raises(InputError, match="unknown task 'squad'; known: 2wikimultihopqa") as err:
        get_task("squad")
    assert err.value.field == "task"


@pytest.mark.parametrize(
    ("path", "task", "split"),
    [
        ("hotpotqa-dev-kilt.jsonl", "kilt_hotpotqa", "dev"),
        ("/x/structured_zeroshot-dev-kilt.jsonl", "structured_zeroshot", "dev"),
        ("/x/triviaqa-dev_id-kilt.jsonl", "triviaqa", "dev"),
        ("nq-test_without_answers-kilt.jsonl", "nq", "test"),
        ("hotpot_dev_distractor_v1.json", "hotpotqa", "dev"),
        ("2wiki_dev_sample.json", "2wikimultihopqa", "dev"),
        ("musique_ans_v1.0_dev.jsonl", "musique", "dev"),
        (
            "cache/datasets--corag--kilt/snapshots/ab12/nq/validation-00000-of-00001.parquet",
            "nq",
            "validation",
        ),
        ("corag/kilt/hotpotqa/test-00000-of-00001.parquet", "kilt_hotpotqa", "test"),
        ("corag/multihopqa/hotpotqa/validation-00000-of-00001.parquet", "hotpotqa", "validation"),
        ("validation-00000-of-00001.parquet", None, "validation"),
        ("kilt_hotpotqa_validation.jsonl", "kilt_hotpotqa", "validation"),  # named by the task itself
        ("data/kilt/nq_validation.jsonl", "nq", "validation"),
        ("2wikimultihopqa_train.jsonl", "2wikimultihopqa", "train"),
        ("my_questions.jsonl", None, None),
    ],
)
def test_what_file_names_say(path, task, split):
    assert named_tasks(path) == ((task,) if task else ())
    assert split_from_path(path) == split


@pytest.mark.parametrize(
    "path",
    [
        "kilt-hotpotqa-validation.jsonl",
        "hotpotqa_kilt_validation.jsonl",
        "data/kilt/hotpotqa_validation.jsonl",  # the word in the folder
        "KILT_hotpot_dev.jsonl",
    ],
)
def test_a_name_that_only_suggests_hotpotqa_beside_kilt_means_two_tasks(path):
    """HotpotQA and KILT's HotpotQA are scored by different rules (yes/no F1 0, or not): a name with
    `kilt` beside `hotpotqa` could mean either unless the records are KILT's."""
    assert named_tasks(path) == ("hotpotqa", "kilt_hotpotqa")
    assert named_tasks(path, kilt=True) == ("kilt_hotpotqa",)  # KILT records: KILT's namespace


def test_a_name_that_reads_as_one_task_stays_one():
    assert named_tasks("kilt_hotpotqa_dev.jsonl") == ("kilt_hotpotqa",)  # the task's own name
    assert named_tasks("hotpotqa-dev-kilt.jsonl") == ("kilt_hotpotqa",)  # KILT's own file name
    assert named_tasks("nq_kilt_dev.jsonl") == ("nq",)  # KILT alone has an NQ task
    assert named_tasks("corag/kilt/hotpotqa/validation-00000-of-00001.parquet") == ("kilt_hotpotqa",)
    assert named_tasks("hotpotqa_validation.jsonl") == ("hotpotqa",)
