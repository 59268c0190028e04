"""Search-R1: one conversation in which the model reasons, searches and answers in tags.

The released protocol (PeterGriffinJin/Search-R1, search_r1/llm_agent/generation.py at 8b416d2,
`run_llm_loop`, `execute_predictions`, `postprocess_predictions`, `_postprocess_responses`; the
strings are in corag.prompts), for any chat model:

- The instruction and the question are the user turn. The model's turns and the blocks inserted after
  them form ONE assistant turn that each call continues, so the model sees `template(user) + generated
  text + inserted blocks`, as the release's rolling prompt is. Its token ids are built as the release
  builds them (`_postprocess_responses`, `_process_next_obs`, `_update_rolling_state`): the templated
  prompt, each turn's text and each inserted block tokenized on its own, the ids joined (on every
  backend: corag.lm.render.PIECES). Tokenizing the joined text instead can merge a piece's last
  characters with the next one's first: Qwen2's pre-tokenizer keeps `>` with the newlines after it, so
  `</search>` + `\n\n<information>` would hold a `>\n\n` token the checkpoint never saw. Every turn
  re-sends the whole conversation and is charged for it.
- A turn ends at `</search>` or at the end of the model's turn; a turn without `</search>` is cut after
  its first `</answer>`. Its action is the first complete `<search>...</search>` or
  `<answer>...</answer>` block (the query or answer stripped): an answer ends the trajectory; a search
  inserts `\\n\\n<information>{top-k documents}</information>\\n\\n`; anything else (no tags, a tag left
  open) is an invalid action and inserts the release's "My previous action is invalid..." message.
- At most `max_turns` such turns; then one last turn in which a search is not carried out.
- The prediction is the last `<answer>...</answer>` the model wrote in one turn, stripped (qa_em.py's
  `extract_solution`). The release reads it from the whole sequence, prompt and inserted blocks too, and
  those hold example answers ("Beijing" in the instruction, "and" in the invalid-action message), so a
  trajectory without an answer of the model's is scored there as one of those; here it predicts "".
- Defaults as released: top-3 documents (verl/trainer/config/ppo_trainer.yaml at 0789f5e), 500 new
  tokens per turn and inserted blocks cut to 500 tokens (train_ppo.sh at 19efcf7: max_response_length,
  max_obs_length). The release's config allows 10 turns and its PPO script passes 2; the default here
  is 4. Greedy by default (the release validates greedily; its infer.py samples at 0.7).

Where this differs: the release cuts the start of a rolling prompt longer than its limit; here the
trajectory stops ("context") when the next turn would not fit the model's context. Its infer.py
(a demo script) splices each turn in as `\\n\\n{turn}<information>...` with no turn bound; this follows
the training and evaluation loop instead, whose layout the released checkpoints saw.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from corag.budget import BudgetExceeded
from corag.chain import call_seed
from corag.executor import Context
from corag.lm.base import GenerationRequest
from corag.methods.ircot import metered_generate, result_record, retrieve
from corag.prompts import SEARCH_R1_INVALID, search_r1_information, search_r1_messages
from corag.types import Example

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

# Stop strings are cut from the reply, and a reply cut before `</search>` would read like one that ended
# with its search tag open. Stopping at `/search>` leaves the `<` behind, which tells the two apart.
SEARCH_STOP = "/search>"
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def closed_turn(text: str) -> str:
    """A reply as the release keeps it: up to its first `</search>` (restoring the stop string), else
    up to its first `</answer>`, else whole."""
    if text.endswith("<"):  # generation stopped at `</search>`
        return text + SEARCH_STOP
    head, sep, _ = text.partition("</answer>")
    return head + sep


def parse_action(turn: str) -> tuple[str, str]:
    """("search", query), ("answer", answer) or ("invalid", ""): the first complete tag pair."""
    match = _ACTION.search(turn)
    return (match.group(1), match.group(2).strip()) if match else ("invalid", "")


def final_answer(text: str) -> str | None:
    """The last `<answer>...</answer>` of `text`, stripped; None without one."""
    answers = _ANSWER.findall(text)
    return answers[-1].strip() if answers else None


async def search_r1(
    ctx: Context,
    example: Example,
    *,
    corpus: Corpus,
    k: int = 3,
    max_turns: int = 4,
    max_new_tokens: int = 500,
    max_inserted_tokens: int = 500,
    temperature: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Search-R1 for one question; returns its result record (prediction, trajectory, searches, turns).

    Greedy at temperature 0; otherwise each turn is sampled with a seed fixed by the question, `seed`
    and the turn. `parse_failures` counts invalid actions; `stop_reason` is "answer", "max_turns",
    "budget" or "context".
    """
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []  # each turn and each inserted block, tokenized one by one
    turns: list[dict[str, Any]] = []
    searches: list[dict[str, Any]] = []
    stop_reason = "max_turns"
    for turn_index in range(max_turns + 1):
        messages = search_r1_messages(example.query, pieces)
        room = ctx.lm.max_context - ctx.lm.count_prompt_tokens(messages)
        if room < 1:
            stop_reason = "context"
            break
        request = GenerationRequest(
            tuple(messages),
            max_new_tokens=min(max_new_tokens, room),
            temperature=temperature,
            stop=(SEARCH_STOP,),
            seed=call_seed(example.id, f"search-r1:{seed}", turn_index, 0) if temperature > 0 else None,
        )
        try:
            completion = await metered_generate(ctx, calls, "turn", request)
        except BudgetExceeded:
            stop_reason = "budget"
            break
        turn = closed_turn(completion.texts[0])
        action, content = parse_action(turn)
        turns.append({"text": turn, "action": action})
        pieces.append(turn)
        if action == "answer":
            stop_reason = "answer"
            break
        if turn_index == max_turns:  # the last turn: a search is not carried out
            break
        if action == "search":
            found = await retrieve(ctx, corpus, content, k)
            searches.append({"query": content, "doc_ids": [p.id for p in found]})
            inserted = search_r1_information(found)
        else:
            inserted = SEARCH_R1_INVALID
        pieces.append(ctx.lm.truncate_tokens(inserted, max_inserted_tokens))
    answer = next((a for t in reversed(turns) if (a := final_answer(t["text"])) is not None), None)
    doc_ids = [doc for s in searches for doc in s["doc_ids"]]
    return result_record(
        ctx,
        example,
        "search-r1",
        answer or "",
        doc_ids,
        list(dict.fromkeys(doc_ids)),
        calls,
        trajectory="".join(pieces),
        turns=turns,
        searches=searches,
        stop_reason=stop_reason,
        answer_source="none" if answer is None else "format",
        parse_failures=sum(t["action"] == "invalid" for t in turns),
    )
