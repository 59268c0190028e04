"""Tasks: the name of each benchmark's questions, the task description the prompts carry, and the
official rule that scores its answers.

Multi-hop QA tasks keep their benchmark names (`hotpotqa`, `2wikimultihopqa`, `musique`, `bamboogle`,
and `multihopqa` for any other multi-hop set); PopQA (Search-R1's suite) is `popqa`, scored by SQuAD's
rule (it has no official script). KILT tasks keep KILT's own names (`nq`, `triviaqa`,
`fever`, `aidayago2`, `wned`, `cweb`, `blink`, `trex`, `structured_zeroshot`, `eli5`, `wow`), each also
spelled `kilt_<name>`; KILT's HotpotQA is `kilt_hotpotqa`, since `hotpotqa` names the original
benchmark, whose answers are scored by another rule. KILT files (`hotpotqa-dev-kilt.jsonl`) name tasks
in KILT's namespace, so there `hotpotqa` means `kilt_hotpotqa`.

Where a task's name comes from, first to last: `--task`; the records (a `task` field, or KILT's
record layout, which puts the name in KILT's namespace); the file's name (`hotpot_dev_distractor_v1.json`,
`nq-dev-kilt.jsonl`) or, for a split of a hub dataset (`.../kilt/nq/validation-00000-of-00001.parquet`),
its folders. Nothing else is guessed: without any of these, or with a name that reads as two tasks
(`hotpotqa_kilt_validation.jsonl` over records in the shared question schema: HotpotQA or KILT's
HotpotQA, scored by different rules), the loader asks for `--task`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corag.errors import InputError

# The descriptions of the CoRAG paper (Table 10, "Task descriptions for each dataset") and of the
# official inference code (`answer multi-hop questions`); the prompts carry them verbatim.
MULTIHOP = "answer multi-hop questions"
ENTITY_LINKING = (
    "link the mention surrounded by [START_ENT] and [END_ENT] to the title of the correct Wikipedia page"
)
SLOT_FILLING = (
    "given head entity and relation separated by [SEP], find the correct tail entity, return the title of "
    "its Wikipedia page"
)
# Neither the paper nor the official release evaluates Wizard of Wikipedia or ELI5, so no official
# description exists for them: these two are the project's own, in the same style.
DIALOGUE = "continue the conversation with an informative reply, using knowledge from Wikipedia"
LONG_ANSWER = "answer the question with a detailed explanation that a child could understand"
# PopQA (Search-R1's suite; not in the paper) has none either: the project's own.
ENTITY_QA = "answer questions about entities, popular and long-tail ones"

RULES = ("squad", "hotpotqa", "2wikimultihopqa", "musique", "kilt")


@dataclass(frozen=True)
class Task:
    """One task: its name, the description in its prompts, the rule that scores it, KILT's name for
    it (KILT tasks only), and the metric KILT's leaderboard ranks it by."""

    name: str
    description: str
    rule: str
    kilt: str | None = None
    headline: str = "em"
    official_description: bool = True

    @property
    def is_kilt(self) -> bool:
        return self.kilt is not None


def _kilt(
    name: str, description: str, headline: str, *, kilt: str | None = None, official: bool = True
) -> Task:
    return Task(name, description, "kilt", kilt or name, headline, official)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        # multi-hop QA: name -> the rule of its official script (SQuAD's where it has none)
        *(
            Task(name, MULTIHOP, rule)
            for name, rule in {
                "multihopqa": "squad",
                "hotpotqa": "hotpotqa",
                "2wikimultihopqa": "2wikimultihopqa",
                "musique": "musique",
                "bamboogle": "squad",
                "toy": "squad",
            }.items()
        ),
        Task("popqa", ENTITY_QA, "squad", official_description=False),
        _kilt("nq", "answer natural questions from Google search", "em"),
        _kilt("triviaqa", "answer trivia questions", "em"),
        _kilt("kilt_hotpotqa", MULTIHOP, "em", kilt="hotpotqa"),
        _kilt("fever", "verify if the claim is supported or refuted", "accuracy"),
        *(_kilt(name, ENTITY_LINKING, "accuracy") for name in ("aidayago2", "wned", "cweb", "blink")),
        *(_kilt(name, SLOT_FILLING, "accuracy") for name in ("trex", "structured_zeroshot")),
        _kilt("wow", DIALOGUE, "f1", official=False),
        _kilt("eli5", LONG_ANSWER, "rougel", official=False),
    )
}
# Other spellings users and files use.
ALIASES: dict[str, str] = {
    "2wiki": "2wikimultihopqa",
    "zsre": "structured_zeroshot",
    "zeroshot_re": "structured_zeroshot",
    "wnwi": "wned",
    "wncw": "cweb",
    **{f"kilt_{t.kilt}": t.name for t in TASKS.values() if t.kilt},
}
_KILT_NAMES = {t.kilt: t.name for t in TASKS.values() if t.kilt}


