"""GRPO on chains: trl's GRPOTrainer with the project's rollout in place of its single-turn generation.

trl samples the questions (each repeated `num_generations` times, as for any GRPO run) and owns the
loss (clipped ratio, optional KL to a reference, `loss_type`, importance-sampling correction of vLLM
rollouts), the optimizer, checkpoints and logging. For the questions of a generation batch this trainer
samples `num_generations` chains each with the policy being trained, through the executor and the
retriever (corag.training.rollout), rewards them, normalises the rewards per question, replaces groups
whose chains all scored alike by other questions' groups (dynamic sampling, bounded), and returns every
sampled generation of every chain as a row: the prompt ids, the ids the sampler drew, their
log-probabilities and the chain's advantage. A row's loss falls on the sampled ids only; documents are
part of prompts, and greedy calls give no row.

Rollouts run on the process's own copy of the policy: with the transformers backend, or (`use_vllm`,
`vllm_mode: colocate`) on the vLLM engine trl colocates with each process, its weights synced from the
policy once per optimizer step. A chain's sampling seeds come from the question, the training step and its
index in the group, so a resumed run samples the chains it would have sampled.

The seam with trl. A chain is a sequence of separately prompted calls (a sub-answer's prompt is not a
continuation of the sub-query's), each its own row, and a chain's row count varies. trl's public hooks
assume one completion per prompt row (`rollout_func` returns one completion per row, rewarded and grouped
by trl) or one growing conversation (`environment_factory`, tools), so neither carries a chain. This
trainer therefore overrides two private methods, `_generate_and_score_completions` and `_prepare_inputs`,
and reads trl internals (corag.training.recipes.PRIVATE_NAMES): trl is pinned to the tested minor
version, and `check_trl` refuses, in one line, an installed trl that lacks one of them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset

from corag.chain import CorpusLike, GenerationLimits
from corag.errors import InputError
from corag.executor import Executor
from corag.lm.hf import HFLM
from corag.lm.vllm import VLLMLM
from corag.metrics import answer_scores
from corag.retrieval.base import Retriever
from corag.training.recipes import (
    INSTANCE_NAMES,
    VLLM_INSTANCE_NAMES,
    TrlVersionError,  # noqa: F401  (raised by check_trl; imported here by the recipe's callers)
    check_instance,
    check_trl,
)
from corag.training.rollout import (
    Chain,
    RolloutConfig,
    chain_rows,
    rollout,
    shuffle_advantages,
    zero_spread,
)
from corag.types import Example

logger = logging.getLogger("corag.grpo")

check_trl()

from trl import GRPOTrainer  # noqa: E402  (after the check: its message beats an ImportError)
from trl.models.utils import disable_gradient_checkpointing  # noqa: E402
from trl.trainer.utils import pad, split_tensor_dict, use_adapter  # noqa: E402

LOSS_TYPES = ("dapo",)  # trl's loss types with one normaliser for the generation batch (num_items_in_batch)
SCALES = ("group", "true", "none", "false")  # trl's scale_rewards values this trainer implements
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # trl's, all implemented


def questions_dataset(questions: Sequence[Example]) -> Dataset:
    """The training questions as trl wants them: a `prompt` column (the question) and its id."""
    return Dataset.from_list([{"prompt": q.query, "query_id": q.id} for q in questions])


def rollout_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """trl's reward slot: the chains are rewarded inside the rollout (corag.training.rewards), so this is
    never called by ChainGRPOTrainer; it only names where the reward comes from."""
    raise RuntimeError("chain rewards are computed in the rollout (corag.training.rewards)")


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
    """vLLM rollouts: trl's colocated engine, one per process, awake between rollouts."""
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
    if args.vllm_importance_sampling_correction and args.vllm_importance_sampling_mode not in IS_MODES:
        raise InputError(f"choose one of {IS_MODES}", field="vllm_importance_sampling_mode")
    if args.vllm_enable_sleep_mode:
        raise InputError(
            "the engine stays awake between rollouts; size it with vllm_gpu_memory_utilization",
            field="vllm_enable_sleep_mode",
        )


