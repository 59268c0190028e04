"""The toy world: a seeded, deterministic fictional encyclopedia with compositional questions.

Entities (people, cities, countries, companies, films, books) are linked by relations (birthplace,
country, capital, director, ...). Each entity has one passage listing its facts as `The {relation} of
{subject} is {object}.`, and each single-hop question uses the same words (`Who is the director of
Kavo Ralu?`), so reading a sub-answer is match-then-copy. Multi-hop questions nest the same phrases
(`What is the country of the birthplace of the director of Kavo Ralu?`), so every gold sub-query is
verbatim inside the question.

Names are one or two words from a pool of invented name-words that is the same for every world (a
fixed seed, independent of the world's seed): a tokenizer trained once covers every world, and names in
a fresh world are new combinations of known tokens, which cannot be memorised, only read.

Held-out split: entities fall into a train part and a test part, and relations never cross parts, so
no entity of a test question (seed, intermediate or answer) appears in any train question.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corag.data.jsonl import write_jsonl
from corag.types import Example, Passage, Step

NAME_POOL_SEED = 1_000_003  # fixed: every world draws names from the same pool
NAME_POOL_SIZE = 1000

_ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "th", "dr", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "l", "r", "s"]  # only at the end of a word

# kind -> share of a world's entities; countries are few, so many chains pass through them.
KINDS: dict[str, float] = {
    "person": 0.30,
    "city": 0.18,
    "country": 0.06,
    "company": 0.16,
    "film": 0.15,
    "book": 0.15,
}
NAME_WORDS: dict[str, tuple[int, ...]] = {  # kind -> allowed name lengths in words
    "person": (2,),
    "city": (1,),
    "country": (1,),
    "company": (1, 2),
    "film": (2,),
    "book": (2,),
}
# relation -> (subject kind, object kind). One word each, so nested phrases parse unambiguously.
RELATIONS: dict[str, tuple[str, str]] = {
    "birthplace": ("person", "city"),
    "employer": ("person", "company"),
    "country": ("city", "country"),
    "mayor": ("city", "person"),
    "capital": ("country", "city"),
    "leader": ("country", "person"),
    "founder": ("company", "person"),
    "headquarters": ("company", "city"),
    "director": ("film", "person"),
    "studio": ("film", "company"),
    "author": ("book", "person"),
    "publisher": ("book", "company"),
}
SPLITS = ("train", "test")


def name_pool(size: int = NAME_POOL_SIZE) -> list[str]:
    """The shared pool of invented, capitalised name-words (same list for every world)."""
    rng = random.Random(NAME_POOL_SEED)
    reserved = {w.lower() for w in _template_words()}
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        syllables = rng.choice((2, 2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(
            _CODAS
        )
        if len(word) > 8 or word in seen or word in reserved:
            continue
        seen.add(word)
        words.append(word.capitalize())
    return words


def wh_word(relation: str) -> str:
    """`Who` for relations whose object is a person, else `What`."""
    return "Who" if RELATIONS[relation][1] == "person" else "What"


def fact_sentence(relation: str, subject: str, obj: str) -> str:
    """A passage's fact: `The director of Kavo Ralu is Mina Ostrel.`"""
    return f"The {relation} of {subject} is {obj}."


def question_phrase(relations: Sequence[str], subject: str) -> str:
    """`the country of the birthplace of X` for relations applied in order (first to `subject`)."""
    phrase = subject
    for relation in relations:
        phrase = f"the {relation} of {phrase}"
    return phrase


def question(relations: Sequence[str], subject: str) -> str:
    """The question asking for the last relation's object: `Who is the director of Kavo Ralu?`"""
    return f"{wh_word(relations[-1])} is {question_phrase(relations, subject)}?"


def kind_sentence(name: str, kind: str) -> str:
    """A passage's first sentence: `Kavo Ralu is a film.`"""
    return f"{name} is a {kind}."


def _template_words() -> list[str]:
    """Every fixed word that the world's sentences use (without names)."""
    words = ["Who", "What", "is", "the", "of", "a", "The"]
    return words + list(KINDS) + list(RELATIONS)


