"""The toy-world study: the whole CoRAG loop, for real, on a CPU.

    world ─▶ warm-start a tiny model from scratch on fresh worlds (the stand-in for an instruct model)
          ─▶ index the world (MiniLM or BM25) ─▶ rejection-sample chains for its training questions
          ─▶ fine-tune on the three tasks, chains that reach the answer only (the CoRAG model)
          ─▶ fine-tune on question + top-k documents only, the sampled questions, as many steps
             (single-step baseline)
          ─▶ evaluate every method on held-out questions by hop count ─▶ table, plot, summary JSON

Every stage writes into `out_dir` and is skipped when its output is already there, so an interrupted
study resumes. `corag quickstart` runs a small configuration; benchmarks/toyworld.py the full one.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.iterate import check_same_settings, run_recipe, stage
from corag.resources import CONFIGS, SFT_RECIPE

# judge_headroom's counts of questions, per hop count (summed over seeds by benchmarks/toyworld.py).
JUDGE_COUNTS = ("questions", "greedy", "any", "penalty", "link_check")

# Table label -> (model, run spec). Models: "warm", "corag", "single_step".
DEFAULT_EVALS = {
    "no_retrieval": ("corag", "greedy:L=0:docs=0"),
    "single_step": ("single_step", "greedy:L=0"),
    "corag_greedy": ("corag", "greedy:L=3"),
    "warm_greedy": ("warm", "greedy:L=3"),  # the warm model before fine-tuning, to measure what it adds
    "corag_best_of_4": ("corag", "best_of_n:L=3:N=4"),
    "corag_tree": ("corag", "tree_search:L=3"),
    "ircot": ("corag", "ircot"),
    "ircot_one_step": ("corag", "one_step"),
    "ircot_no_retrieval": ("corag", "no_retrieval"),
    "searchain": ("corag", "searchain"),
}


@dataclass
class StudyConfig:
    """Sizes and settings of one study; the defaults are the full study of benchmarks/toyworld.py."""

    out_dir: str = "runs/toystudy"
    seed: int = field(default=0, metadata={"help": "target world, sampling and fine-tuning seed"})
    # The target world.
    num_entities: int = 300
    num_distractors: int = 60
    train_per_hop: int = 200
    test_per_hop: int = 50
    # The warm start (fresh worlds, never the target world), shared by every seed of a study.
    warm_dir: str | None = field(
        default=None, metadata={"help": "reuse this warm model instead of training one"}
    )
    warm_seed: int = 0
    warm_pretrain_steps: int = field(
        default=3000,
        metadata={"help": "optimiser steps trained on every token of reading and call A examples"},
    )
    warm_reading_steps: int = field(
        default=2000, metadata={"help": "optimiser steps of the curriculum (reading from one passage)"}
    )
    warm_passage_steps: int = field(
        default=300, metadata={"help": "optimiser steps reading from 5 passages alone, after the curriculum"}
    )
    warm_final_steps: int = field(
        default=400, metadata={"help": "optimiser steps of the answer phase (call C, reading beside it)"}
    )
    warm_final_mixture: list[str] = field(
        default_factory=lambda: ["final=0.5", "subanswer=0.5"],
        metadata={"help": "the answer phase's tasks and shares of batches, task=share"},
    )
    warm_mixed_steps: int = field(
        default=3000, metadata={"help": "optimiser steps on all three calls, reading from 5 passages"}
    )
    warm_curriculum: list[str] = field(
        default_factory=lambda: ["subanswer=0.5", "subquery=0.5"],
        metadata={"help": "the curriculum's tasks and shares of batches, task=share"},
    )
    warm_batch_tokens: int = 4608
    warm_learning_rate: float = 2e-3
    warm_tuning_learning_rate: float = field(
        default=5e-4,
        metadata={"help": "peak learning rate after pretraining (warm_learning_rate is pretraining's)"},
    )
    warm_prompt_loss: list[str] = field(
        default_factory=lambda: ["subquery"],
        metadata={"help": "tasks trained on every token after pretraining too"},
    )
    warm_unanswerable: float = field(
        default=0.0,
        metadata={
            "help": "share of the mixed phase's reading examples shown without the fact's passage, "
            "target 'No relevant information found' (what best-of-N's penalty measures)"
        },
    )
    warm_only: bool = field(
        default=False,
        metadata={"help": "stop after the warm start (with warm_dir: train a warm model to reuse there)"},
    )
    warm_compile: bool = field(
        default=True,
        metadata={
            "help": "torch.compile the warm start's transformer (needs a C++ compiler): about 14 percent "
            "faster, the same updates up to rounding, so not the same warm model bit for bit"
        },
    )
    model_hidden_size: int = 128
    model_layers: int = 2
    model_heads: int = 4
    # Four heads of 64 (attention 256 wide in the 128-wide model) both read passages and copy a
    # name's second word; four heads of 32 read but copy it only in part (docs/toy-study.md).
    model_head_dim: int | None = field(
        default=64, metadata={"help": "attention head size (none: model_hidden_size / model_heads)"}
    )
    # Retrieval.
    retriever: str = field(default="minilm", metadata={"help": "minilm (dense) or bm25"})
    # Rejection sampling.
    sample_questions: int = 300
    num_chains: int = 4
    max_length: int = 3
    min_score: float | None = field(
        default=-0.69,
        metadata={
            "help": "fine-tune on chains scored at least this (log 0.5: the gold answer's tokens at even "
            "odds given the chain), so that no final-answer example follows a chain that misses the answer; "
            "none: every chain"
        },
    )
    # Fine-tuning (CoRAG and the single-step baseline share the config and the number of steps).
    recipe: str = field(
        default=str(SFT_RECIPE),
        metadata={"help": "the SFT recipe the fine-tunings run, a path (default: the package's)"},
    )
    sft_config: str = field(
        default=str(CONFIGS / "sft/toy.yaml"),
        metadata={"help": "the recipe's config, a path (default: the package's toy config)"},
    )
    sft_epochs: float | None = field(
        default=None, metadata={"help": "overrides num_train_epochs of sft_config (CoRAG fine-tuning)"}
    )
    # Diagnosis: training questions left out of sampling, each call scored alone on gold inputs.
    diagnose_questions: int = field(
        default=90, metadata={"help": "unsampled training questions to score each call on (0: none)"}
    )
    # Evaluation.
    test_questions: int = 100
    # Decoding runs at most L = 3 steps, so 4-hop questions cannot be finished: testing them costs a
    # third of the evaluation and shows zeros.
    test_hops: list[int] = field(
        default_factory=lambda: [2, 3],
        metadata={"help": "hop counts of the held-out questions, among 2, 3, 4"},
    )
    evals: list[str] = field(
        default_factory=lambda: [f"{label}={model}@{spec}" for label, (model, spec) in DEFAULT_EVALS.items()],
        metadata={"help": "label=model@run_spec, model one of warm, corag, single_step"},
    )
    ircot_demonstrations: int = 4
    budget: int | None = None
    max_active: int = 64
    dtype: str = field(
        default="auto",
        metadata={
            "help": "of sampling, fine-tuning (bf16 autocast) and evaluation (bf16 weights): float32, "
            "bfloat16, or auto (bfloat16 on a GPU or a CPU with AMX); the warm start is float32"
        },
    )

    def __post_init__(self) -> None:
        for name in ("warm_curriculum", "warm_final_mixture"):  # a bad entry fails here, not later
            self.mixture(name)
        for name in (
            "diagnose_questions",
            "warm_pretrain_steps",
            "warm_reading_steps",
            "warm_passage_steps",
            "warm_final_steps",
            "warm_mixed_steps",
        ):
            if getattr(self, name) < 0:
                raise InputError(f"must be 0 or more, got {getattr(self, name)}", field=name)
        if not self.test_hops or not set(self.test_hops) <= {2, 3, 4}:
            raise InputError(f"expected hop counts among 2, 3, 4, got {self.test_hops}", field="test_hops")
        if (
            self.warm_compile
            and self.warm_dir is None
            and not any(map(shutil.which, ("g++", "c++", "clang++")))
        ):
            raise InputError(
                "torch.compile needs a C++ compiler (g++); install one or set false", field="warm_compile"
            )
        if not 0 <= self.warm_unanswerable < 1:
            raise InputError(
                f"expected a share in [0, 1), got {self.warm_unanswerable}", field="warm_unanswerable"
            )
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise InputError(f"expected auto, bfloat16 or float32, got {self.dtype!r}", field="dtype")
        for name in ("model_head_dim", "sft_epochs"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise InputError(f"must be more than 0, got {getattr(self, name)}", field=name)

    def mixture(self, name: str) -> tuple[tuple[str, float], ...]:
        """The field `name` (a list of `task=share`) as (task, share) pairs."""
        return tuple(_share(item, name) for item in getattr(self, name))


def compute_dtype(name: str) -> str:
    """The study's dtype setting resolved: `auto` is bfloat16 where its matrix products are fast (a
    GPU, or a CPU with AMX tiles), else float32."""
    import torch

    if name != "auto":
        return name
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return "bfloat16" if torch.cuda.is_available() or amx else "float32"


def _share(item: str, name: str) -> tuple[str, float]:
    """`task=share` -> (task, share), the task one of the three calls' names."""
    task, _, share = item.partition("=")
    try:
        if task in ("subanswer", "subquery", "final"):
            return task, float(share)
    except ValueError:
        pass
    raise InputError(f"expected subanswer|subquery|final=<share>, got {item!r}", field=name)