def check_trainer_settings(args: Any, env: Mapping[str, str] | None = None) -> None:
    """The GRPOConfig settings this trainer implements, refused in one line otherwise: among them those
    that would silently change what is trained (a loss normalised per micro-step, stale rows trained at
    ratio 1, ZeRO-3 ranks making different numbers of forwards). `env`: the launcher's (os.environ)."""
    env = os.environ if env is None else env
    if args.num_iterations != 1:
        raise InputError("chains are sampled for one pass over them; set 1", field="num_iterations")
    if args.loss_type not in LOSS_TYPES:
        raise InputError(
            f"{args.loss_type!r} normalises each micro-step by its own rows or tokens, and rows land in "
            f"micro-steps by length, so it re-weights them; choose one of {LOSS_TYPES} (one normaliser "
            "for the whole generation batch)",
            field="loss_type",
        )
    if args.steps_per_generation != args.gradient_accumulation_steps:
        raise InputError(
            f"{args.steps_per_generation} micro-steps a generation against gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps}: the rows of a later optimizer step would be stale and "
            "trained at ratio 1; set them equal (or give questions_per_step)",
            field="steps_per_generation",
        )
    if not args.use_vllm and zero3(args, env):
        raise InputError(
            "ZeRO-3 with rollouts on the transformers backend would deadlock (the ranks make different "
            "numbers of forwards over partitioned weights); set use_vllm: true (vllm_mode: colocate) or "
            "train with ddp or fsdp",
            field="use_vllm",
        )
    if args.use_vllm:
        check_vllm_settings(args)
    if str(args.scale_rewards).lower() not in SCALES:
        raise InputError(f"advantages are scaled per group or not at all: {SCALES}", field="scale_rewards")
    check_whole_groups(args.per_device_train_batch_size, args.steps_per_generation, args.num_generations)


def zero3(args: Any, env: Mapping[str, str]) -> bool:
    """Whether the run shards parameters with DeepSpeed ZeRO-3: as accelerate's config passes it
    (ACCELERATE_DEEPSPEED_ZERO_STAGE), or in a `deepspeed` config the trainer is given."""
    if (
        env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("true", "1")
        and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    ):
        return True
    config = args.deepspeed
    if isinstance(config, str) and os.path.isfile(config):
        config = json.loads(Path(config).read_text())
    return isinstance(config, dict) and str(config.get("zero_optimization", {}).get("stage")) == "3"


def check_stop_on_vllm(args: Any, config: RolloutConfig) -> None:
    """A sampled stop decision is drawn at temperature 1 (corag.chain.STOP_TEMPERATURE); vLLM's importance
    correction compares the sampler's log-probabilities with the trainer's at `temperature`, so with it
    on, the rollouts need temperature 1."""
    sampled_stop = config.learned_stop and "stop" in config.sampled_calls and config.max_chain_length > 1
    correction = args.use_vllm and args.vllm_importance_sampling_correction
    if correction and sampled_stop and args.temperature != 1.0:
        raise InputError(
            f"the sampled stop decision is drawn at temperature 1, and vLLM's importance correction "
            f"would compare it with the trainer's log-probabilities at {args.temperature}: set "
            "temperature: 1.0, turn vllm_importance_sampling_correction off, or decide the stop greedily "
            "(leave stop out of sampled_calls)",
            field="temperature",
        )


PER_TOKEN = (
    "completion_ids",
    "completion_mask",
    "sampling_per_token_logps",
    "old_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",
)


def trim_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """A micro-step's rows cut to their widest prompt (left-padded) and completion (right-padded)."""
    prompt = int(batch["prompt_mask"].sum(1).max())
    completion = max(1, int(batch["completion_mask"].sum(1).max()))
    cut = dict(batch)
    for key in ("prompt_ids", "prompt_mask"):
        cut[key] = batch[key][:, batch[key].size(1) - prompt :]
    for key in PER_TOKEN:
        if key in batch and batch[key].size(1) > 1:  # a sequence-level importance ratio has one column
            cut[key] = batch[key][:, :completion]
    return cut


def importance_ratio(
    policy: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str, low: float | None, high: float
) -> torch.Tensor:
    """trl's correction of rollouts sampled by another engine: exp(policy - sampler log-probabilities) per
    token, or per sequence (summed), truncated to [low, high] or zeroed outside it (`mode`, IS_MODES)."""
    diff = (policy - sampler) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    return ratio.masked_fill((ratio < (low if low is not None else -float("inf"))) | (ratio > high), 0.0)


