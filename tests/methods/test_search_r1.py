"""Search-R1: the published prompt byte for byte, the tag protocol's control flow (a scripted LM that
cuts replies at stop strings as the backends do), metering, and the continued assistant turn."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from corag.budget import Meter
from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest, Message, Score, ScoreRequest
from corag.lm.hf import stop_index
from corag.methods import METHODS
from corag.methods.search_r1 import closed_turn, final_answer, parse_action, search_r1
from corag.prompts import SEARCH_R1_INVALID, search_r1_information, search_r1_messages, search_r1_prompt
from corag.types import Example, Hit, Passage, Usage


def published_prompt(question: str) -> str:
    """`make_prefix` of Search-R1's scripts/data_process/nq_search.py (template_type "base"), as
    published, after the script's own question clean-up (strip, add a missing "?")."""
    question = question.strip()
    if question[-1] != "?":
        question += "?"
    prefix = f"""Answer the given question. \
You must conduct reasoning inside <think> and </think> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. \
You can search as many times as your want. \
If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"""  # noqa: E501
    return prefix


def test_prompt_is_the_published_one_byte_for_byte() -> None:
    for question in ("  who wrote the novel blade runner is based on ", "Where is Oslo?"):
        assert search_r1_prompt(question).encode() == published_prompt(question).encode()
    assert search_r1_prompt("who wrote hamlet").endswith(
        "For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
    )


def test_inserted_blocks_are_the_released_ones() -> None:
    passages = [Passage("a", "Oslo", "Oslo is a city in Norway."), Passage("b", "Norway", "A country.")]
    # generation.py: f"Doc {idx+1}(Title: {title}) {text}\n" per document, then the results stripped
    assert search_r1_information(passages) == (
        "\n\n<information>Doc 1(Title: Oslo) Oslo is a city in Norway.\nDoc 2(Title: Norway) A country."
        "</information>\n\n"
    )
    assert search_r1_information([]) == "\n\n<information></information>\n\n"
    assert SEARCH_R1_INVALID == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and "
        "</answer>. Let me try again.\n"
    )


def test_turns_are_cut_and_read_as_the_release_reads_them() -> None:
    assert closed_turn("<think>x</think><search> q <") == "<think>x</think><search> q </search>"
    assert closed_turn("<answer> A </answer> and more") == "<answer> A </answer>"
    assert closed_turn("no tags") == "no tags"
    assert parse_action("<think>x</think><search> q </search>") == ("search", "q")
    assert parse_action("<answer>A</answer> then <search>q</search>") == ("answer", "A")  # the first one
    assert parse_action("<search> q") == ("invalid", "")  # left open
    assert parse_action("<answer>\nA\n</answer>") == ("answer", "A")
    assert final_answer("<answer>A</answer>...<answer> B </answer>") == "B"
    assert final_answer("<answer> B") is None