def warm_settings(cfg: StudyConfig) -> dict[str, Any]:
    """What decides a warm model: the warm start's and the model's settings, and the world it never saw."""
    settings = {k: v for k, v in asdict(cfg).items() if k.startswith(("warm_", "model_"))}
    settings.pop("warm_dir")
    settings.pop("warm_only")
    return {**settings, "excluded_world_seed": cfg.seed}


def warm_start(cfg: StudyConfig, warm: Path) -> None:
    """Train the warm model from scratch on fresh worlds and save it (with its log) to `warm`."""
    from corag.toy.tinymodel import build_tiny_model, save_tiny, train_tokenizer
    from corag.toy.warmstart import WarmStartConfig, WarmTrainConfig, heldout_accuracy, train_warm_start
    from corag.toy.world import name_pool, tokenizer_texts

    tokenizer = train_tokenizer(tokenizer_texts(None), words=name_pool())
    model = build_tiny_model(
        tokenizer,
        hidden_size=cfg.model_hidden_size,
        num_layers=cfg.model_layers,
        num_heads=cfg.model_heads,
        head_dim=cfg.model_head_dim,
    )
    schedule = WarmTrainConfig(
        pretrain_steps=cfg.warm_pretrain_steps,
        reading_steps=cfg.warm_reading_steps,
        passage_steps=cfg.warm_passage_steps,
        final_steps=cfg.warm_final_steps,
        final_mixture=cfg.mixture("warm_final_mixture"),
        mixed_steps=cfg.warm_mixed_steps,
        curriculum=cfg.mixture("warm_curriculum"),
        batch_tokens=cfg.warm_batch_tokens,
        learning_rate=cfg.warm_learning_rate,
        tuning_learning_rate=cfg.warm_tuning_learning_rate,
        prompt_loss=tuple(cfg.warm_prompt_loss),
        unanswerable=cfg.warm_unanswerable,
        seed=cfg.warm_seed,
        compile=cfg.warm_compile,
    )
    log = train_warm_start(model, tokenizer, schedule, exclude={cfg.seed})
    log["study_config"] = warm_settings(cfg)
    log["heldout_accuracy"] = heldout_accuracy(model, tokenizer, WarmStartConfig(), cfg.warm_seed)
    print(f"[warm-start] held-out accuracy (teacher-forced): {log['heldout_accuracy']}")
    partial = warm.with_name(warm.name + ".partial")
    save_tiny(partial, model, tokenizer)
    (partial / "warm_start.json").write_text(json.dumps(log, indent=2))
    partial.rename(warm)  # whole or absent


