"""`corag smoke`: every stage small on this node, with the configs you will run, measured against the plan.

    corag smoke                          # the shipped 8B configs on this node's GPUs (about an hour)
    corag smoke --gpus 1 --minutes 10    # one GPU, ten minutes: variants that fit one GPU
    corag smoke --small                  # the toy world on a CPU, through the same code

Stages: data (the first passages and questions), encode, serve (the index over HTTP), sample, merge,
examples, sft (K steps, saved), sft-resume (one more step from that checkpoint), grpo (2 steps),
evaluate (M questions in parts, merged), search-r1. Each runs as `corag` commands in subprocesses with a
time limit of its own (its share of `--minutes`) and a log in `<out_dir>/logs/`; one that fails is one
line, and the stages that need its output are skipped. `<out_dir>/smoke.json` and `smoke.md` hold the
table: stage, ok or the reason, wall time, rate (metered tokens a second per engine, passages a second
encoded, trained tokens a second per GPU and MFU), peak memory (per GPU as nvidia-smi reports it, the
allocator's peak, the vLLM engine's KV cache) beside the plan's figure and their ratio. `corag plan
--calibrate <out_dir>/smoke.json` then uses the measured rates. A stage the plan does not fit on the
GPUs given runs in a variant that does (LoRA for SFT; the transformers backend where vLLM is not
installed) or is skipped with the plan's reason. A model not here is initialised from its config (the
figures are throughput and memory, not accuracy).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corag.commands.plan import stage_values
from corag.config import load_yaml, parse_config
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.plan import Hardware, gpu_peak, model_shape, plan_stage, visible_gpu_memory
from corag.resources import CONFIGS
from corag.retrieval.dense import resolve_model
from corag.smoke import (
    Command,
    Stage,
    config_digest,
    encoded_rate,
    evaluated_rate,
    grpo_rate,
    memory_flags,
    run_smoke,
    sampled_rate,
    table,
    trained_rate,
    write_report,
)

# The configs of the cluster path (README), and the toy world's for --small.
FULL = {
    "sampling_config": "sampling/llama3.1-8b.yaml",
    "examples_config": "examples/llama3.1-8b.yaml",
    "sft_config": "sft/llama3.1-8b-full.yaml",
    "grpo_config": "grpo/llama3.1-8b.yaml",
    "eval_config": "eval/corag-llama3.1-8b.yaml",
    "index_model": "e5-large-v2",
}
SMALL = {
    "sampling_config": "sampling/toy.yaml",
    "sft_config": "sft/toy.yaml",
    "grpo_config": "grpo/toy.yaml",
    "eval_config": "eval/toy.yaml",
    "index_model": "minilm",
}
# Each stage's share of --minutes (on two 8-GPU nodes, an hour).
SHARES = {"weights": 0.04, "data": 0.03, "encode": 0.08, "serve": 0.06, "sample": 0.14, "merge": 0.02, "examples": 0.05,
          "sft": 0.15, "sft-resume": 0.08, "grpo": 0.15, "evaluate": 0.12, "search-r1": 0.08}  # fmt: skip
STAGE_NAMES = tuple(SHARES)


@dataclass
class SmokeConfig:
    out_dir: str = field(
        default="runs/smoke", metadata={"help": "folder of the smoke (logs, outputs, table)"}
    )
    small: bool = field(default=False, metadata={"help": "the toy world's configs and model, on a CPU"})
    gpus: int | None = field(
        default=None, metadata={"help": "GPUs to use (default: every one this node has)"}
    )
    minutes: float = field(default=60.0, metadata={"help": "time for every stage together"})
    sampling_config: str | None = field(default=None, metadata={"help": "default: the 8B (or toy) one"})
    examples_config: str | None = field(default=None, metadata={"help": "corag build-examples config"})
    sft_config: str | None = field(default=None, metadata={"help": "SFT recipe config"})
    grpo_config: str | None = field(default=None, metadata={"help": "GRPO recipe config"})
    eval_config: str | None = field(default=None, metadata={"help": "evaluation config"})
    search_r1_config: str | None = field(
        default=None, metadata={"help": "evaluation config of a Search-R1 checkpoint (default: configs/eval/"
        "search-r1*.yaml if shipped, else the evaluation config with --methods search-r1)"},
    )  # fmt: skip
    model: str | None = field(default=None, metadata={"help": "every stage's model (default: each config's)"})
    sft_model: str | None = field(default=None, metadata={"help": "the SFT stage's starting model"})
    index_model: str | None = field(
        default=None, metadata={"help": "encoder of the index (corag index --model)"}
    )
    passages: int = field(default=20_000, metadata={"help": "passages encoded (the first of the corpus)"})
    questions: int = field(default=64, metadata={"help": "questions sampled"})
    sft_steps: int = field(default=4, metadata={"help": "SFT steps before the save; resumed for one more"})
    grpo_steps: int = field(default=2, metadata={"help": "GRPO steps"})
    eval_questions: int = field(default=64, metadata={"help": "questions evaluated"})
    eval_parts: int = field(default=2, metadata={"help": "parts the evaluation is split into, then merged"})
    search_r1_questions: int = field(default=8, metadata={"help": "questions answered by Search-R1"})
    stages: list[str] | None = field(
        default=None, metadata={"help": f"only these of {', '.join(STAGE_NAMES)}"}
    )
    overwrite: bool = field(default=False, metadata={"help": "start the smoke's folder afresh"})


def resolve(args: SmokeConfig) -> SmokeConfig:
    """The defaults --small changes: the toy world's configs and model, and fewer questions and steps."""
    defaults = SMALL if args.small else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value if key == "index_model" else str(CONFIGS / value))
    if args.search_r1_config is None and not args.small:
        shipped = sorted(CONFIGS.glob("eval/search-r1*.yaml"))
        args.search_r1_config = str(shipped[0]) if shipped else None
    if args.small:
        from corag.toy.quickstart import WARM

        args.model = args.model or str(WARM)
        args.questions, args.eval_questions = min(args.questions, 8), min(args.eval_questions, 4)
        args.search_r1_questions, args.sft_steps = min(args.search_r1_questions, 2), min(args.sft_steps, 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = resolve(parse_config(SmokeConfig, argv, __doc__.splitlines()[0]))
    unknown = sorted(set(args.stages or []) - set(STAGE_NAMES))
    if unknown:
        raise InputError(
            f"unknown stage(s) {unknown}; choose from {', '.join(STAGE_NAMES)}", field="--stages"
        )
    devices = visible_gpu_memory()
    if not args.small and not devices:
        raise InputError(
            "no GPU visible on this node (CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS, nvidia-smi): the smoke measures "
            "GPUs; run it in a GPU job, or `corag smoke --small` for the toy world on a CPU",
            field="--gpus",
        )
    gpus = 0 if args.small else (args.gpus or len(devices))
    if gpus > len(devices) and not args.small:
        raise InputError(f"--gpus {gpus}, but this node shows {len(devices)} GPU(s)", field="--gpus")
    hw = Hardware(1, gpus, min(devices[:gpus]) if gpus else 0.0)
    smoke = Smoke(args, hw)  # every config read (and refused) before anything is written
    out = Path(args.out_dir)
    check_output(out, "--out_dir", marks=("smoke.json", "logs"))
    if args.overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s for s in smoke.stages() if not args.stages or s.name in args.stages]
    results = run_smoke(stages, out, args.minutes)
    meta = smoke.meta()
    json_path, md_path = write_report(out, results, meta)
    print(table(results, gpu=bool(gpus)))
    if flag := memory_flags([asdict(r) | {"ratio": r.ratio} for r in results]):
        print(flag)
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "failed", "skipped")}
    print(
        f"smoke: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped; {json_path}, {md_path}"
    )
    return 1 if counts["failed"] else 0