class ScriptedLM:
    """Replies from a script, one per call in order, cut at the request's stop strings as every backend
    cuts them (the stop string removed). A token is a word; the end-of-turn token counts one."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for request in requests:
            text = self.replies[len(self.requests)]
            self.requests.append(request)
            cut = stop_index(text, request.stop)
            text = text if cut is None else text[:cut]
            usage = Usage(self.count_prompt_tokens(request.messages), len(text.split()) + 1, 1)
            out.append(Completion((text,), usage))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        raise AssertionError("Search-R1 never scores")

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return sum(len(m["content"].split()) + 2 for m in messages) + 1

    def count_score_tokens(self, request: ScoreRequest) -> int:
        raise AssertionError("Search-R1 never scores")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        return text if len(text.split()) <= max_tokens else " ".join(text.split()[:max_tokens])

    @property
    def max_context(self) -> int:
        return 100_000


class DictCorpus:
    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = {p.id: p for p in passages}

    def get_many(self, ids: Sequence[str]) -> list[Passage]:
        return [self.passages[i] for i in ids]


class TitleRetriever:
    """Every passage whose title occurs in the query, in corpus order (records queries and k)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = passages
        self.asked: list[tuple[str, int]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.asked += [(q, k) for q in queries]
        return [[Hit(p.id, 1.0) for p in self.passages if p.title in q][:k] for q in queries]


PASSAGES = [
    Passage("d-harbour", "Blue Harbour", "Blue Harbour is a film directed by Mara Velden."),
    Passage("d-mara", "Mara Velden", "Mara Velden was born in Oslo."),
    Passage("d-oslo", "Oslo", "Oslo is a city in Norway."),
]
QUESTION = Example("q1", "In which country was the director of Blue Harbour born", ("Norway",))


def run(
    replies: Sequence[str], budget: int | None = None, **settings
) -> tuple[dict, ScriptedLM, TitleRetriever]:
    lm, retriever = ScriptedLM(replies), TitleRetriever(PASSAGES)
    ctx = Context(lm, retriever, Meter(budget=budget))
    record = Executor(lm, retriever).run([search_r1(ctx, QUESTION, corpus=DictCorpus(PASSAGES), **settings)])[
        0
    ]
    assert record["tokens"] == ctx.meter.usage.total
    assert record["model_calls"] == len(record["calls"]) == ctx.meter.usage.calls == len(lm.requests)
    return record, lm, retriever


def test_two_searches_then_an_answer() -> None:
    replies = [
        "<think>Who directed it?</think>\n<search> director of Blue Harbour </search>\n<information>made up",
        "<think>Mara Velden. Where was she born?</think><search>Mara Velden Oslo</search>",
        "<think>Oslo is in Norway.</think>\n<answer> Norway </answer> and then more text",
    ]
    record, lm, retriever = run(replies)
    assert retriever.asked == [("director of Blue Harbour", 3), ("Mara Velden Oslo", 3)]
    turn1 = "<think>Who directed it?</think>\n<search> director of Blue Harbour </search>"
    info1 = "\n\n<information>Doc 1(Title: Blue Harbour) Blue Harbour is a film directed by Mara Velden.</information>\n\n"
    turn2 = "<think>Mara Velden. Where was she born?</think><search>Mara Velden Oslo</search>"
    info2 = (
        "\n\n<information>Doc 1(Title: Mara Velden) Mara Velden was born in Oslo.\n"
        "Doc 2(Title: Oslo) Oslo is a city in Norway.</information>\n\n"
    )
    turn3 = "<think>Oslo is in Norway.</think>\n<answer> Norway </answer>"
    assert record["trajectory"] == turn1 + info1 + turn2 + info2 + turn3
    # one conversation: the instruction as the user turn, everything since as the assistant turn continued
    prompt = {"role": "user", "content": search_r1_prompt(QUESTION.query)}
    assert [r.messages for r in lm.requests] == [
        (prompt,),
        (prompt, {"role": "assistant", "content": turn1 + info1, "pieces": [turn1, info1]}),
        (
            prompt,
            {
                "role": "assistant",
                "content": turn1 + info1 + turn2 + info2,
                "pieces": [turn1, info1, turn2, info2],
            },
        ),
    ]
    assert all(r.stop == ("/search>",) and r.temperature == 0 and r.seed is None for r in lm.requests)
    assert record["predictions"] == "Norway" and record["answer_source"] == "format"
    assert record["stop_reason"] == "answer" and record["parse_failures"] == 0
    assert [t["action"] for t in record["turns"]] == ["search", "search", "answer"]
    assert record["searches"] == [
        {"query": "director of Blue Harbour", "doc_ids": ["d-harbour"]},
        {"query": "Mara Velden Oslo", "doc_ids": ["d-mara", "d-oslo"]},
    ]
    assert record["doc_ids"] == record["context_doc_ids"] == ["d-harbour", "d-mara", "d-oslo"]
    # every turn is charged, the whole growing conversation each time
    prompts = [c["prompt_tokens"] for c in record["calls"]]
    assert prompts == [lm.count_prompt_tokens(r.messages) for r in lm.requests] and prompts == sorted(prompts)
    assert record["tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in record["calls"])
    assert [c["purpose"] for c in record["calls"]] == ["turn"] * 3


def test_replies_without_tags_are_invalid_actions_until_the_turns_run_out() -> None:
    replies = ["I think it is Norway.", "Norway", "The answer is Norway."]
    record, lm, retriever = run(replies, max_turns=2)
    assert retriever.asked == [] and len(lm.requests) == 3  # max_turns, then the last turn
    assert (
        record["trajectory"] == replies[0] + SEARCH_R1_INVALID + replies[1] + SEARCH_R1_INVALID + replies[2]
    )
    assert record["predictions"] == "" and record["answer_source"] == "none"
    assert record["stop_reason"] == "max_turns" and record["parse_failures"] == 3


def test_unclosed_tags_are_invalid_actions() -> None:
    # a search tag left open at the end of the turn is not a search; nor is an answer left open
    replies = ["<think>hm</think><search> Oslo", "<answer> Oslo", "<answer>Norway</answer>"]
    record, lm, retriever = run(replies)
    assert retriever.asked == []
    assert (
        record["trajectory"] == replies[0] + SEARCH_R1_INVALID + replies[1] + SEARCH_R1_INVALID + replies[2]
    )
    assert [t["action"] for t in record["turns"]] == ["invalid", "invalid", "answer"]
    assert record["predictions"] == "Norway" and record["parse_failures"] == 2


def test_too_many_turns_end_with_a_search_that_is_not_carried_out() -> None:
    replies = [f"<search> Oslo {i} </search>" for i in range(4)]
    record, lm, retriever = run(replies, max_turns=2, k=1)
    assert retriever.asked == [("Oslo 0", 1), ("Oslo 1", 1)] and len(lm.requests) == 3
    info = "\n\n<information>Doc 1(Title: Oslo) Oslo is a city in Norway.</information>\n\n"
    assert record["trajectory"] == replies[0] + info + replies[1] + info + replies[2]
    assert record["stop_reason"] == "max_turns" and record["predictions"] == ""
    # with no turns allowed, the model answers in one call without searching
    record, lm, retriever = run(["<search> Oslo </search>"], max_turns=0)
    assert retriever.asked == [] and len(lm.requests) == 1 and record["stop_reason"] == "max_turns"


def test_an_earlier_answer_counts_when_the_last_turn_has_none() -> None:
    replies = ["<answer> Oslo </answer> <search> Norway </search>"]
    record, _, retriever = run(replies)
    assert record["predictions"] == "Oslo" and retriever.asked == [] and record["stop_reason"] == "answer"


def test_inserted_blocks_are_cut_to_their_token_limit() -> None:
    record, _, _ = run(["<search> Blue Harbour </search>", "<answer>x</answer>"], max_inserted_tokens=4)
    assert record["trajectory"].startswith(
        "<search> Blue Harbour </search><information>Doc 1(Title: Blue Harbour)"
    )
    assert record["trajectory"].endswith("Harbour)<answer>x</answer>")


def test_budget_and_sampling() -> None:
    replies = ["<search> Oslo </search>", "<answer>Norway</answer>"]
    record, lm, _ = run(replies, budget=700)
    assert record["stop_reason"] == "budget" and len(lm.requests) == 1 and record["tokens"] <= 700
    record, lm, _ = run(replies, temperature=0.7, seed=3)
    seeds = [r.seed for r in lm.requests]
    assert all(r.temperature == 0.7 for r in lm.requests) and None not in seeds and len(set(seeds)) == 2
    _, again, _ = run(replies, temperature=0.7, seed=3)
    assert [r.seed for r in again.requests] == seeds  # fixed by question, seed and turn


def test_registered_as_a_method() -> None:
    assert METHODS["search-r1"] is search_r1


def test_the_model_continues_its_own_turn(tiny_model_dir: Path) -> None:
    """The rendered prompt is the template's user turn and generation prompt, then the trajectory's
    pieces, each tokenized on its own (tests/methods/test_search_r1_ids.py: where that differs)."""
    from transformers import AutoTokenizer

    from corag.lm.render import ChatRenderer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = ChatRenderer(tokenizer)
    question = "Where was Mara Velden born?"
    pieces = ["<search> Mara Velden </search>", search_r1_information(PASSAGES[1:2])]
    user = [{"role": "user", "content": search_r1_prompt(question)}]
    opening = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert renderer.prompt_ids(search_r1_messages(question, pieces)) == tuple(
        renderer.encode(opening) + renderer.encode(pieces[0]) + renderer.encode(pieces[1])
    )
    assert renderer.prompt_ids(search_r1_messages(question)) == tuple(renderer.encode(opening))