def check_same_study(cfg: StudyConfig, path: Path) -> None:
    """Record the settings a study folder's stages depend on, or refuse to resume one made with others
    (its finished stages would be reused as they are). Only `evals` (and where the recipe lies) may change
    between runs."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("out_dir", "evals", "recipe")}
    check_same_settings(settings, path, "a study")


def run_study(cfg: StudyConfig) -> dict[str, Any]:
    """Run (or resume) every stage; return the summary that is also written to summary.json."""
    from corag.data.corpus import Corpus
    from corag.data.jsonl import write_jsonl
    from corag.lm import load_lm
    from corag.retrieval import load_retriever
    from corag.sampling import SamplingConfig, run_sampling
    from corag.toy.world import generate_world

    if not cfg.warm_only:  # fine-tuning reads both; a missing one fails before any stage
        for name in ("recipe", "sft_config"):
            if not Path(getattr(cfg, name)).is_file():
                raise InputError(
                    f"not found from {Path.cwd()}",
                    file=getattr(cfg, name),
                    field=name,
                )
    out = Path(cfg.out_dir)
    check_output(out, "--out_dir", marks=("study.json",))
    out.mkdir(parents=True, exist_ok=True)
    check_same_study(cfg, out / "study.json")
    timings: dict[str, float] = {}
    dtype = compute_dtype(cfg.dtype)
    world = generate_world(
        seed=cfg.seed,
        num_entities=cfg.num_entities,
        num_distractors=cfg.num_distractors,
        train_per_hop=cfg.train_per_hop,
        test_per_hop=cfg.test_per_hop,
    )
    stage("world", out / "world" / "test.jsonl", timings, lambda: world.write(out / "world"))

    warm = Path(cfg.warm_dir) if cfg.warm_dir else out / "models" / "warm"
    stage("warm-start", warm / "config.json", timings, lambda: warm_start(cfg, warm))
    if cfg.warm_only:
        return {"config": asdict(cfg), "timings_s": timings}

    index = out / "index"

    def build_index() -> None:
        from corag.retrieval.dense import Encoder
        from corag.retrieval.index import build_bm25, build_dense

        world_corpus = Corpus.load(out / "world" / "corpus.jsonl")
        if cfg.retriever == "bm25":
            build_bm25(world_corpus, index)
        else:
            build_dense(world_corpus, index, Encoder.from_preset("minilm"))

    stage("index", index / "manifest.json", timings, build_index)
    corpus = Corpus.load(out / "world" / "corpus.jsonl")
    retriever = load_retriever(index)

    chains = out / "chains.jsonl"

    def sample() -> None:
        config = SamplingConfig(num_chains=cfg.num_chains, max_length=cfg.max_length, seed=cfg.seed)
        partial = out / "chains.partial.jsonl"
        summary = run_sampling(
            world.train[: cfg.sample_questions],
            corpus,
            load_lm(warm, dtype=dtype),
            retriever,
            config,
            partial,
        )
        (out / "sampling_summary.json").write_text(json.dumps(summary, indent=2))
        partial.rename(chains)

    stage("sample", chains, timings, sample)

    corag_dir = out / "models" / "corag"
    bf16 = ["--bf16", str(dtype == "bfloat16").lower()]  # two words: the recipe looks for "--bf16"
    corag_extra = [f"--seed={cfg.seed}", *bf16]
    corag_extra += [f"--num_train_epochs={cfg.sft_epochs}"] if cfg.sft_epochs is not None else []
    corag_extra += [f"--min_score={cfg.min_score}"] if cfg.min_score is not None else []
    data = {"corpus": str(out / "world" / "corpus.jsonl"), "index": str(index)}
    stage(
        "fine-tune",
        corag_dir / "config.json",
        timings,
        lambda: run_recipe(
            cfg.recipe, cfg.sft_config, warm, corag_dir, {**data, "chains": str(chains)}, corag_extra
        ),
    )

    single_dir = out / "models" / "single_step"

    def single_step() -> None:
        examples = out / "single_step_examples.jsonl"
        write_jsonl(examples, single_step_examples(world.train[: cfg.sample_questions], corpus, retriever))
        steps = json.loads((corag_dir / "trainer_state.json").read_text())["global_step"]
        extra = [f"--seed={cfg.seed}", f"--max_steps={steps}", *bf16]
        run_recipe(cfg.recipe, cfg.sft_config, warm, single_dir, {"examples": str(examples)}, extra)

    stage("single-step baseline", single_dir / "config.json", timings, single_step)

    diagnosis = out / "call_accuracy.json"
    validation = balanced_by_hops(world.train[cfg.sample_questions :], cfg.diagnose_questions)

    def diagnose() -> None:
        models = {"warm": warm, "corag": corag_dir}
        scores = {name: call_accuracy(path, validation, corpus, retriever) for name, path in models.items()}
        diagnosis.write_text(json.dumps(scores, indent=2))

    if validation:
        stage("diagnose", diagnosis, timings, diagnose)

    results = evaluate_all(
        cfg,
        out,
        {"warm": warm, "corag": corag_dir, "single_step": single_dir},
        world,
        corpus,
        retriever,
        timings,
    )
    summary = {"config": asdict(cfg), "dtype": dtype, "timings_s": timings, "results": results}
    if diagnosis.exists():
        summary["call_accuracy"] = json.loads(diagnosis.read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def single_step_examples(examples: list, corpus: Any, retriever: Any) -> list[dict[str, Any]]:
    """The baseline's training data: call C with the question's top-20 documents and no chain."""
    from corag.prompts import FINAL_NUM_DOCS, final_answer_messages, task_description

    hits = retriever.search([e.query for e in examples], FINAL_NUM_DOCS)
    out = []
    for example, found in zip(examples, hits, strict=True):
        passages = corpus.get_many([h.doc_id for h in found])
        messages = final_answer_messages(example.query, [], task_description(example.task), passages)
        out.append(
            {
                "id": f"{example.id}-single",
                "task": "final",
                "prompt": messages,
                "completion": [{"role": "assistant", "content": example.answers[0]}],
            }
        )
    return out


def call_accuracy(model_dir: Path, questions: list, corpus: Any, retriever: Any) -> dict[str, dict]:
    """Each call of a model scored alone on gold inputs, by hop count (teacher-forced exact match).

    Call A gets the gold steps before it (`subquery_first`, `subquery_later`); call B a gold sub-query
    over the passages the retriever returns for it (`subanswer`; `gold_passage_top1`: how often the
    gold passage came first); call C the gold chain and the question's top passages (`final`).
    `chain_product` multiplies a question's calls: what greedy decoding would score if they failed
    independently. It shows which call limits the chains.
    """
    from statistics import mean

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corag import prompts
    from corag.toy.warmstart import example, teacher_forced_correct

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def correct(task: str, messages: list, target: str) -> bool:
        return teacher_forced_correct(model, tokenizer, example(task, "", messages, target))

    steps = [(q, i, step) for q in questions for i, step in enumerate(q.decomposition)]
    step_hits = retriever.search([step.subquery for _, _, step in steps], prompts.SUBANSWER_NUM_DOCS)
    final_hits = retriever.search([q.query for q in questions], prompts.FINAL_NUM_DOCS)
    scores: dict[int, dict[str, list[bool]]] = {}
    for (q, i, step), hits in zip(steps, step_hits, strict=True):
        by_key = scores.setdefault(int(q.meta["hops"]), {})
        messages = prompts.subquery_messages(q.query, q.decomposition[:i], prompts.task_description(q.task))
        key = "subquery_first" if i == 0 else "subquery_later"
        by_key.setdefault(key, []).append(correct("subquery", messages, step.subquery))
        doc_ids = [hit.doc_id for hit in hits]
        by_key.setdefault("gold_passage_top1", []).append(doc_ids[0] == step.doc_ids[0])
        messages = prompts.subanswer_messages(step.subquery, corpus.get_many(doc_ids))
        by_key.setdefault("subanswer", []).append(correct("subanswer", messages, step.subanswer))
    for q, hits in zip(questions, final_hits, strict=True):
        passages = corpus.get_many([hit.doc_id for hit in hits])
        messages = prompts.final_answer_messages(
            q.query, q.decomposition, prompts.task_description(q.task), passages
        )
        scores[int(q.meta["hops"])].setdefault("final", []).append(correct("final", messages, q.answers[0]))
    out = {}
    for hops, by_key in sorted(scores.items()):
        acc = {key: round(float(mean(values)), 3) for key, values in sorted(by_key.items())}
        later = acc.get("subquery_later", 1.0) ** (hops - 1)
        product = acc["subquery_first"] * later * acc["subanswer"] ** hops * acc["final"]
        out[f"{hops}hop"] = {**acc, "chain_product": round(product, 4)}
    return out


def balanced_by_hops(examples: list, n: int) -> list:
    """The first `n` questions taking each hop count in turn (2, 3, 4, 2, 3, 4, ...)."""
    groups: dict[int, list] = {}
    for example in examples:
        groups.setdefault(int(example.meta.get("hops", 0)), []).append(example)
    out: list = []
    queues = [list(g) for _, g in sorted(groups.items())]
    while len(out) < n and any(queues):
        for queue in queues:
            if queue and len(out) < n:
                out.append(queue.pop(0))
    return out


def judge_headroom(examples: list, records: list[dict]) -> dict[str, dict[str, Any]]:
    """How well best-of-N's penalty picks among its chains, by hop count, against two bounds.

    A chain counts as right when its last sub-answer is a gold answer. Per hop count, the questions
    whose chain is right: `greedy` (the first chain), `any` (some chain: what a perfect judge would
    keep), `penalty` (the chain best-of-N kept) and `link_check`, a judge that reads only the question
    and the chains' text: it keeps the greedy chain unless that one breaks a link (a sub-query about
    another relation than the question's next, or another entity than the sub-answer before) and
    another chain keeps every link. `right_first` is the share of a question's (right, wrong) chain
    pairs that the penalty ranks right first, ties counting half, over `pairs` pairs.
    """
    from corag.metrics import exact_match
    from corag.toy.world import question

    def right(chain: list[dict], answers: tuple[str, ...]) -> bool:
        return bool(chain) and any(exact_match(chain[-1]["subanswer"], a) for a in answers)

    def linked(chain: list[dict], relations: list[str], subject: str) -> bool:
        for relation, step in zip(relations, chain, strict=False):
            if step["subquery"] != question([relation], subject):
                return False
            subject = step["subanswer"]
        return len(chain) == len(relations)

    out: dict[str, dict[str, Any]] = {}
    wins: dict[str, float] = {}  # per hop count: (right, wrong) pairs ranked right first, ties half
    for example, record in zip(examples, records, strict=True):
        chains, penalties = record["chains"], record["penalties"]
        ok = [right(c, example.answers) for c in chains]
        links = [linked(c, example.meta["relations"], example.supporting_titles[0]) for c in chains]
        pick = 0 if links[0] else next((i for i, kept in enumerate(links) if kept), 0)
        hops = str(example.meta["hops"])
        by = out.setdefault(hops, dict.fromkeys((*JUDGE_COUNTS, "pairs"), 0))
        by["questions"] += 1
        by["greedy"] += ok[0]
        by["any"] += any(ok)
        by["penalty"] += ok[record["best_chain"]]
        by["link_check"] += ok[pick]
        scored = [p for p, kept in zip(penalties, ok, strict=True) if kept and p is not None]
        for wrong in (p for p, kept in zip(penalties, ok, strict=True) if not kept and p is not None):
            by["pairs"] += len(scored)
            wins[hops] = wins.get(hops, 0.0) + sum((p < wrong) + 0.5 * (p == wrong) for p in scored)
    for hops, by in out.items():
        by["right_first"] = round(wins[hops] / by["pairs"], 3) if by["pairs"] else None
    return out


def evaluate_all(
    cfg: StudyConfig,
    out: Path,
    models: dict[str, Path],
    world: Any,
    corpus: Any,
    retriever: Any,
    timings: dict,
) -> dict[str, Any]:
    """Every evaluation of the study on the held-out questions; writes results.md/.csv and scaling.png."""
    from corag.evaluation import parse_runs, run_method, score_records, write_results
    from corag.lm import load_lm
    from corag.methods.demos import demos_from_examples

    tested = [e for e in world.test if int(e.meta["hops"]) in cfg.test_hops]
    examples = balanced_by_hops(tested, cfg.test_questions)
    # IRCoT's demonstrations: gold chains of training questions (never test questions).
    demos = demos_from_examples(
        world.train, corpus, n=cfg.ircot_demonstrations, retriever=retriever, seed=cfg.seed
    )
    lms: dict[str, Any] = {}
    results: dict[str, Any] = {}
    start = time.perf_counter()
    for item in cfg.evals:
        label, _, rest = item.partition("=")
        model, _, spec = rest.partition("@")
        (run,) = parse_runs([spec])
        if model not in lms:  # each model loaded once, however many runs use it
            lms[model] = load_lm(models[model], dtype=compute_dtype(cfg.dtype))
        lm = lms[model]
        path = out / "eval" / label / "predictions.jsonl"
        extra = {"demonstrations": demos} if run.method in ("ircot", "one_step", "no_retrieval") else {}
        records = run_method(
            run,
            examples,
            lm,
            retriever,
            corpus,
            path,
            budget=cfg.budget,
            max_active=cfg.max_active,
            extra_kwargs=extra,
        )
        results[label] = {"model": model, "spec": run.name, **score_records(examples, records, "toy")}
        if run.method == "best_of_n":  # how well its judge picked
            results[label]["judge"] = judge_headroom(examples, records)
        (path.parent / "metrics.json").write_text(json.dumps(results[label], indent=2))
    timings["evaluate"] = round(time.perf_counter() - start, 1)
    paths = write_results(results, out / "eval")
    print(paths["table"].read_text())
    return results
