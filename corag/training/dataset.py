"""The examples dataset on disk: chains become a three-task prompt/completion dataset, once.

`corag build-examples` (corag/commands/build_examples.py) and the SFT recipe build it with `build`. The
chains file (as `corag sample` writes it) is streamed in shards of `shard_chains` chains. Each shard's
examples (sub-query, sub-answer, final answer, and learned-stop on request; see corag/training/examples.py)
are saved as a small Arrow dataset the moment they are built, so a killed build resumes at the first
missing shard and memory stays bounded by one shard whatever the file's size. Documents come from each
step's `steps[].doc_ids` and the record's `context_doc_ids`; only where they are missing is a retriever
loaded (`index` folder or `retriever_url`). The finished dataset appears at `dataset` in one rename: the
shards' Arrow files side by side, as `datasets.save_to_disk` lays out a sharded dataset (linked, not
copied), with `examples.json` beside them (settings and counts per task); a rerun with the same settings
leaves it as it is, and two processes building the same output take turns (a lock file).

Columns: prompt and completion (chat messages), task, id, and the provenance chain_id and step. Plain
`trl sft` reads it as `datasets: [{path: arrow, data_files: OUTPUT/data-*.arrow}]`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corag.data.jsonl import atomic_folder, atomic_write, file_sha256, locked, wait_for_file
from corag.errors import InputError
from corag.training.examples import (
    DEFAULT_RATIO,
    TASKS,
    ChainRecord,
    TokenizerTruncator,
    build_examples,
    iter_chains,
    lm_prefix_scorer,
    load_example_file,
    tokenize_dataset,
)

logger = logging.getLogger("corag.training.dataset")

MANIFEST = "examples.json"
# Settings that do not change the examples (so a resumed or repeated build may differ in them).
NOT_CONTENT = ("chains", "dataset", "num_proc", "index", "retriever_url", "scorer_model")


@dataclass
class ExamplesConfig:
    """What `corag build-examples` reads and how it turns chains into examples; the SFT recipe takes the
    same settings (it builds the examples first when given chains)."""

    _argument_group_name = "examples (corag.training.dataset)"

    chains: str | None = field(default=None, metadata={"help": "chain records JSONL (`corag sample` output)"})
    corpus: str | None = field(
        default=None, metadata={"help": "corpus (.jsonl/.parquet/dataset folder or `corag corpus` store)"}
    )
    dataset: str | None = field(
        default=None, metadata={"help": "examples dataset folder (datasets.save_to_disk) to write or read"}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "model folder or name whose tokenizer cuts documents as at inference (default: none)"
        },
    )
    index: str | None = field(
        default=None,
        metadata={"help": "index folder to re-retrieve steps without doc ids (loaded only then)"},
    )
    retriever_url: str | None = field(
        default=None, metadata={"help": "`corag serve-retriever` address, instead of `index`"}
    )
    min_score: float | None = field(
        default=None, metadata={"help": "drop chains scored below this; default: keep every chain"}
    )
    ratio: float = field(
        default=DEFAULT_RATIO, metadata={"help": "keep rate of sub-query/sub-answer examples"}
    )
    example_seed: int = field(default=0, metadata={"help": "seed of the ratio draws (one draw per example)"})
    stop_examples: bool = field(default=False, metadata={"help": "add learned-stop (Yes/No) examples"})
    scorer_model: str | None = field(
        default=None,
        metadata={
            "help": "model that scores chain prefixes for stop examples when records lack prefix_scores"
        },
    )
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "the scorer's chat template variables, JSON (as at sampling)"}
    )
    shard_chains: int = field(default=2000, metadata={"help": "chains per shard (the unit of resume)"})
    num_proc: int = field(
        default=1,
        metadata={
            "help": "processes building shards (each loads the tokenizer, and any retriever or scorer it "
            "needs: prefer retriever_url then)"
        },
    )


def features() -> Any:
    """The dataset's columns and types."""
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features(
        {
            "prompt": List(message),
            "completion": List(message),
            "task": Value("string"),
            "id": Value("string"),
            "chain_id": Value("string"),
            "step": Value("int32"),
        }
    )


