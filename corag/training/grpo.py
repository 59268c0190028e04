"""GRPO on chains: trl's GRPOTrainer with the project's rollout in place of its single-turn generation.

trl samples the questions (each repeated `num_generations` times, as for any GRPO run) and owns the
loss (clipped ratio, optional KL to a reference, `loss_type`), the optimizer, checkpoints and logging.
This trainer replaces one method, `_generate_and_score_completions`: for the questions of a generation
batch, it samples `num_generations` chains each with the policy being trained, through the executor and
the retriever (corag.training.rollout), rewards them, normalises the rewards per question, and returns
every generation of every chain as a row (prompt tokens, completion tokens, the chain's advantage).
A row's loss falls on its completion and end-of-turn tokens only; documents are part of prompts.

Rollouts run on the process's own copy of the policy: with the transformers backend, or (`use_vllm`,
`vllm_mode: colocate`) on the vLLM engine trl colocates with each process, its weights synced from the
policy once per optimizer step. Greedy calls and seeded sampling: a chain's sampling seeds come from the
question, the training step and its index in the group, so a resumed run samples the chains it would
have sampled.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad, split_tensor_dict, use_adapter

from corag.chain import CorpusLike, GenerationLimits
from corag.errors import InputError
from corag.executor import Executor
from corag.lm.hf import HFLM
from corag.lm.vllm import VLLMLM
from corag.metrics import answer_scores
from corag.retrieval.base import Retriever
from corag.training.examples import tokenize_example
from corag.training.rollout import Chain, RolloutConfig, chain_pairs, rollout
from corag.types import Example

SCALES = ("group", "true", "none", "false")  # trl's scale_rewards values this trainer implements


def questions_dataset(questions: Sequence[Example]) -> Dataset:
    """The training questions as trl wants them: a `prompt` column (the question) and its id."""
    return Dataset.from_list([{"prompt": q.query, "query_id": q.id} for q in questions])


def rollout_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """trl's reward slot: the chains are rewarded inside the rollout (chain_reward), so this is never
    called by ChainGRPOTrainer; it only names where the reward comes from."""
    raise RuntimeError("chain rewards are computed in the rollout (corag.training.rollout.chain_reward)")


def pair_tokens(
    tokenizer: Any, pair: Mapping[str, Any], chat_template_kwargs: Any = None
) -> tuple[list[int], list[int]]:
    """Prompt and completion token ids of one pair: the completion is exactly the labelled tokens of
    the SFT tokenization (the generated text and the template's end of turn)."""
    tokens = tokenize_example(tokenizer, pair["prompt"], pair["completion"], chat_template_kwargs)
    start = next(i for i, label in enumerate(tokens["labels"]) if label != -100)
    return tokens["input_ids"][:start], tokens["input_ids"][start:]


def check_whole_groups(per_device_batch: int, steps_per_generation: int, num_generations: int) -> None:
    """Each process samples whole groups: its generation batch (rows of repeated questions) holds a whole
    number of groups, or a group split over two processes would be sampled twice."""
    if (per_device_batch * steps_per_generation) % num_generations:
        raise InputError(
            f"a process's generation batch (per_device_train_batch_size {per_device_batch} x "
            f"steps_per_generation {steps_per_generation}) must hold whole groups of num_generations "
            f"{num_generations}",
            field="per_device_train_batch_size",
        )


def check_vllm_settings(args: Any) -> None:
    """vLLM rollouts: trl's colocated engine, one per process, no importance-sampling correction."""
    if args.vllm_mode != "colocate":
        raise InputError(
            "chain rollouts use trl's colocated engine (vllm_mode: colocate); a chain makes many seeded "
            "calls per question, which trl's server API (one sampling setting per call) cannot carry",
            field="vllm_mode",
        )
    if args.vllm_tensor_parallel_size != 1:
        raise InputError(
            "each process samples its own questions on its own engine; set 1",
            field="vllm_tensor_parallel_size",
        )
    if args.vllm_importance_sampling_correction:
        raise InputError(
            "completions are re-tokenized from their text, so the engine's per-token log-probabilities "
            "are not kept to correct with; set false",
            field="vllm_importance_sampling_correction",
        )
    if args.vllm_enable_sleep_mode:
        raise InputError(
            "the engine stays awake between rollouts; size it with vllm_gpu_memory_utilization",
            field="vllm_enable_sleep_mode",
        )


def check_trainer_settings(args: Any) -> None:
    """The GRPOConfig settings this trainer implements, refused in one line otherwise."""
    if args.num_iterations != 1:
        raise InputError("chains are sampled for one pass over them; set 1", field="num_iterations")
    if args.use_vllm:
        check_vllm_settings(args)
    if str(args.scale_rewards).lower() not in SCALES:
        raise InputError(f"advantages are scaled per group or not at all: {SCALES}", field="scale_rewards")
    check_whole_groups(args.per_device_train_batch_size, args.steps_per_generation, args.num_generations)


def trim_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """A micro-step's rows cut to their widest prompt (left-padded) and completion (right-padded)."""
    prompt = int(batch["prompt_mask"].sum(1).max())
    completion = max(1, int(batch["completion_mask"].sum(1).max()))
    cut = dict(batch)
    for key in ("prompt_ids", "prompt_mask"):
        cut[key] = batch[key][:, batch[key].size(1) - prompt :]
    for key in ("completion_ids", "completion_mask", "ref_per_token_logps"):
        if key in batch:
            cut[key] = batch[key][:, :completion]
    return cut


def engine_weights(generation: Any, *, tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters as trl hands them to vLLM (PEFT adapters merged, ZeRO-3 or FSDP shards
    gathered one at a time, names as vLLM's), plus the output layer of a model that ties it to the input
    embeddings: vLLM keeps its own copy, which an in-place reload leaves as it was unless given."""
    embedding = None
    for name, tensor in generation._iter_named_params():
        if tied and name.endswith("embed_tokens.weight"):
            embedding = (name.replace("model.embed_tokens", "lm_head"), tensor.detach().clone())
        yield name, tensor
    if embedding is not None:
        yield embedding


class ChainGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose rollouts are CoRAG chains (see the module's docstring)."""

    def __init__(
        self,
        *,
        questions: Sequence[Example],
        corpus: CorpusLike,
        retriever: Retriever,
        rollout_config: RolloutConfig,
        limits: GenerationLimits | None = None,
        **kwargs: Any,
    ) -> None:
        rollout_config.check()
        check_trainer_settings(kwargs["args"])
        self.questions = {q.id: q for q in questions}
        self.corpus, self.retriever, self.rollout_config = corpus, retriever, rollout_config
        self.limits = limits
        super().__init__(reward_funcs=rollout_reward, train_dataset=questions_dataset(questions), **kwargs)

    # -- rollout -------------------------------------------------------------------------------------

    def policy_lm(self) -> HFLM | VLLMLM:
        """The policy as it is now, behind the LM protocol: the colocated vLLM engine (weights synced
        once per optimizer step) or the process's own model (put in eval mode)."""
        if not self.use_vllm:
            model = self.accelerator.unwrap_model(self.model)
            return HFLM(model, self.processing_class, chat_template_kwargs=self.chat_template_kwargs)
        if self.state.global_step != self._last_loaded_step:
            self.sync_engine()
            self._last_loaded_step = self.state.global_step
        engine = self.vllm_generation.llm
        return VLLMLM.over_engine(
            engine, self.processing_class, chat_template_kwargs=self.chat_template_kwargs
        )

    def sync_engine(self) -> None:
        """The policy's weights into the colocated engine, in place: by vLLM's own reload where it has
        one (it also redoes what a platform does to loaded weights, as the CPU build repacks them), else
        by trl's per-parameter load. Every process takes part (ZeRO-3 gathers each parameter)."""
        generation = self.vllm_generation
        if importlib.util.find_spec("vllm.model_executor.model_loader.reload") is None:
            generation.sync_weights()
            return
        config = self.accelerator.unwrap_model(self.model).config
        weights = engine_weights(generation, tied=bool(getattr(config, "tie_word_embeddings", False)))
        generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        generation.llm.reset_prefix_cache()

    def sample_groups(self, query_ids: Sequence[str]) -> list[list[Chain]]:
        """`num_generations` chains for each question, by the policy as it is now."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        lm = self.policy_lm()
        try:
            with torch.no_grad():
                return rollout(
                    Executor(lm, self.retriever),
                    [self.questions[q] for q in query_ids],
                    self.corpus,
                    self.rollout_config,
                    group_size=self.num_generations,
                    temperature=self.args.temperature,
                    key=f"step-{self.state.global_step}",
                    scale=str(self.args.scale_rewards).lower() in ("group", "true"),
                    limits=self.limits,
                )
        finally:
            model.train(was_training)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        query_ids = list(dict.fromkeys(row["query_id"] for row in inputs))
        groups = self.sample_groups(query_ids)
        pairs = [pair for group in groups for chain in group for pair in chain_pairs(chain)]
        batch = self.pair_batch(pairs)
        self.log_groups(groups, len(pairs), mode)
        return batch

    # -- tensors -------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        """trl's buffering of a generation batch over `steps_per_generation` micro-steps, without its
        shuffle: rows come sorted by length (pair_batch), so each micro-step holds rows of like width and
        is cut to its widest. The step's gradient is the same (each of the batch's rows is trained once,
        under one normaliser for the whole batch with loss_type dapo)."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % steps == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = [trim_padding(part) for part in split_tensor_dict(batch, steps)]
        return self._buffered_inputs[self._step % steps]

    def pair_batch(self, pairs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Rows for trl's loss: prompts padded on the left, completions on the right, one advantage a row.

        Rows are sorted by length. Every process gets the same number of rows, a multiple of
        `steps_per_generation` (trl splits the batch in that many equal parts and gathers per-row metrics
        across processes), by rows that carry no loss (completion mask 0) at the start.
        """
        device = self.accelerator.device
        tokenizer = self.processing_class
        tokens = [pair_tokens(tokenizer, p, self.chat_template_kwargs) for p in pairs]
        advantages = [float(p["advantage"]) for p in pairs]
        order = sorted(range(len(tokens)), key=lambda i: len(tokens[i][0]) + len(tokens[i][1]))
        tokens, advantages = [tokens[i] for i in order], [advantages[i] for i in order]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        masks = [1] * len(tokens)
        most = int(self.accelerator.gather(torch.tensor([len(tokens)], device=device)).max())
        steps = self.args.steps_per_generation
        extra = max(1, -(-most // steps)) * steps - len(tokens)
        tokens = [([pad_id], [pad_id])] * extra + tokens
        advantages, masks = [0.0] * extra + advantages, [0] * extra + masks
        prompts = [torch.tensor(p, device=device) for p, _ in tokens]
        completions = [torch.tensor(c, device=device) for _, c in tokens]
        completion_mask = [
            torch.full((len(c),), m, device=device) for (_, c), m in zip(tokens, masks, strict=True)
        ]
        batch = {
            "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
            "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
            "completion_ids": pad(completions, padding_value=pad_id, padding_side="right"),
            "completion_mask": pad(completion_mask, padding_value=0, padding_side="right"),
            "advantages": torch.tensor(advantages, device=device),
        }
        batch["num_items_in_batch"] = self.accelerator.gather(batch["completion_mask"].sum()).sum()
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self.reference_logps(batch)
        return batch

    def reference_logps(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token log-probabilities of the completions under the reference model (the KL term)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"].clamp(min=1)], dim=1)
        keep = batch["completion_ids"].size(1)
        size = self.args.per_device_train_batch_size
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
        ):
            if self.ref_model is not None:
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention_mask, keep, batch_size=size
                )
                return logps
            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, keep, batch_size=size
                )
            return logps

    # -- logging -------------------------------------------------------------------------------------

    def log_groups(self, groups: Sequence[Sequence[Chain]], num_pairs: int, mode: str) -> None:
        """Reward mean and spread, answer accuracy, chain length and tokens per chain, for trl's logs."""
        chains = [chain for group in groups for chain in group]
        metrics = self._metrics[mode]
        rewards = [c.reward for c in chains]
        metrics["reward"].append(statistics.fmean(rewards))
        metrics["reward_std"].append(statistics.fmean(statistics.pstdev(c.reward for c in g) for g in groups))
        answers = [answer_scores(c.result.prediction, c.result.answers) for c in chains]
        metrics["answer_em"].append(statistics.fmean(a["em"] for a in answers))
        metrics["answer_f1"].append(statistics.fmean(a["f1"] for a in answers))
        metrics["chain_steps"].append(statistics.fmean(len(c.result.steps) for c in chains))
        metrics["tokens_per_chain"].append(statistics.fmean(c.result.usage.total for c in chains))
        metrics["pairs_per_chain"].append(num_pairs / len(chains))