def phrasing_texts(names: Sequence[str] = ("Kavo", "Ralu")) -> list[str]:
    """Every sentence and question shape of the world, filled with `names`, for tokenizer training."""
    x, y = names[0], names[-1]
    texts = [kind_sentence(x, kind) for kind in KINDS]
    for relation in RELATIONS:
        texts += [fact_sentence(relation, x, y), question([relation], x), question([relation, relation], x)]
    return texts


@dataclass(frozen=True)
class Entity:
    """One entity: `part` is `train`, `test` (held out) or `distractor` (never in a question)."""

    id: str
    name: str
    kind: str
    part: str


@dataclass
class ToyWorld:
    """A generated world: entities, facts, passages and questions (see `generate_world`)."""

    seed: int
    entities: list[Entity]
    facts: dict[tuple[str, str], str]  # (subject id, relation) -> object id
    passages: list[Passage]
    train: list[Example]
    test: list[Example]
    single_hop: list[Example] = field(default_factory=list)  # one question per fact
    _by_id: dict[str, Entity] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_id = {e.id: e for e in self.entities}

    def entity(self, entity_id: str) -> Entity:
        """The entity whose passage has id `entity_id`."""
        return self._by_id[entity_id]

    def texts(self) -> Iterator[str]:
        """All text of the world (passages, questions, sub-queries, answers) for tokenizer training."""
        for p in self.passages:
            yield p.title
            yield p.contents
        for ex in [*self.train, *self.test, *self.single_hop]:
            yield ex.query
            yield from ex.answers
            for step in ex.decomposition:
                yield step.subquery

    def write(self, out_dir: str | Path) -> Path:
        """Write corpus.jsonl, train.jsonl, test.jsonl and single_hop.jsonl (byte-identical per seed)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(
            out / "corpus.jsonl",
            ({"id": p.id, "title": p.title, "contents": p.contents} for p in self.passages),
        )
        for name, examples in (("train", self.train), ("test", self.test), ("single_hop", self.single_hop)):
            write_jsonl(out / f"{name}.jsonl", (example_record(ex) for ex in examples))
        return out


def example_record(ex: Example) -> dict:
    """An Example as one line of the project's plain question JSONL."""
    return {
        "id": ex.id,
        "query": ex.query,
        "answers": list(ex.answers),
        "task": ex.task,
        "supporting_ids": list(ex.supporting_ids),
        "supporting_titles": list(ex.supporting_titles),
        "decomposition": [
            {"subquery": s.subquery, "subanswer": s.subanswer, "doc_ids": list(s.doc_ids)}
            for s in ex.decomposition
        ],
        "meta": dict(ex.meta),
    }


def _kind_counts(n: int) -> dict[str, int]:
    """Entities per kind for a part of `n` entities (at least two of each kind); people fill the rest."""
    counts = {kind: max(2, round(share * n)) for kind, share in KINDS.items() if kind != "person"}
    return {"person": max(2, n - sum(counts.values())), **counts}


class _Namer:
    """Draws unique entity names from the shared pool."""

    def __init__(self, rng: random.Random, pool: list[str]) -> None:
        self.rng, self.pool, self.used = rng, pool, set()

    def add(self, name: str) -> bool:
        if name in self.used:
            return False
        self.used.add(name)
        return True

    def new(self, kind: str) -> str:
        for attempt in range(1000):
            # One-word names run out in big worlds; fall back to two words.
            words = self.rng.choice(NAME_WORDS[kind]) if attempt < 100 else 2
            name = " ".join(self.rng.choice(self.pool) for _ in range(words))
            if len(set(name.split())) == words and self.add(name):
                return name
        raise ValueError(f"name pool exhausted while naming a {kind}; use fewer entities")

    def namesake(self, name: str) -> str | None:
        """A new two-word name sharing one word with `name` (a distractor's title)."""
        for _ in range(100):
            word = self.rng.choice(name.split())
            other = self.rng.choice(self.pool)
            candidate = f"{word} {other}" if self.rng.random() < 0.5 else f"{other} {word}"
            if other != word and self.add(candidate):
                return candidate
        return None