def ratio_spread(ratio: torch.Tensor, mask: torch.Tensor, accelerator: Any = None) -> dict[str, float]:
    """Mean, min and max of the importance-sampling ratio over the batch's trained tokens (a sequence-level
    ratio: over its trained rows), over every process with `accelerator`, as trl logs them."""
    keep = (mask.sum(-1, keepdim=True) > 0) if ratio.size(-1) == 1 else mask.bool()
    values = ratio[keep.expand_as(ratio)].double()
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=ratio.device)
    stats = torch.stack(
        [values.sum(), torch.tensor(float(values.numel()), dtype=torch.float64, device=ratio.device),
         values.min() if values.numel() else inf, values.max() if values.numel() else -inf]
    )[None]  # fmt: skip
    if accelerator is not None:
        stats = accelerator.gather(stats)  # one row a process
    total, count = stats[:, 0].sum().item(), stats[:, 1].sum().item()
    if count == 0:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    return {"mean": total / count, "min": stats[:, 2].min().item(), "max": stats[:, 3].max().item()}


def row_chunks(widths: Sequence[int], bound: int) -> list[tuple[int, int]]:
    """Consecutive slices of rows (sorted by width, as row_batch sorts them) whose padded size, rows times
    the widest row, stays within `bound` tokens (a row wider than the bound goes alone)."""
    chunks, start = [], 0
    for end in range(1, len(widths) + 1):
        if end - start > 1 and (end - start) * max(widths[start:end]) > bound:
            chunks.append((start, end - 1))
            start = end - 1
    if widths:
        chunks.append((start, len(widths)))
    return chunks