def known_tasks() -> list[str]:
    return sorted(TASKS)


def get_task(name: str, *, kilt: bool = False, field: str = "task", **where: Any) -> Task:
    """The task called `name` (aliases allowed); with `kilt`, names are read in KILT's namespace
    (`hotpotqa` is KILT's HotpotQA). An unknown name is an InputError listing the known ones."""
    key = name.strip().lower().replace("-", "_")
    if kilt and key in _KILT_NAMES:
        key = _KILT_NAMES[key]
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise InputError(f"unknown task {name!r}; known: {', '.join(known_tasks())}", field=field, **where)
    return TASKS[key]


def task_description(task: str, meta: Mapping[str, Any] | None = None) -> str:
    """The description in a question's prompts: the record's own `task_desc` when it carries one (as
    the official inference reads it), else the task's."""
    own = (meta or {}).get("task_desc")
    return own if isinstance(own, str) and own.strip() else get_task(task).description


# Names of files -----------------------------------------------------------------------------------

_KILT_FILE = re.compile(r"^(?P<task>[a-z0-9_]+)-(?P<split>train|dev|test)[^-]*-kilt\b", re.IGNORECASE)
_HUB_SPLIT = re.compile(r"^(?P<split>train|validation|test|dev)-\d{5}-of-\d{5}\.", re.IGNORECASE)
_BENCHMARK_WORDS = (
    ("2wiki", "2wikimultihopqa"),
    ("wikimultihop", "2wikimultihopqa"),
    ("hotpot", "hotpotqa"),
    ("musique", "musique"),
    ("bamboogle", "bamboogle"),
)


def _hub_task(path: Path) -> str | None:
    """The task of a hub dataset split (`<dataset>/<config>/<split>-00000-of-00001.parquet`): the
    config folder, read in KILT's namespace when an ancestor folder is the `kilt` dataset."""
    if not _HUB_SPLIT.match(path.name):
        return None
    config = path.parent.name
    in_kilt = any(p.name.lower() == "kilt" or p.name.lower().endswith("--kilt") for p in path.parents)
    try:
        return get_task(config, kilt=in_kilt).name
    except InputError:
        return None


def _name_says(path: Path) -> str | None:
    """The task a file's name (or its hub folders) says, in the namespace the name implies, or None."""
    m = _KILT_FILE.match(path.name)
    if m:
        try:
            return get_task(m.group("task"), kilt=True).name
        except InputError:
            return None
    hub = _hub_task(path)
    if hub:
        return hub
    name = path.name.lower()
    # a file named by its task, as `corag prepare-data` names them: kilt_hotpotqa_dev.jsonl, nq_validation.jsonl
    named = [task for task in TASKS if re.match(rf"{re.escape(task)}[_.-]", name)]
    if named:
        return max(named, key=len)
    return next((task for word, task in _BENCHMARK_WORDS if word in name), None)


def named_tasks(path: str | Path, *, kilt: bool = False) -> tuple[str, ...]:
    """The tasks a file's name can mean: none, one, or two. With `kilt` (the records have KILT's
    layout) names are read in KILT's namespace. Otherwise a name or folder with the word `kilt` beside
    a benchmark KILT holds under the same name (`hotpotqa_kilt_validation.jsonl`,
    `kilt-hotpotqa-validation.jsonl`) could mean either: both are returned, for the caller to refuse."""
    path = Path(path)
    said = _name_says(path)
    if said is None:
        return ()
    task = get_task(said, kilt=kilt).name
    twin = _KILT_NAMES.get(task)  # KILT's task of the same name (hotpotqa -> kilt_hotpotqa)
    words = re.split(r"[^a-z0-9]+", f"{path.parent.name} {path.name}".lower())
    if not kilt and twin is not None and twin != task and "kilt" in words:
        return (task, twin)
    return (task,)


def split_from_path(path: str | Path) -> str | None:
    """The split a file's name says (`validation`, `dev`, `test`, `train`), or None."""
    name = Path(path).name
    for pattern in (_KILT_FILE, _HUB_SPLIT):
        m = pattern.match(name)
        if m:
            return m.group("split").lower()
    words = re.split(r"[^a-z]+", name.lower())
    return next((s for s in ("validation", "dev", "test", "train") if s in words), None)