def _make_part(rng: random.Random, namer: _Namer, part: str, n: int, start: int) -> list[Entity]:
    entities = []
    for kind, count in _kind_counts(n).items():
        for _ in range(count):
            entities.append(Entity(f"e{start + len(entities):05d}", namer.new(kind), kind, part))
    return entities


def _link(rng: random.Random, entities: list[Entity], targets: list[Entity]) -> dict[tuple[str, str], str]:
    """Facts for `entities`, objects drawn from `targets`; a country's capital lies in that country."""
    by_kind: dict[str, list[Entity]] = {kind: [e for e in targets if e.kind == kind] for kind in KINDS}
    facts: dict[tuple[str, str], str] = {}
    cities = [e for e in entities if e.kind == "city"]
    countries = [e for e in entities if e.kind == "country"]
    # Countries first get one city each (in order) so every country can have a capital inside it.
    for i, city in enumerate(cities):
        country = countries[i] if i < len(countries) else rng.choice(by_kind["country"])
        facts[(city.id, "country")] = country.id
    for country in countries:
        own = [c.id for c in cities if facts[(c.id, "country")] == country.id]
        facts[(country.id, "capital")] = rng.choice(own)
    for e in entities:
        for relation, (subject_kind, object_kind) in RELATIONS.items():
            if subject_kind == e.kind and (e.id, relation) not in facts:
                facts[(e.id, relation)] = rng.choice([t for t in by_kind[object_kind] if t.id != e.id]).id
    return facts


def _chains(facts: dict[tuple[str, str], str], seeds: list[Entity], hops: int) -> list[tuple[str, ...]]:
    """Every chain (seed id, relation 1, ..., relation n) whose entities are all distinct."""
    relations_of: dict[str, list[str]] = {}
    for subject, relation in facts:
        relations_of.setdefault(subject, []).append(relation)
    found: list[tuple[str, ...]] = []

    def walk(path: tuple[str, ...], visited: tuple[str, ...]) -> None:
        if len(path) - 1 == hops:
            found.append(path)
            return
        for relation in relations_of.get(visited[-1], []):
            nxt = facts[(visited[-1], relation)]
            if nxt not in visited:
                walk(path + (relation,), visited + (nxt,))

    for seed in seeds:
        walk((seed.id,), (seed.id,))
    return found


def _example(
    world_seed: int, ex_id: str, chain: tuple[str, ...], facts: dict, names: dict[str, str], part: str
) -> Example:
    """The question of a chain, with its gold decomposition (passage ids are entity ids)."""
    seed, relations = chain[0], chain[1:]
    steps, subject = [], seed
    for relation in relations:
        obj = facts[(subject, relation)]
        steps.append(Step(question([relation], names[subject]), names[obj], (subject,)))
        subject = obj
    support = tuple(s.doc_ids[0] for s in steps)
    return Example(
        id=ex_id,
        query=question(relations, names[seed]),
        answers=(steps[-1].subanswer,),
        task="multihopqa",
        supporting_ids=support,
        supporting_titles=tuple(names[i] for i in support),
        decomposition=tuple(steps),
        meta={"hops": len(relations), "relations": list(relations), "split": part, "world_seed": world_seed},
    )


def _passage(entity: Entity, facts: dict[tuple[str, str], str], names: dict[str, str]) -> Passage:
    sentences = [kind_sentence(entity.name, entity.kind)]
    for relation, (subject_kind, _) in RELATIONS.items():
        if subject_kind == entity.kind:
            sentences.append(fact_sentence(relation, entity.name, names[facts[(entity.id, relation)]]))
    return Passage(entity.id, entity.name, " ".join(sentences))