def settings(config: ExamplesConfig) -> dict[str, Any]:
    """What decides the examples: the content settings and the chains file's bytes (not its path or
    time stamps: a moved or copied chains file resumes and finds the same dataset)."""
    if not Path(config.chains).is_file():
        raise InputError("no such file", file=config.chains, field="chains")
    values = {k: v for k, v in asdict(config).items() if k not in NOT_CONTENT}
    return {**values, "chains_sha256": file_sha256(config.chains)}


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of a finished dataset folder, or None when there is none."""
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def _check_same(found: Mapping[str, Any], wanted: Mapping[str, Any], where: Path) -> None:
    if dict(found) != dict(wanted):
        keys = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
        raise InputError(
            f"was built with other settings ({', '.join(keys)}); choose another dataset folder or delete it",
            file=str(where),
        )


class _LazyRetriever:
    """The configured retriever, loaded at its first search (most chains never need one)."""

    def __init__(self, config: ExamplesConfig) -> None:
        self.source = config.index or config.retriever_url
        self.corpus_source = config.corpus
        self._retriever: Any = None

    def search(self, queries: Any, k: int) -> Any:
        if self._retriever is None:
            from corag.data.corpus import Corpus
            from corag.retrieval import check_corpus, load_retriever

            check_corpus(self.source, Corpus.load(self.corpus_source))
            logger.info("loading the retriever %s to re-retrieve steps without doc ids", self.source)
            self._retriever = load_retriever(self.source)
        return self._retriever.search(queries, k)


def check_prefix_scores(config: ExamplesConfig) -> None:
    """Stop examples come from the prefix scores `corag sample` keeps in each record, with no model. A
    chains file written before it kept them is scored by `scorer_model` as before, which one line says;
    without a scorer_model it is refused before anything is built."""
    total, missing, first = 0, 0, None
    for chain in iter_chains(config.chains, config.min_score):  # streamed: memory stays small
        total += 1
        if chain.prefix_scores is None:
            missing, first = missing + 1, first or chain.id
    if not missing:
        return
    what = f"{missing} of {total} chains have no prefix_scores (written before `corag sample` kept them)"
    if config.scorer_model is None:
        raise InputError(
            f"{what}: set scorer_model to score their prefixes for stop examples",
            file=config.chains,
            record=first,
            field="scorer_model",
        )
    logger.warning(
        "%s: scoring their prefixes with scorer_model %s for stop examples", what, config.scorer_model
    )


def _prefix_scorer(config: ExamplesConfig) -> Any:
    """Stop examples of records without prefix scores are scored by `scorer_model` (loaded when needed)."""
    scorer: list[Any] = []

    def score(chains: Any) -> list[list[float]]:
        if not scorer:
            from corag.lm.settings import EngineSettings

            engine = EngineSettings(chat_template_kwargs=config.chat_template_kwargs)
            scorer.append(lm_prefix_scorer(engine.load(config.scorer_model)))
        return scorer[0](chains)

    return score


def _truncator(config: ExamplesConfig) -> TokenizerTruncator | None:
    if config.tokenizer is None:
        return None
    from transformers import AutoTokenizer

    return TokenizerTruncator(AutoTokenizer.from_pretrained(config.tokenizer))


class _ShardBuilder:
    """Builds and saves one shard at a time; each worker process holds one (corpus, tokenizer, retriever)."""

    def __init__(self, config: ExamplesConfig) -> None:
        from corag.data.corpus import Corpus

        self.config, self.corpus, self.truncator = config, Corpus.load(config.corpus), _truncator(config)
        self.retriever = _LazyRetriever(config) if (config.index or config.retriever_url) else None
        self.scorer = _prefix_scorer(config)

    def __call__(self, folder: Path, batch: list[ChainRecord]) -> tuple[int, int]:
        from datasets import Dataset

        config = self.config
        examples = build_examples(
            batch,
            self.corpus,
            retriever=self.retriever,
            truncator=self.truncator,
            ratio=config.ratio,
            seed=config.example_seed,
            stop=config.stop_examples,
            prefix_scores=self.scorer,
        )
        with atomic_folder(folder) as tmp:
            Dataset.from_list(examples, features=features()).save_to_disk(str(tmp))
        return len(batch), len(examples)


_WORKER: list[_ShardBuilder] = []


def _init_worker(config: ExamplesConfig) -> None:
    _WORKER.append(_ShardBuilder(config))


def _in_worker(folder: Path, batch: list[ChainRecord]) -> tuple[int, int]:
    return _WORKER[0](folder, batch)


def _write_shards(config: ExamplesConfig, work: Path) -> int:
    """Build every missing shard of `work` (in `num_proc` processes, at most two shards each in flight,
    so memory stays bounded); the number of shards."""
    chains = iter_chains(config.chains, config.min_score)
    batches = enumerate(iter(lambda: list(itertools.islice(chains, config.shard_chains)), []))
    shards = 0
    if config.num_proc == 1:
        build = _ShardBuilder(config)
        for shard, batch in batches:
            shards = shard + 1
            folder = work / f"shard-{shard:05d}"
            if not folder.is_dir():  # else built before an interruption
                _log_shard(shard, *build(folder, batch))
        return shards
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no fork of a process holding threads or a GPU
    with ProcessPoolExecutor(config.num_proc, context, initializer=_init_worker, initargs=(config,)) as pool:
        pending: dict[Any, int] = {}
        for shard, batch in batches:
            shards = shard + 1
            folder = work / f"shard-{shard:05d}"
            if folder.is_dir():
                continue
            pending[pool.submit(_in_worker, folder, batch)] = shard
            while len(pending) >= 2 * config.num_proc:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    _log_shard(pending.pop(future), *future.result())
        for future in list(pending):
            _log_shard(pending.pop(future), *future.result())
    return shards


def _log_shard(shard: int, chains: int, examples: int) -> None:
    logger.info("shard %d: %d chains, %d examples", shard, chains, examples)


def _finish(work: Path, out: Path, shards: int, wanted: dict[str, Any]) -> dict[str, Any]:
    """Gather the shards' Arrow files into one dataset folder at `out`, in one rename.

    The files are hard-linked (copied only across file systems), never read into memory: the dataset is
    the shards side by side, as `save_to_disk` lays out a sharded dataset. Counts come from memory-mapped
    columns, one shard at a time."""
    import pyarrow.compute as pc
    from datasets import load_from_disk

    counts: Counter[str] = Counter()
    chains, sources, fingerprints = 0, [], []
    for i in range(shards):
        shard = work / f"shard-{i:05d}"
        table = load_from_disk(str(shard)).data
        tasks = pc.value_counts(table.column("task")).to_pylist()
        counts.update({row["values"]: row["counts"] for row in tasks})
        chains += len(pc.unique(table.column("chain_id")))  # a chain's examples never span two shards
        state = json.loads((shard / "state.json").read_text())
        sources += [shard / entry["filename"] for entry in state["_data_files"]]
        fingerprints.append(state["_fingerprint"])
    manifest = {
        "settings": wanted,
        "examples": sum(counts.values()),
        "chains": chains,
        "tasks": {task: counts.get(task, 0) for task in TASKS},
    }
    names = [f"data-{k:05d}-of-{len(sources):05d}.arrow" for k in range(len(sources))]
    state["_data_files"] = [{"filename": name} for name in names]
    state["_fingerprint"] = hashlib.sha256(" ".join(fingerprints).encode()).hexdigest()[:16]
    with atomic_folder(out) as tmp:
        for source, name in zip(sources, names, strict=True):
            try:
                os.link(source, tmp / name)
            except OSError:
                shutil.copyfile(source, tmp / name)
        shutil.copyfile(work / "shard-00000" / "dataset_info.json", tmp / "dataset_info.json")
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        with atomic_write(tmp / MANIFEST) as f:
            json.dump(manifest, f, indent=1)
    shutil.rmtree(work)
    return manifest


def build(config: ExamplesConfig, builder: bool = True) -> Path:
    """Build (or resume, or find already built) the examples dataset at `config.dataset`. A process with
    `builder` false never builds: it waits for the finished dataset (the manifest) and checks it."""
    for name in ("chains", "corpus", "dataset"):
        if not getattr(config, name):
            raise InputError("required to build examples", field=name)
    for name in ("shard_chains", "num_proc"):
        if getattr(config, name) < 1:
            raise InputError("must be at least 1", field=name)
    out, wanted = Path(config.dataset), settings(config)
    if not builder:
        wait_for_file(out / MANIFEST, "building")
    with locked(out, "building"):
        found = read_manifest(out)
        if found is not None:
            _check_same(found["settings"], wanted, out / MANIFEST)
            logger.info("examples already built at %s", out)
            return out
        if out.exists():
            raise InputError("exists and is not a finished examples dataset; delete it", file=str(out))
        if config.stop_examples:
            check_prefix_scores(config)
        work = out.with_name(out.name + ".partial")
        recorded = work / "settings.json"
        if recorded.is_file() and json.loads(recorded.read_text()) != wanted:
            # an unfinished build of ours from other inputs (a chains file fixed since, other options):
            # its shards cannot be resumed, and it must not block this build
            changed = sorted(k for k, v in json.loads(recorded.read_text()).items() if wanted.get(k) != v)
            logger.warning("discarding the unfinished build in %s (other %s)", work, ", ".join(changed))
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        if not recorded.is_file():
            with atomic_write(recorded) as f:
                json.dump(wanted, f, indent=1)
        try:
            shards = _write_shards(config, work)
            if shards == 0:
                where = {"file": config.chains}
                if config.min_score is None:
                    raise InputError("holds no chain", **where)
                raise InputError(f"no chain scores {config.min_score} or more", field="min_score", **where)
        except InputError:
            shutil.rmtree(work)  # refused inputs: nothing of this build is worth resuming
            raise
        manifest = _finish(work, out, shards, wanted)
    logger.info(
        "%d examples of %d chains at %s: %s", manifest["examples"], manifest["chains"], out, manifest["tasks"]
    )
    return out


def from_jsonl(path: str | Path, output: str | Path) -> Path:
    """Prebuilt prompt/completion examples (JSONL: warm start, baselines) as a dataset folder, once."""
    from datasets import Dataset

    source, out = Path(path), Path(output)
    if not source.is_file():
        raise InputError("no such file", file=str(source), field="examples")
    wanted = {"examples_sha256": file_sha256(source)}
    with locked(out, "building"):
        found = read_manifest(out)
        if found is not None:
            _check_same(found["settings"], wanted, out / MANIFEST)
            return out
        records = load_example_file(source)
        columns = ("prompt", "completion", "task", "id")
        dataset = Dataset.from_list([{k: r.get(k) for k in columns} for r in records])
        counts = Counter(r["task"] for r in records)
        manifest = {
            "settings": wanted,
            "examples": len(records),
            "tasks": {task: counts.get(task, 0) for task in TASKS},
        }
        with atomic_folder(out) as tmp:
            dataset.save_to_disk(str(tmp))
            with atomic_write(tmp / MANIFEST) as f:
                json.dump(manifest, f, indent=1)
    return out


def fingerprint(
    tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None, max_length: int | None
) -> str:
    """A short hash of what decides the tokens: the tokenizer, its chat template, the template kwargs, the cap."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = json.dumps(
        [
            backend.to_str() if backend is not None else repr(tokenizer.get_vocab()),
            tokenizer.chat_template,
            dict(chat_template_kwargs or {}),
            max_length,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenized(
    dataset_dir: str | Path,
    tokenizer: Any,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    max_length: int | None = None,
    num_proc: int | None = None,
    builder: bool = True,
) -> Any:
    """The dataset with input_ids, labels and length, tokenized once and cached beside the examples.

    The first process tokenizes (in `num_proc` processes) into `DATASET/tokenized/<fingerprint>` and the
    others wait on the lock (or, with `builder` false, for the finished folder), then every process
    memory-maps the same files. Examples longer than `max_length` are dropped (trl would cut them
    through their target), with a warning.
    """
    from datasets import load_from_disk

    cache = Path(dataset_dir) / "tokenized" / fingerprint(tokenizer, chat_template_kwargs, max_length)
    if not builder:
        wait_for_file(cache / "dataset_info.json", "tokenizing")
    if (cache / "dataset_info.json").is_file():  # finished folders appear in one rename
        return load_from_disk(str(cache))
    with locked(cache, "building"):
        if not (cache / "dataset_info.json").is_file():
            with atomic_folder(cache) as tmp, tempfile.TemporaryDirectory(dir=cache.parent) as work:
                _tokenize_into(
                    tmp, Path(work), dataset_dir, tokenizer, chat_template_kwargs, max_length, num_proc
                )
    return load_from_disk(str(cache))


def _tokenize_into(
    out: Path,
    work: Path,
    dataset_dir: str | Path,
    tokenizer: Any,
    chat_template_kwargs: Mapping[str, Any] | None,
    max_length: int | None,
    num_proc: int | None,
) -> None:
    from datasets import load_from_disk

    dataset = tokenize_dataset(
        load_from_disk(str(dataset_dir)),
        tokenizer,
        chat_template_kwargs,
        num_proc,
        cache_file_name=str(work / "tokens.arrow"),
    )
    if max_length is not None:
        too_long = sum(n > max_length for n in dataset.data.column("length").to_pylist())
        if too_long == len(dataset):
            raise InputError(
                f"no example fits max_length {max_length} (all {too_long} are longer)", field="max_length"
            )
        if too_long:
            logger.warning("dropping %d examples longer than max_length %d", too_long, max_length)
            dataset = dataset.filter(
                lambda n: n <= max_length,
                input_columns="length",
                num_proc=num_proc,
                cache_file_name=str(work / "kept.arrow"),
            )
    dataset.save_to_disk(str(out), max_shard_size="500MB")
