"""Beyond one round of rejection sampling, on the toy world from the shipped warm model.

For each seed (a target world of the quickstart's sizes, also the sampling and fine-tuning seed):
1. **SFT alone**: the quickstart's study (corag/toy/study.py): world, MiniLM index, rejection sampling with
   the warm model (300 training questions, 4 chains, L <= 3), SFT (configs/sft/toy.yaml).
2. **+1 round of rejection sampling**: the same questions sampled again by the SFT model, SFT again from
   it on the new chains (the round's wall time is measured).
3. **GRPO of the same time**: recipes/grpo.py from the SFT model (configs/grpo/toy.yaml) on the same
   training questions, stopped after the step that passes the round's time; then **GRPO of four times it**,
   and runs **with a token cost** (reward F1 - 0.1 or - 0.02 per 1,000 metered tokens; advantages scaled by
   the group's spread as in the toy config, or only centred). Time is
   counted as CPU seconds over torch's threads (`--time_limit_clock cpu`; the round's sampling and its
   SFT subprocess counted alike): the wall time on an idle machine, so that other load on a shared
   machine shortens neither side.
Each model answers the same held-out questions (50 2-hop, 50 3-hop) with greedy L=3, and again with
greedy L=3 ending each chain where the model's own stop decision says so (`stop_bias=0`: the depth a policy
trained with the stop decision chooses); the table gives EM by hops and tokens per question, and for each GRPO run its steps, training reward in the first and last tenth
of steps, the share of groups whose chains all scored alike (before and after the replacements of
dynamic sampling: `zero_spread`, `unfilled`), and its stop rate.

    python benchmarks/rl.py [--seeds 0 1 2] [--out runs/bench-rl] [--runs grpo grpo4 grpo_cost ...]

Stages already done in --out are reused. Writes em_tokens.png (EM against tokens per question) to --out.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVAL = "greedy:L=3"
STOP = "greedy:L=3:stop_bias=0"  # the same, each chain ending where its stop decision (Yes likelier than No) says


# GRPO runs from the SFT model: times the round's compute, the token cost (reward points per 1,000
# metered tokens taken off F1), and the advantage: scaled by the group's spread, or only centred.
RUNS = {
    "grpo": (1, 0.0, "group"), "grpo4": (4, 0.0, "group"),
    "grpo_cost": (1, 0.1, "group"), "grpo_lowcost": (1, 0.02, "group"), "grpo4_lowcost": (4, 0.02, "group"),
    "grpo_lowcost_centred": (1, 0.02, "none"), "grpo4_lowcost_centred": (4, 0.02, "none"),
}  # fmt: skip


def run_seed(seed: int, out: Path, runs: list[str]) -> dict:
    from corag.config import load_yaml
    from corag.data.corpus import Corpus
    from corag.iterate import run_recipe
    from corag.lm import load_lm
    from corag.recipes.grpo import compute_seconds
    from corag.retrieval import load_retriever
    from corag.sampling import SamplingConfig, run_sampling
    from corag.toy.quickstart import CONFIG, WARM
    from corag.toy.study import StudyConfig, compute_dtype, evaluate_all, run_study
    from corag.toy.world import generate_world

    settings = {k: v for k, v in load_yaml(CONFIG).items() if k in StudyConfig.__dataclass_fields__}
    cfg = StudyConfig(**settings)
    cfg = replace(
        cfg, seed=seed, out_dir=str(out), warm_dir=str(WARM), evals=[f"sft=corag@{EVAL}"],
        recipe=str(REPO / "recipes/sft.py"), sft_config=str(REPO / cfg.sft_config),
    )  # fmt: skip
    run_study(cfg)  # 1. SFT alone (resumes a finished study)
    world = generate_world(
        seed=cfg.seed, num_entities=cfg.num_entities, num_distractors=cfg.num_distractors,
        train_per_hop=cfg.train_per_hop, test_per_hop=cfg.test_per_hop,
    )  # fmt: skip
    corpus_file, index = out / "world" / "corpus.jsonl", out / "index"
    corpus, retriever = Corpus.load(corpus_file), load_retriever(index)
    sft, round2 = out / "models" / "corag", out / "models" / "round2"
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}

    # 2. One more round: the SFT model samples the same questions, then SFT from it on its own chains.
    if not (round2 / "config.json").exists():
        start, start_compute = time.perf_counter(), compute_seconds()
        chains, partial = out / "chains-round2.jsonl", out / "chains-round2.partial.jsonl"
        if not chains.exists():
            config = SamplingConfig(num_chains=cfg.num_chains, max_length=cfg.max_length, seed=cfg.seed)
            lm = load_lm(sft, dtype=compute_dtype(cfg.dtype))
            run_sampling(world.train[: cfg.sample_questions], corpus, lm, retriever, config, partial)
            partial.rename(chains)
        data = {"corpus": str(corpus_file), "index": str(index), "chains": str(chains)}
        run_recipe(cfg.recipe, cfg.sft_config, sft, round2, data, [f"--seed={cfg.seed}", "--bf16", "false"])
        timings["round2_s"] = round(time.perf_counter() - start, 1)
        timings["round2_compute_s"] = round(compute_seconds() - start_compute, 1)
        (out / "timings.json").write_text(json.dumps(timings))

    # 3. GRPO from the SFT model for the round's compute time or four times it, with or without a token cost.
    toy = REPO / "configs/grpo/toy.yaml"
    for name in runs:
        times, cost, scale = RUNS[name]
        config, folder = toy, out / "models" / name
        if cost:  # in a config file: a leading minus would read as a flag on the command line
            config = out / f"grpo-token-cost-{cost}-{scale}.yaml"
            config.write_text(f"base: {toy}\nreward: [f1, -{cost}*tokens]\nscale_rewards: {scale}\n")
        if (folder / "config.json").exists():
            continue
        args = [
            sys.executable, str(REPO / "recipes/grpo.py"), "--config", str(config),
            "--model_name_or_path", str(sft), "--output_dir", str(folder),
            "--questions", str(out / "world" / "train.jsonl"), "--limit", str(cfg.sample_questions),
            "--corpus", str(corpus_file), "--retriever", str(index), "--max_steps", "100000",
            "--save_strategy", "no", "--logging_steps", "1", "--seed", str(seed),
            "--time_limit_minutes", str(times * timings["round2_compute_s"] / 60), "--time_limit_clock", "cpu",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(args, check=True)
        timings[f"{name}_s"] = round(time.perf_counter() - start, 1)
        (out / "timings.json").write_text(json.dumps(timings))

    models = {"sft": sft, "round2": round2, **{name: out / "models" / name for name in runs}}
    evals = [
        f"{name}{label}={name}@{spec}" for name in models for label, spec in (("", EVAL), ("_stop", STOP))
    ]
    cfg = replace(cfg, evals=evals)
    results = evaluate_all(cfg, out, models, world, corpus, retriever, {})
    row: dict = {
        name: {
            "em_2hop": results[name]["em_by_hops"]["2"],
            "em_3hop": results[name]["em_by_hops"]["3"],
            "tokens_per_question": results[name]["tokens_per_question"],
            "stop_em_2hop": results[f"{name}_stop"]["em_by_hops"]["2"],
            "stop_em_3hop": results[f"{name}_stop"]["em_by_hops"]["3"],
            "stop_tokens_per_question": results[f"{name}_stop"]["tokens_per_question"],
        }
        for name in models
    }
    asked = load_yaml(toy)["questions_per_step"]  # one process
    for name in runs:
        history = json.loads((out / "models" / name / "trainer_state.json").read_text())["log_history"]
        steps = [r for r in history if "reward" in r]
        tenth = max(1, len(steps) // 10)
        row[name].update(
            steps=len(steps),
            reward_first_tenth=round(statistics.fmean(r["reward"] for r in steps[:tenth]), 4),
            reward_last_tenth=round(statistics.fmean(r["reward"] for r in steps[-tenth:]), 4),
            zero_spread=round(statistics.fmean(r["zero_spread"] for r in steps), 3),
            unfilled=round(statistics.fmean(unfilled(r, asked) for r in steps), 3),
            stop_rate=round(statistics.fmean(r["stop_rate"] for r in steps), 3),
            wall_s=timings[f"{name}_s"],
        )
    row["round2_wall_s"] = timings["round2_s"]
    row["round2_compute_s"] = timings["round2_compute_s"]
    return row


def unfilled(step: dict, asked: int) -> float:
    """Share of a step's questions left without a group that has spread: the groups rolled out (the step's
    and the extra questions') less those that scored alike, against the step's questions."""
    rolled = asked + step["extra_questions"]
    return max(0.0, asked - rolled * (1 - step["zero_spread"])) / asked


def plot(means: dict[str, dict], path: Path) -> None:
    """Held-out EM (mean of 2- and 3-hop) against tokens per question, each model at the fixed depth and
    at its own stop, in the mean over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in means.items():
        fixed = (row["tokens_per_question"], (row["em_2hop"] + row["em_3hop"]) / 2)
        own = (row["stop_tokens_per_question"], (row["stop_em_2hop"] + row["stop_em_3hop"]) / 2)
        (line,) = ax.plot(*zip(fixed, own, strict=True), ":", alpha=0.5)
        ax.plot(*fixed, "o", color=line.get_color(), label=f"{name} (L=3; x: own stop)")
        ax.plot(*own, "x", color=line.get_color())
    ax.set(xlabel="tokens per question", ylabel="held-out EM, mean of 2- and 3-hop")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/bench-rl")
    parser.add_argument(
        "--runs", nargs="+", choices=list(RUNS), default=list(RUNS),
        help="the GRPO runs (grpo: the round's time; 4: four times it; _cost, _lowcost: reward F1 - 0.1, "
        "- 0.02 per 1,000 tokens; _centred: advantages only centred, not scaled by the group's spread)",
    )  # fmt: skip
    args = parser.parse_args()
    seeds = {seed: run_seed(seed, Path(args.out) / f"seed{seed}", args.runs) for seed in args.seeds}
    names = dict.fromkeys(name for row in seeds.values() for name, v in row.items() if isinstance(v, dict))
    means = {}
    for name in names:  # each run's mean over the seeds
        rows = [row[name] for row in seeds.values()]
        means[name] = {k: round(statistics.fmean(r[k] for r in rows), 2) for k in rows[0]}
    plot(means, Path(args.out) / "em_tokens.png")
    for seed, row in seeds.items():
        print(f"seed {seed}: {json.dumps(row)}")
    print(json.dumps({"seeds": seeds, "mean": means}))


if __name__ == "__main__":
    main()