class Smoke:
    """The smoke's stages from its configs: each config read as its command reads it (refused in one
    line before anything runs), the variant that fits the GPUs chosen, and the plan's figure of each."""

    def __init__(self, args: SmokeConfig, hw: Hardware) -> None:
        self.args, self.hw = args, hw
        self.out = Path(args.out_dir).resolve()
        self.vllm = importlib.util.find_spec("vllm") is not None
        self.values: dict[str, dict[str, Any]] = {}
        for stage, key in (("sample", "sampling_config"), ("sft", "sft_config"), ("grpo", "grpo_config"),
                           ("evaluate", "eval_config")):  # fmt: skip
            path = getattr(args, key)
            if not Path(path).is_file():
                raise InputError("no such config", file=path, field=f"--{key}")
            self.values[stage] = stage_values(stage, path, None)
        for key in ("examples_config", "search_r1_config"):
            if getattr(args, key) is not None:
                load_yaml(getattr(args, key))  # a config the smoke cannot read: refused now, one line
        self.port = _free_port()
        # models whose weights are not here (no folder, not in the cache): random ones from their config
        self.random: dict[str, str] = {}
        self.lora_sft = False
        if hw.gpus:
            names = [self._configured(s) for s in ("sample", "sft", "evaluate")] + [args.sft_model or ""]
            names.append(self.search_r1_model())
            for name in dict.fromkeys(n for n in names if n and not weights_here(n)):
                self.random[name] = self.path("models", name.replace("/", "--"))
                model_shape(name)  # a model of unknown size cannot be initialised: refused now, one line
            encoder = resolve_model(args.index_model)[0]
            if not weights_here(encoder):
                if encoder not in ENCODERS:
                    raise InputError(
                        "not here, and of no known shape to initialise", file=encoder, field="--index_model"
                    )
                self.random[encoder] = self.path("models", Path(encoder).name)  # e5-*: E5's prefixes kept
                args.index_model = self.random[encoder]

    def _configured(self, stage: str) -> str:
        key = "model_name_or_path" if stage in ("sft", "grpo") else "model"
        return self.args.model or str(self.values[stage].get(key))

    def model(self, stage: str) -> str:
        """The stage's model: --model, else its config's; random weights of its shape when not here."""
        name = self._configured(stage)
        return self.random.get(name, name)

    def search_r1_model(self) -> str:
        """The Search-R1 stage's model: --model, else its config's (a Search-R1 checkpoint)."""
        config = self.args.search_r1_config or self.args.eval_config
        return self.args.model or str(load_yaml(config).get("model"))

    def _weights_stage(self) -> Stage:
        """Random weights from each missing model's config (the plan's shape), with a toy tokenizer."""

        def build() -> None:
            for name, folder in self.random.items():
                if not (Path(folder) / "config.json").is_file():
                    (random_encoder if name in ENCODERS else random_checkpoint)(name, Path(folder))

        note = f"random weights of {', '.join(self.random)}: not here" if self.random else "every model here"
        return Stage("weights", func=build, note=note)

    # paths of the smoke's folder
    def path(self, *parts: str) -> str:
        return str(self.out.joinpath(*parts))

    def stages(self) -> list[Stage]:
        a, out = self.args, self.out
        corpus, questions, heldout = self.path("data", "corpus.jsonl"), self.path("data", "questions.jsonl"), \
            self.path("data", "heldout.jsonl")  # fmt: skip
        url = f"http://127.0.0.1:{self.port}"
        engine = self._engine_flags()
        sampling = [*(["--backend", "hf", "--executor", "stepped"] if engine else [])]
        stages = [
            self._weights_stage(),
            self._data_stage(corpus, questions, heldout),
            Stage("encode", [Command(["index", corpus, "--out", self.path("index"), "--model", a.index_model])],
                  needs=("data",), measure=encoded_rate(out / "index", out / "logs" / "encode.log")),
            Stage("serve", [Command(["serve-retriever", self.path("index"), "--port", str(self.port)],
                                    background=True, ready=lambda: _healthy(url))], needs=("encode",)),
            Stage("sample", [Command(["sample", "--config", a.sampling_config, "--model", self.model("sample"),
                                      "--questions", questions, "--corpus", corpus, "--retriever", url,
                                      "--out_dir", self.path("chains"), "--num_shards", "1", "--shard", "0",
                                      "--block_size", "16", *sampling])],
                  needs=("weights", "serve"), measure=sampled_rate(out / "chains" / "chains-*.jsonl", out / "logs" /
                                                          "sample.log", 1), note=engine),
            Stage("merge", [Command(["merge", "--questions", questions, "--out", self.path("chains.jsonl"),
                                     self.path("chains", "chains-00000-of-00001.jsonl")])], needs=("sample",)),
            Stage("examples", [Command(["build-examples", *(["--config", a.examples_config] if a.examples_config
                                        else []), "--chains", self.path("chains.jsonl"), "--corpus", corpus,
                                        "--tokenizer", self.model("sft"), "--index", self.path("index"),
                                        "--dataset", self.path("examples")])], needs=("merge",)),
            *self._sft_stages(),
            self._grpo_stage(questions, corpus, url),
            self._eval_stage(heldout, corpus, url),
            self._search_r1_stage(heldout, corpus, url),
        ]  # fmt: skip
        for stage in stages:
            stage.share = SHARES[stage.name]
        return stages

    def _data_stage(self, corpus: str, questions: str, heldout: str) -> Stage:
        """The first passages of the corpus and the first questions, in the smoke's folder (on --small,
        of a toy world written first)."""
        a = self.args
        world = self.path("world")
        commands = []
        if a.small:
            commands = [Command(["toyworld", "--out", world, "--seed", "0", "--num_entities", "40",
                                 "--num_distractors", "10", "--train_per_hop", "4", "--test_per_hop", "2"])]  # fmt: skip
            sources = (f"{world}/corpus.jsonl", f"{world}/train.jsonl", f"{world}/test.jsonl")
        else:
            sources = (str(self.values["sample"].get("corpus")), str(self.values["sample"].get("questions")),
                       str(self.values["evaluate"].get("data")))  # fmt: skip

        def head() -> None:
            from corag.data.corpus import Corpus
            from corag.data.jsonl import write_jsonl

            store = Corpus.load(sources[0])
            n = min(a.passages, len(store))
            write_jsonl(corpus, ({"id": p.id, "title": p.title, "contents": p.contents}
                                 for p in (store.passage(i) for i in range(n))))  # fmt: skip
            for source, target, count in ((sources[1], questions, a.questions), (sources[2], heldout,
                                          max(a.eval_questions, a.search_r1_questions))):  # fmt: skip
                with open(source) as f, open(target, "w") as g:
                    for _, line in zip(range(count), f, strict=False):
                        g.write(line)

        return Stage("data", commands, func=head)

    def _engine_flags(self) -> str:
        """Where vLLM is not installed, the transformers backend (the note in the table)."""
        backend = str(self.values["sample"].get("backend", "hf"))
        return (
            "" if self.vllm or not backend.startswith("vllm") else "transformers backend: vLLM not installed"
        )

    def _plan(self, stage: str, values: dict[str, Any]) -> tuple[float | None, str | None]:
        """The plan's fullest GPU (or, on a CPU, host memory) for `values` on the smoke's hardware, or the
        plan's reason it does not fit."""
        try:
            plan = plan_stage(stage, values, self.hw)
        except InputError:  # no plan (a model of unknown size): the stage runs and speaks for itself
            return None, None
        try:
            plan.check()
        except InputError as error:
            return None, " ".join(str(error).split())
        if self.hw.gpus:
            return max(sum(i.size for i in items) for items in plan.gpus), None
        return sum(i.size for items in plan.host.values() for i in items), None

    def _variant(self, stage: str, values: dict[str, Any]) -> tuple[list[str], str, float | None, str | None]:
        """(flags, note, planned memory, reason to skip) of a training stage: as configured where its plan
        fits the smoke's GPUs, else with LoRA (rank 16 on every linear layer, merged at the end) where that
        fits, else skipped with the plan's reason."""
        planned, reason = self._plan(stage, values)
        if reason is None or not self.hw.gpus or values.get("use_peft"):
            return [], "", planned, reason
        lora = {"use_peft": True, "lora_r": 16, "lora_target_modules": "all-linear"}
        lora_planned, lora_reason = self._plan(stage, {**values, **lora})
        if lora_reason is not None:
            return [], "", planned, reason
        flags = [
            "--use_peft",
            "true",
            "--lora_r",
            "16",
            "--lora_alpha",
            "32",
            "--lora_target_modules",
            "all-linear",
        ]
        flags += ["--merge_lora", "true"] if stage == "sft" else []
        return flags, f"LoRA r=16: full fine-tuning does not fit {self.hw.gpus} GPU(s)", lora_planned, None

    def _sft_stages(self) -> list[Stage]:
        a = self.args
        start = self.random.get(a.sft_model, a.sft_model) if a.sft_model else self.model("sft")
        values = {**self.values["sft"], "model_name_or_path": start}
        flags, note, planned, reason = self._variant("sft", values)
        self.lora_sft = bool(flags)
        gpus = max(self.hw.gpus, 1)
        base = ["train", "sft", "--config", a.sft_config, "--model_name_or_path", values["model_name_or_path"],
                "--dataset", self.path("examples"), "--output_dir", self.path("sft"), "--save_strategy", "steps",
                "--save_steps", str(a.sft_steps), "--logging_steps", "1", "--report_to", "none",
                "--effective_batch_size", str(int(values.get("per_device_train_batch_size", 1)) * gpus), *flags]  # fmt: skip
        lora = bool(flags or values.get("use_peft"))
        per_token = (4 if lora else 6) + (2 if values.get("activation_checkpointing") else 0)
        peak = gpu_peak(self.hw)
        flops = per_token * _params(values["model_name_or_path"])
        measure = trained_rate(self.out / "sft", gpus, flops, peak[1] if peak and flops else None)
        return [
            Stage("sft", [Command([*base, "--max_steps", str(a.sft_steps)])], needs=("weights", "examples"),
                  measure=measure, planned=planned, skip=reason, note=note),
            Stage("sft-resume", [Command([*base, "--max_steps", str(a.sft_steps + 1)])], needs=("sft",),
                  measure=resumed(self.out / "sft", a.sft_steps + 1), planned=planned, skip=reason, note=note),
        ]  # fmt: skip

    def _grpo_stage(self, questions: str, corpus: str, url: str) -> Stage:
        a = self.args
        start = self.path("sft", "merged") if self.lora_sft else self.path("sft")
        values = {**self.values["grpo"], "model_name_or_path": self.model("sft")}  # the SFT model's shape
        flags, notes = [], []
        if values.get("use_vllm") and not self.vllm:
            flags += ["--use_vllm", "false"]
            values["use_vllm"] = False
            notes.append("transformers rollouts: vLLM not installed")
        lora, note, planned, reason = self._variant("grpo", values)
        flags += lora
        notes += [note] if note else []
        gpus = max(self.hw.gpus, 1)
        args = ["train", "grpo", "--config", a.grpo_config, "--model_name_or_path", start,
                "--questions", questions, "--corpus", corpus, "--retriever", url, "--output_dir", self.path("grpo"),
                "--max_steps", str(a.grpo_steps), "--save_strategy", "steps", "--save_steps", str(a.grpo_steps),
                "--logging_steps", "1", "--report_to", "none", "--eval_questions", "none",
                "--questions_per_step", str(gpus), "--per_device_train_batch_size",
                str(int(values.get("num_generations", 8))), *flags]  # fmt: skip
        chains = gpus * int(values.get("num_generations", 8))
        return Stage("grpo", [Command(args)], needs=("sft-resume", "serve"), planned=planned, skip=reason,
                     measure=grpo_rate(self.out / "grpo", gpus, chains), note="; ".join(notes))  # fmt: skip

    def _eval_stage(self, heldout: str, corpus: str, url: str) -> Stage:
        a = self.args
        common = ["evaluate", "--config", a.eval_config, "--model", self.model("evaluate"), "--data", heldout,
                  "--limit", str(a.eval_questions), "--corpus", corpus, "--retriever", url,
                  "--out-dir", self.path("eval"), "--num-shards", str(a.eval_parts), *self._backend("evaluate")]  # fmt: skip
        commands = [Command([*common, "--shard", str(s)]) for s in range(a.eval_parts)]
        commands.append(Command([*common, "--merge"]))
        planned, reason = self._plan("evaluate", {**self.values["evaluate"], "model": self.model("evaluate")})
        return Stage("evaluate", commands, needs=("weights", "serve"), planned=planned, skip=reason,
                     measure=evaluated_rate(self.out / "eval"), note=self._engine_flags())  # fmt: skip

    def _search_r1_stage(self, heldout: str, corpus: str, url: str) -> Stage:
        a = self.args
        config = a.search_r1_config or a.eval_config
        methods = (
            [] if a.search_r1_config else ["--methods", "search-r1:max_turns=2" if a.small else "search-r1"]
        )
        model = self.search_r1_model()
        args = ["evaluate", "--config", config, "--model", self.random.get(model, model),
                "--data", heldout, "--limit", str(a.search_r1_questions), "--corpus", corpus, "--retriever", url,
                "--out-dir", self.path("search-r1"), "--rules", "search-r1", *methods, *self._backend("evaluate")]  # fmt: skip
        return Stage("search-r1", [Command(args)], needs=("weights", "serve"), measure=evaluated_rate(self.out / "search-r1"),
                     note=self._engine_flags())  # fmt: skip

    def _backend(self, stage: str) -> list[str]:
        backend = str(self.values[stage].get("backend", "hf"))
        return (
            ["--backend", "hf", "--executor", "stepped"]
            if backend.startswith("vllm") and not self.vllm
            else []
        )

    def meta(self) -> dict[str, Any]:
        """What the smoke ran: its configs (path, hash, stage, model), the device and its GPUs."""
        a = self.args
        configs = {}
        for stage, key in (("sample", "sampling_config"), ("sft", "sft_config"), ("grpo", "grpo_config"),
                           ("evaluate", "eval_config")):  # fmt: skip
            path = Path(getattr(a, key)).resolve()
            configs[stage] = {"path": str(path), "sha256": config_digest(path), "model": self.model(stage)}
        device = "cpu"
        if self.hw.gpus:
            device = _gpu_name()
        return {
            "configs": configs,
            "gpus": self.hw.gpus,
            "gpu_memory": self.hw.gpu_memory,
            "device": device,
            "small": a.small,
            "minutes": a.minutes,
            "describe": f"{'--small, ' if a.small else ''}{self.hw.describe()}, {device}; limit {a.minutes:g} min",
        }