def generate_world(
    seed: int = 0,
    num_entities: int = 300,
    num_distractors: int = 60,
    train_per_hop: int = 200,
    test_per_hop: int = 50,
    hops: Sequence[int] = (2, 3, 4),
    test_fraction: float = 0.2,
) -> ToyWorld:
    """Generate a world; the same arguments give the same world, byte for byte.

    `num_entities` real entities are split into train and held-out test parts (`test_fraction`);
    `num_distractors` more passages are namesakes (a shared name-word, the same relations) that no
    question touches. Up to `train_per_hop` / `test_per_hop` questions per hop count (fewer when the
    world has fewer distinct chains).
    """
    if num_entities < 30:
        raise ValueError(f"num_entities must be at least 30, got {num_entities}")
    if not hops or min(hops) < 1:
        raise ValueError(f"hops must be positive hop counts, got {tuple(hops)}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = random.Random(seed)
    pool = name_pool()
    namer = _Namer(rng, pool)
    n_test = max(15, round(num_entities * test_fraction))
    parts = {"train": _make_part(rng, namer, "train", num_entities - n_test, 0)}
    parts["test"] = _make_part(rng, namer, "test", n_test, len(parts["train"]))
    real = parts["train"] + parts["test"]
    facts: dict[tuple[str, str], str] = {}
    for part in SPLITS:
        facts.update(_link(rng, parts[part], parts[part]))
    distractors = []
    echoes = [e for e in real if e.kind != "country"]  # a country needs a capital inside it; keep those real
    for i in range(num_distractors):
        echo = rng.choice(echoes)
        name = namer.namesake(echo.name)
        if name is not None:
            distractors.append(Entity(f"d{i:05d}", name, echo.kind, "distractor"))
    facts.update(_link(rng, distractors, real))
    entities = real + distractors
    names = {e.id: e.name for e in entities}
    passages = [_passage(e, facts, names) for e in entities]

    questions: dict[str, list[Example]] = {}
    for part, per_hop in (("train", train_per_hop), ("test", test_per_hop)):
        questions[part] = []
        for n in hops:
            chains = _chains(facts, parts[part], n)
            for j, chain in enumerate(rng.sample(chains, min(per_hop, len(chains)))):
                questions[part].append(
                    _example(seed, f"toy{seed}-{part}-{n}hop-{j:04d}", chain, facts, names, part)
                )
    part_of = {e.id: e.part for e in entities}
    single_hop = [
        _example(seed, f"toy{seed}-single-{k:05d}", (subject, relation), facts, names, part_of[subject])
        for k, (subject, relation) in enumerate(facts)
    ]
    return ToyWorld(seed, entities, facts, passages, questions["train"], questions["test"], single_hop)


def tokenizer_texts(world: ToyWorld | None = None, num_prompts: int = 8) -> Iterator[str]:
    """Text for a tokenizer that covers every toy world and the prompts of the CoRAG calls.

    The whole name pool and every phrasing come first (so names of any world are known), then the
    world's own text, then a few rendered prompts (so template words tokenize compactly). Without a
    world, a small fixed one fills the prompts.
    """
    from corag import prompts  # the prompts know nothing of the toy world; keep the import local

    pool = name_pool()
    yield " ".join(pool)
    yield "\n".join(pool)
    yield from phrasing_texts()
    if world is None:
        world = generate_world(
            seed=0, num_entities=60, num_distractors=15, train_per_hop=num_prompts, test_per_hop=1
        )
    yield from world.texts()
    by_id = {p.id: p for p in world.passages}
    for ex in world.train[:num_prompts]:
        steps = ex.decomposition
        docs = [by_id[i] for i in ex.supporting_ids]
        messages = [
            prompts.subquery_messages(ex.query, steps[:1], prompts.task_description(ex.task)),
            prompts.subanswer_messages(steps[0].subquery, docs),
            prompts.final_answer_messages(ex.query, steps, prompts.task_description(ex.task), docs),
            prompts.penalty_messages(ex.query, steps),
            prompts.stop_messages(ex.query, steps, prompts.task_description(ex.task)),
        ]
        for message in messages:
            yield message[0]["content"]
    yield from (prompts.NO_INFO, prompts.STOP_YES, prompts.STOP_NO)