def replacement_share(missing: int, pool: Sequence[str], room: int) -> tuple[list[str], list[str]]:
    """Dynamic sampling decided over every process at once: the groups still missing everywhere (one
    all-reduce of this process's count, less what it found beyond its own need) are replaced by the first of `pool` (the same order on every
    process), at most `room`, dealt out in turn, so that no process rolls out more than its share.
    Returns the questions taken over all processes and this process's own."""
    rank, world = 0, 1
    total = torch.tensor([missing])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        torch.distributed.all_reduce(total)
    taken = list(pool[: max(0, min(int(total.item()), room))])
    return taken, taken[rank::world]


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
    """GRPOTrainer whose rollouts are CoRAG chains (see the module's docstring).

    With `held_out` questions, the policy answers them every `eval_steps` (else `logging_steps`) steps
    and at the end through `held_out_method`, as `corag evaluate` decodes (corag.training.progress)."""

    def __init__(
        self,
        *,
        questions: Sequence[Example],
        corpus: CorpusLike,
        retriever: Retriever,
        rollout_config: RolloutConfig,
        limits: GenerationLimits | None = None,
        held_out: Sequence[Example] = (),
        held_out_method: str = "greedy:L=3",
        **kwargs: Any,
    ) -> None:
        from corag.training.progress import HeldOut, ProgressFiles

        rollout_config.check()
        check_trainer_settings(kwargs["args"])
        check_stop_on_vllm(kwargs["args"], rollout_config)
        held = HeldOut(held_out, held_out_method, corpus, retriever) if held_out else None
        self.questions = {q.id: q for q in questions}
        self.corpus, self.retriever, self.rollout_config = corpus, retriever, rollout_config
        self.limits = limits
        self.last_groups: list[list[Chain]] = []  # the latest step's groups, for the rollout table
        super().__init__(reward_funcs=rollout_reward, train_dataset=questions_dataset(questions), **kwargs)
        check_instance(self, INSTANCE_NAMES + (VLLM_INSTANCE_NAMES if self.use_vllm else ()))
        self.add_callback(ProgressFiles(self, held))

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

    def with_policy(self, work: Any) -> Any:
        """`work(lm)` on the policy as it is now, without gradients, the model's mode restored after."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        lm = self.policy_lm()
        try:
            with torch.no_grad():
                return work(lm)
        finally:
            model.train(was_training)

    def sample_groups(self, query_ids: Sequence[str], key: str) -> list[list[Chain]]:
        """`num_generations` chains for each question, by the policy as it is now."""
        return self.with_policy(
            lambda lm: rollout(
                Executor(lm, self.retriever),
                [self.questions[q] for q in query_ids],
                self.corpus,
                self.rollout_config,
                group_size=self.num_generations,
                temperature=self.args.temperature,
                key=key,
                scale=str(self.args.scale_rewards).lower() in ("group", "true"),
                limits=self.limits,
            )
        )

    def groups_with_spread(self, query_ids: Sequence[str]) -> tuple[list[list[Chain]], list[list[Chain]]]:
        """The batch's groups, those whose chains all scored alike replaced by groups of other training
        questions (DAPO's dynamic sampling), at most `max_extra_questions` more questions a step over
        all processes.

        Decided over every process at once (corag.training.grpo.replacement_share): each round, one
        all-reduce of the groups still missing; their replacements, drawn from the questions no process
        asked this step, dealt out over the processes. A process trains the groups it rolled out (the
        loss's normaliser is the whole batch's), so no group moves and no process waits on another's
        extra rollouts. Returns the groups to train (every replacement with spread is kept; fewer when
        the bound is hit: the rest carry no gradient anyway) and every group rolled out. The pool is shuffled by the run's seed and the
        step, so a resumed run draws the same questions."""
        step = self.state.global_step
        rolled = self.sample_groups(query_ids, key=f"step-{step}")
        kept = [g for g in rolled if not zero_spread(g)]
        asked = gather_object(list(query_ids))  # every process's questions of this step
        pool = sorted(set(self.questions) - set(asked))
        random.Random(f"{self.args.seed}/{step}").shuffle(pool)
        missing, bound, extra = len(rolled) - len(kept), self.rollout_config.max_extra_questions, 0
        while extra < bound and pool:
            taken, mine = replacement_share(missing, pool, bound - extra)
            if not taken:
                break
            pool, extra = pool[len(taken) :], extra + len(taken)
            more = self.sample_groups(mine, key=f"step-{step}/extra-{extra}") if mine else []
            rolled += more
            good = [g for g in more if not zero_spread(g)]
            kept += good
            missing -= len(good)  # below 0: this process found more than it lacked, for the others
        if missing > 0 and bound:
            logger.info(
                "step %d: %d of %d groups on this process still scored alike after %d more questions "
                "over all processes (max_extra_questions)",
                step, missing, len(query_ids), extra,
            )  # fmt: skip
        return kept, rolled

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        query_ids = list(dict.fromkeys(row["query_id"] for row in inputs))
        groups, rolled = self.groups_with_spread(query_ids)
        if self.rollout_config.shuffle_advantages:
            step, rank = self.state.global_step, self.accelerator.process_index
            shuffle_advantages(groups, random.Random(f"{self.args.seed}/{step}/{rank}/placebo"))
        rows = [row for group in groups for chain in group for row in chain_rows(chain)]
        batch = self.row_batch(rows)
        self.log_groups(groups, rolled, len(query_ids), len(rows), mode)
        self.last_groups = groups or rolled
        return batch

    # -- tensors -------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        """trl's buffering of a generation batch over `steps_per_generation` micro-steps, without its
        shuffle: rows come sorted by length (row_batch), so each micro-step holds rows of like width and
        is cut to its widest. The step's gradient is the same (each of the batch's rows is trained once,
        under one normaliser for the whole batch with loss_type dapo)."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % steps == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = [trim_padding(part) for part in split_tensor_dict(batch, steps)]
        return self._buffered_inputs[self._step % steps]

    def row_batch(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Tensors for trl's loss: prompts padded on the left, sampled ids on the right with their
        sampler log-probabilities, one advantage a row.

        Rows are sorted by length. Every process gets the same number of rows, a multiple of
        `steps_per_generation` (trl splits the batch in that many equal parts and gathers per-row metrics
        across processes), by rows that carry no loss (completion mask 0) at the start.
        """
        device = self.accelerator.device
        tokenizer = self.processing_class
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["completion_ids"]))
        most = int(self.accelerator.gather(torch.tensor([len(rows)], device=device)).max())
        steps = self.args.steps_per_generation
        blank = {"prompt_ids": (pad_id,), "completion_ids": (pad_id,), "logprobs": (0.0,), "advantage": 0.0}
        extra = max(1, -(-most // steps)) * steps - len(rows)
        rows = [blank] * extra + list(rows)
        masks = [0] * extra + [1] * (len(rows) - extra)

        def padded(key: str, value: Any, side: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            return pad([torch.tensor(r[key], device=device, dtype=dtype) for r in rows], value, side)

        batch = {
            "prompt_ids": padded("prompt_ids", pad_id, "left"),
            "prompt_mask": pad(
                [torch.ones(len(r["prompt_ids"]), dtype=torch.long, device=device) for r in rows], 0, "left"
            ),
            "completion_ids": padded("completion_ids", pad_id, "right"),
            "completion_mask": pad(
                [
                    torch.full((len(r["completion_ids"]),), m, device=device)
                    for r, m in zip(rows, masks, strict=True)
                ],
                0,
                "right",
            ),
            "sampling_per_token_logps": padded("logprobs", 0.0, "right", torch.float32),
            "advantages": torch.tensor([float(r["advantage"]) for r in rows], device=device),
        }
        batch["num_items_in_batch"] = self.accelerator.gather(batch["completion_mask"].sum()).sum()
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self.policy_logps(batch, reference=True)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            batch["old_per_token_logps"] = self.policy_logps(batch, reference=False)
            batch["importance_sampling_ratio"] = importance_ratio(
                batch["old_per_token_logps"],
                batch["sampling_per_token_logps"],
                batch["completion_mask"],
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            mode = "train" if self.model.training else "eval"
            spread = ratio_spread(
                batch["importance_sampling_ratio"], batch["completion_mask"], self.accelerator
            )
            for name, value in spread.items():
                self._metrics[mode][f"sampling/importance_sampling_ratio/{name}"].append(value)
        return batch

    def policy_logps(self, batch: Mapping[str, torch.Tensor], *, reference: bool) -> torch.Tensor:
        """Per-token log-probabilities of the sampled ids under the reference model (the KL term) or the
        policy as it is before the step (the importance-sampling correction).

        Rows go through the model in chunks of consecutive rows (sorted by length) cut to their own
        widest and holding at most `logprob_batch_tokens` tokens, as the transformers backend batches;
        every process makes the same number of forwards (ZeRO-3 gathers weights in each), its last ones
        on its shortest row if it has fewer chunks. `self.logprob_forwards` counts them."""
        prompt, completion = batch["prompt_mask"].sum(1), batch["completion_mask"].sum(1).clamp(min=1)
        keep = batch["completion_ids"].size(1)
        chunks = row_chunks((prompt + completion).tolist(), self.rollout_config.logprob_batch_tokens)
        device = batch["prompt_ids"].device
        most = int(self.accelerator.gather(torch.tensor([len(chunks)], device=device)).max())
        parts = []
        for start, end in chunks + [(0, 1)] * (most - len(chunks)):
            part = trim_padding(
                {
                    k: batch[k][start:end]
                    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
                }
            )
            logps = self.chunk_logps(part, reference)
            parts.append(torch.nn.functional.pad(logps, (0, keep - logps.size(1))))
        self.logprob_forwards = getattr(self, "logprob_forwards", 0) + most
        return torch.cat(parts[: len(chunks)])

    def chunk_logps(self, part: Mapping[str, torch.Tensor], reference: bool) -> torch.Tensor:
        """One forward over a chunk of rows: log-probabilities of its completion ids."""
        input_ids = torch.cat([part["prompt_ids"], part["completion_ids"]], dim=1)
        attention_mask = torch.cat([part["prompt_mask"], part["completion_mask"].clamp(min=1)], dim=1)
        keep, size = part["completion_ids"].size(1), input_ids.size(0)
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
        ):
            if not reference:
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, keep, batch_size=size
                )
                return logps
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

    def log_groups(
        self,
        groups: Sequence[Sequence[Chain]],
        rolled: Sequence[Sequence[Chain]],
        asked: int,
        num_rows: int,
        mode: str,
    ) -> None:
        """For trl's logs, over every chain rolled out this step: reward, answer accuracy, chain length,
        stop rate and tokens; the share of groups whose chains all scored alike and the extra questions
        drawn for them; the share of the step's questions left without a group that has spread (no
        replacement within the bound: those carry no gradient); rows trained per chain. (trl logs `entropy`: the policy's, on the sampled ids.)"""
        chains = [chain for group in rolled for chain in group]
        metrics = self._metrics[mode]
        metrics["reward"].append(statistics.fmean(c.reward for c in chains))
        metrics["reward_std"].append(statistics.fmean(statistics.pstdev(c.reward for c in g) for g in rolled))
        answers = [answer_scores(c.result.prediction, c.result.answers) for c in chains]
        metrics["answer_em"].append(statistics.fmean(a["em"] for a in answers))
        metrics["answer_f1"].append(statistics.fmean(a["f1"] for a in answers))
        metrics["chain_steps"].append(statistics.fmean(len(c.result.steps) for c in chains))
        metrics["stop_rate"].append(statistics.fmean(float(c.stopped) for c in chains))
        metrics["tokens_per_chain"].append(statistics.fmean(c.result.usage.total for c in chains))
        metrics["zero_spread"].append(statistics.fmean(float(zero_spread(g)) for g in rolled))
        metrics["extra_questions"].append(float(len(rolled) - asked))
        metrics["unfilled"].append(max(0, asked - len(groups)) / asked)
        trained = sum(len(g) for g in groups)
        metrics["rows_per_chain"].append(num_rows / trained if trained else 0.0)