def resumed(output_dir: Path, step: int):
    """The resumed run's check: its last checkpoint is at `step`, reached from the saved one."""

    def measure(seconds: float) -> dict[str, float]:
        state = output_dir / f"checkpoint-{step}" / "trainer_state.json"
        if not state.is_file():
            raise ValueError(f"no {state}")
        return {"global_step": float(json.loads(state.read_text())["global_step"])}

    return measure


def weights_here(name: str) -> bool:
    """A checkpoint folder here, or a hub name whose config is in the Hugging Face cache."""
    if Path(name).expanduser().exists():
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:
        return False


def random_checkpoint(name: str, folder: Path) -> Path:
    """A checkpoint of `name`'s architecture (the plan's shape of it: Llama, or Qwen3 with its norms) with
    random weights, bf16 on a GPU, and a tokenizer trained on a toy world (vocabulary ids stay below the
    model's): throughput and memory as the real model's, not its answers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    from corag.data.jsonl import atomic_folder
    from corag.toy.tinymodel import train_tokenizer
    from corag.toy.world import generate_world, tokenizer_texts

    shape = model_shape(name)
    tokenizer = train_tokenizer(tokenizer_texts(generate_world(seed=0, num_entities=160, num_distractors=40)))
    kind = Qwen3Config if shape.name.startswith("Qwen3") else LlamaConfig
    config = kind(
        vocab_size=max(shape.vocab, max(tokenizer.get_vocab().values()) + 1), hidden_size=shape.hidden,
        intermediate_size=shape.intermediate, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, tie_word_embeddings=shape.tied,
        max_position_embeddings=shape.context, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    gpu = torch.cuda.is_available()
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if gpu else torch.float32)
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return folder


# The E5 encoders' shapes (config.json on the hub): hidden size, layers, heads, MLP width (BERT, 30,522 tokens).
ENCODERS = {"intfloat/e5-large-v2": (1024, 24, 16, 4096), "intfloat/e5-base-v2": (768, 12, 12, 3072)}


def random_encoder(name: str, folder: Path) -> Path:
    """An encoder of `name`'s shape with random weights and a toy tokenizer (sentence-transformers mean-pools
    a plain BERT folder): passages a second as the real encoder's."""
    import torch
    from transformers import BertConfig, BertModel

    from corag.data.jsonl import atomic_folder
    from corag.toy.tinymodel import train_tokenizer
    from corag.toy.world import generate_world, tokenizer_texts

    hidden, layers, heads, mlp = ENCODERS[name]
    tokenizer = train_tokenizer(tokenizer_texts(generate_world(seed=0, num_entities=160, num_distractors=40)))
    config = BertConfig(vocab_size=max(30522, max(tokenizer.get_vocab().values()) + 1), hidden_size=hidden,
                        num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=mlp,
                        pad_token_id=tokenizer.pad_token_id or 0)  # fmt: skip
    torch.manual_seed(0)
    with atomic_folder(folder) as tmp:
        BertModel(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return folder


def _params(model: str) -> int:
    """The model's parameters (the plan's shape), 0 when its size is unknown (no MFU then)."""
    try:
        return model_shape(model).params
    except InputError:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _gpu_name() -> str:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "GPU"
    return out.splitlines()[0].strip() if out.strip() else "GPU"


if __name__ == "__main__":
    sys.exit(main())
