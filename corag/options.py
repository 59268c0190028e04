"""What the commands that answer questions share: the questions, the model and retriever, resume keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corag.chain import FINAL_DOCS, GenerationLimits
from corag.errors import InputError
from corag.executor import EXECUTORS
from corag.lm.base import SYSTEM_DEFAULT
from corag.lm.settings import EngineSettings
from corag.tasks import get_task
from corag.types import Example


@dataclass
class QuestionsArgs:
    """The questions a command answers (`corag predict`, `corag evaluate`)."""

    _argument_group_name = "questions"

    data: str = field(
        metadata={
            "help": "questions (HotpotQA, 2Wiki, MuSiQue, Bamboogle, KILT, multihopqa, FlashRAG, plain JSONL)"
        }
    )
    format: str | None = field(
        default=None, metadata={"help": "format of --data (told by its records' keys when not given)"}
    )
    task: str | None = field(
        default=None,
        metadata={"help": "task of the questions (nq, kilt_hotpotqa, ...; default: the records' own, else "
        "the file name's)"},
    )  # fmt: skip
    aliases: str | None = field(
        default=None, metadata={"help": "2WikiMultihopQA id_aliases.json (aliases and demonyms)"}
    )
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})
    split: str | None = field(
        default=None, metadata={"help": "split name for the official files (default: from the file name)"}
    )

    def check(self) -> None:
        if self.task is not None:
            get_task(self.task, field="--task")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"must be 1 or more, got {self.limit}", field="--limit")

    def load(self) -> tuple[list[Example], list[Example]]:
        """(every question of the file, the first --limit of them)."""
        from corag.data.formats import load_examples

        options = {"task": self.task, **({"aliases": self.aliases} if self.aliases else {})}
        loaded = load_examples(self.data, self.format, **options)
        return loaded, loaded[: self.limit]


@dataclass
class DecodingArgs:
    """The model, corpus and retriever questions are answered with, and how many run at once."""

    _argument_group_name = "decoding"

    model: str | None = field(
        default=None, metadata={"help": "checkpoint folder (or hub name) of a chat model"}
    )
    corpus: str | None = field(
        default=None, metadata={"help": "corpus file (.jsonl, .parquet, .arrow) or dataset folder"}
    )
    retriever: str | None = field(
        default=None, metadata={"help": "index folder from `corag index`, or a `corag serve-retriever` URL"}
    )
    index_devices: str | None = field(
        default=None,
        metadata={
            "help": "GPUs of a dense index folder's fp16 shards: cuda:0-3, cuda:0,1 or cpu (default: every visible GPU); a service URL holds its own"
        },
    )
    final_docs: str = field(
        default="auto",
        metadata={"choices": list(FINAL_DOCS), "help": "CoRAG's final-answer documents: the data's "
        "context_doc_ids when it has them (auto, as the official inference), always them (dataset), or a "
        "search of the question (retrieve)"},
    )  # fmt: skip
    budget: int | None = field(default=None, metadata={"help": "token budget per question"})
    max_active: int = field(default=64, metadata={"help": "questions decoded at once"})
    executor: str = field(
        default="stepped",
        metadata={"choices": sorted(EXECUTORS), "help": "stepped waves of batched calls, or asyncio tasks "
        "whose calls are sent as they come (searches overlap generation; with --backend vllm-async calls "
        "join the running batch)"},
    )  # fmt: skip
    official_files: bool = field(
        default=False,
        metadata={"help": "also write the official inference's preds_{strategy}_{task}_{split}.jsonl and "
        "metrics files"},
    )  # fmt: skip

    def check(self) -> None:
        if self.budget is not None and self.budget < 1:
            raise InputError(f"must be a positive number of tokens, got {self.budget}", field="--budget")
        if self.max_active < 1:
            raise InputError(f"must be 1 or more, got {self.max_active}", field="--max-active")

    def require(self, *names: str) -> None:
        """Refuse a run without the given options."""
        for name in names:
            if not getattr(self, name):
                raise InputError("required to answer questions", field=f"--{name}")

    def load(self, engine: EngineSettings) -> tuple[Any, Any]:
        """The model and the retriever, once the plan fits the GPUs this process sees."""
        from corag.plan import check_visible
        from corag.retrieval import load_retriever

        check_visible("evaluate", {**dataclasses.asdict(self), **dataclasses.asdict(engine)})
        return engine.load(self.model), load_retriever(self.retriever, index_devices=self.index_devices)


def check_unique_ids(examples: Sequence[Example], data: str) -> None:
    """Duplicate question ids are an error: resuming and scoring find answers by id."""
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise InputError("duplicate question id", file=data, record=ex.id, field="id")
        seen.add(ex.id)


def chain_settings(engine: EngineSettings, limits: GenerationLimits) -> dict[str, Any]:
    """The settings that change a run's outputs (rendering and limits), those not at their defaults:
    what a resumable run adds to its config hash, so earlier runs keep theirs."""
    values = {
        "chat_template_kwargs": engine.chat_template_kwargs,
        "system_prompt": engine.system_prompt,
        **dataclasses.asdict(limits),
    }
    defaults = {
        "chat_template_kwargs": None,
        "system_prompt": SYSTEM_DEFAULT,
        **dataclasses.asdict(GenerationLimits()),
    }
    return {k: v for k, v in values.items() if v != defaults[k]}


def settings_record(*configs: Any) -> dict[str, Any]:
    """Every option of a command's configs, as written into its metrics (paths as text)."""
    values: dict[str, Any] = {}
    for config in configs:
        values.update(dataclasses.asdict(config))
    if values.get("api_key"):
        values["api_key"] = "(set)"  # a secret: never written to outputs
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
