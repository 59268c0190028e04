"""Runs many questions' strategies at once and batches their model calls and searches.

A strategy is plain sequential code for ONE question: an `async def` that awaits
`ctx.generate`, `ctx.score`, `ctx.search` and `ctx.gather`. It never sees batching. Two executors
run strategies, both sending their calls through one `Batcher`:

- `Executor` (stepped): drives all active strategies until each waits on a call, then sends every
  pending generation in one `lm.generate` batch, every pending scoring in one `lm.score` batch and
  every pending search in one `retriever.search` batch, and resumes the strategies with their
  results. No threads, no event loop: the coroutines are stepped by hand, so a run is deterministic.
- `AsyncExecutor`: each question's strategy is an asyncio task. A call joins its kind's queue at
  once; one worker per kind takes everything queued whenever it is free (a call never waits for a
  wave, only for the batch in progress), the model's generations and scorings in one thread, searches
  in another, so searches overlap generation. A backend with an asynchronous engine (`agenerate` and
  `ascore`: `vllm-async`) is awaited instead, and its batches overlap: each is sent as soon as it
  forms, and the engine merges it into the sequences it is already decoding.

Identical requests are computed once (`dedup`, on by default): a generation that is greedy or
seeded, or a scoring, that repeats one already sent in the same batch or in an earlier one is served
from the first result (the same texts, log-probabilities and usage, so meters and budgets see what
they would see without it); repeated queries in a search batch are searched once. Unseeded sampling
is never reused. `dedup_stats` says how many prompt tokens this saved.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections import OrderedDict, defaultdict, deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from corag.budget import Meter
from corag.lm.base import LM, ChoiceRequest, Choices, Completion, GenerationRequest, Score, ScoreRequest
from corag.retrieval.base import Retriever
from corag.types import Hit

# The LM method of each kind of model call (its asynchronous engine's: the name with an "a" before it).
MODEL_CALLS = {"generate": "generate", "score": "score", "choices": "score_choices"}


@dataclass
class _Op:
    """A pending call: "generate", "score", "choices" or "search", with its payload."""

    kind: str
    payload: Any


@dataclass
class _Gather:
    coros: list[Coroutine[Any, Any, Any]]


class _Suspend:
    """Awaitable that hands an operation to the executor and returns its result."""

    def __init__(self, op: _Op | _Gather) -> None:
        self.op = op

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.op)


class Context:
    """What a strategy may do for one question: model calls, searches, concurrency; all metered."""

    def __init__(
        self,
        lm: LM,
        retriever: Retriever | None = None,
        meter: Meter | None = None,
        submit: Callable[[_Op], Awaitable[Any]] | None = None,
    ) -> None:
        self.lm = lm
        self.retriever = retriever
        self.meter = meter or Meter()
        self._submit = submit  # set by the asyncio executor; None: stepped
        # Set to a list to keep every generation of this question as (request, completion), in call order,
        # each with its exact tokens and their log-probabilities (the RL rollout trains on them); None
        # keeps nothing.
        self.trace: list[tuple[GenerationRequest, Completion]] | None = None

    async def _call(self, op: _Op) -> Any:
        if self._submit is None:
            return await _Suspend(op)
        return await self._submit(op)

    async def generate(self, request: GenerationRequest, *, final: bool = False) -> Completion:
        """Generate, charged to this question. Raises BudgetExceeded before starting a call that
        could pass the budget (`final` calls may use the reserve)."""
        if self.trace is not None and not request.logprobs:
            request = replace(request, logprobs=True)
        worst = 0
        if self.meter.budget is not None:
            prompt = self.lm.count_prompt_tokens(request.messages)
            worst = prompt + request.n * request.max_new_tokens
            self.meter.check(worst, final=final)
        self.meter.pending += worst
        try:
            completion: Completion = await self._call(_Op("generate", request))
        finally:  # also when the call is cancelled by a failing sibling in a gather
            self.meter.pending -= worst
        self.meter.charge(completion.usage)
        if self.trace is not None:
            self.trace.append((request, completion))
        return completion

    async def score(self, request: ScoreRequest, *, final: bool = False) -> Score:
        """Log-probabilities of `request.target`, charged to this question (prompt plus target)."""
        return await self._charged(_Op("score", request), lambda: self.lm.count_score_tokens(request), final)

    async def score_choices(self, request: ChoiceRequest) -> Choices:
        """Each of `request.targets` scored after one prompt, in one call charged to this question: the
        prompt once plus every target."""

        def worst() -> int:
            shared = self.lm.count_prompt_tokens(request.messages)
            return shared + sum(self.lm.count_score_tokens(r) - shared for r in request.score_requests())

        return await self._charged(_Op("choices", request), worst)

    async def _charged(self, op: _Op, worst: Callable[[], int], final: bool = False) -> Any:
        """`op`'s result, refused before it starts when its worst cost could pass the budget (`final`: it
        may use the reserve); what it cost is charged to this question."""
        cost = 0
        if self.meter.budget is not None:
            cost = worst()
            self.meter.check(cost, final=final)
        self.meter.pending += cost
        try:
            result = await self._call(op)
        finally:  # also when the call is cancelled by a failing sibling in a gather
            self.meter.pending -= cost
        self.meter.charge(result.usage)
        return result

    async def search(self, query: str, k: int) -> list[Hit]:
        """Top-k hits for one query (searches cost no tokens)."""
        if self.retriever is None:
            raise RuntimeError("this strategy needs a retriever, but none was given")
        return await self._call(_Op("search", (query, k)))

    async def gather(self, *coros: Awaitable[Any]) -> list[Any]:
        """Run several coroutines of this question concurrently; results in argument order."""
        if not coros:
            return []
        if self._submit is not None:
            return await gather_cancelling(coros)
        return await _Suspend(_Gather(list(coros)))  # type: ignore[arg-type]


@dataclass
class _Task:
    coro: Coroutine[Any, Any, Any]
    parent: _Task | None = None
    slot: int = 0
    root: int = -1  # index of the question this task belongs to
    results: list[Any] = field(default_factory=list)
    waiting_on: int = 0
    children: list[_Task] = field(default_factory=list)
    cancelled: bool = False

    def dead(self) -> bool:
        """Whether this task or an ancestor was cancelled (a sibling failed in a gather)."""
        task: _Task | None = self
        while task is not None:
            if task.cancelled:
                return True
            task = task.parent
        return False


_Ready = deque[tuple[_Task, Any, "BaseException | None"]]


@dataclass
class Plan:
    """One batch of model calls after de-duplication: what is sent, and where each result comes from."""

    kind: str
    results: list[Any]
    sent: list[Any] = field(default_factory=list)
    first: dict[str, int] = field(default_factory=dict)  # request key -> position in `sent`
    repeats: list[tuple[int, int]] = field(default_factory=list)  # (payload index, position in `sent`)


class Batcher:
    """Sends batches of model calls and searches: each distinct request once (`dedup`), counting
    backend calls (`batches`) and the prompt tokens reuse saved (`dedup_stats`). Both executors send
    through it: the stepped one with `call_model`, the asynchronous one with `plan`, its engine, then
    `settle`."""

    def __init__(
        self, lm: LM, retriever: Retriever | None = None, dedup: bool = True, cache_size: int = 65536
    ) -> None:
        self.lm, self.retriever = lm, retriever
        self.batches: dict[str, int] = defaultdict(int)  # backend calls made, by kind
        self.dedup, self.cache_size = dedup, cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()  # request key -> first result (LRU)
        # prompt tokens asked for by generations and scorings, and those served from earlier results
        self.dedup_stats = {"prompt_tokens": 0, "saved_prompt_tokens": 0, "reused_calls": 0}

    def call_model(self, kind: str, payloads: list[Any]) -> list[Any]:
        """One batched `generate` or `score` call over the requests not already answered."""
        call = getattr(self.lm, MODEL_CALLS[kind])
        plan = self.plan(kind, payloads)
        return self.settle(plan, call(plan.sent) if plan.sent else [])

    def plan(self, kind: str, payloads: list[Any]) -> Plan:
        """What to send of a batch: each distinct request not answered before, once (with `dedup`)."""
        plan = Plan(kind, [None] * len(payloads))
        if not self.dedup:
            plan.sent = list(payloads)
            plan.repeats = [(i, i) for i in range(len(payloads))]
            return plan
        for i, payload in enumerate(payloads):
            key = _request_key(payload)
            tokens = self._prompt_tokens(kind, payload)
            self.dedup_stats["prompt_tokens"] += tokens
            if key is not None and key in self._cache:
                self._cache.move_to_end(key)
                plan.results[i] = self._cache[key]
            elif key is not None and key in plan.first:
                plan.repeats.append((i, plan.first[key]))
            else:
                if key is not None:
                    plan.first[key] = len(plan.sent)
                plan.repeats.append((i, len(plan.sent)))
                plan.sent.append(payload)
                continue
            self.dedup_stats["saved_prompt_tokens"] += tokens
            self.dedup_stats["reused_calls"] += 1
        return plan

    def settle(self, plan: Plan, outputs: list[Any]) -> list[Any]:
        """The batch's results from the outputs of what was sent; new results enter the cache."""
        if plan.sent:
            self.batches[plan.kind] += 1
        for i, position in plan.repeats:
            plan.results[i] = outputs[position]
        if self.dedup:
            for key, position in plan.first.items():
                self._cache[key] = outputs[position]
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return plan.results

    def _prompt_tokens(self, kind: str, payload: Any) -> int:
        if kind == "generate":
            return self.lm.count_prompt_tokens(payload.messages)
        if kind == "choices":
            return sum(self.lm.count_score_tokens(r) for r in payload.score_requests())
        return self.lm.count_score_tokens(payload)

    def search(self, payloads: list[tuple[str, int]]) -> list[list[Hit]]:
        """One retriever call at the largest k asked (each distinct query once, with `dedup`); each
        query keeps its own top-k."""
        assert self.retriever is not None
        self.batches["search"] += 1
        k = max(k for _, k in payloads)
        queries = [q for q, _ in payloads]
        if self.dedup:
            distinct = list(dict.fromkeys(queries))
            found = dict(zip(distinct, self.retriever.search(distinct, k), strict=True))
            hits = [found[q] for q in queries]
        else:
            hits = self.retriever.search(queries, k)
        return [h[:kq] for (_, kq), h in zip(payloads, hits, strict=True)]


class Executor:
    """Runs strategy coroutines for many questions with batched backend calls.

    `max_active` bounds how many questions are in flight; results stream out as questions finish,
    so a caller can write them to disk as it goes. `max_active=1` runs one question at a time.
    """

    def __init__(
        self,
        lm: LM,
        retriever: Retriever | None = None,
        max_active: int = 256,
        dedup: bool = True,
        cache_size: int = 65536,
    ) -> None:
        if max_active < 1:
            raise ValueError(f"max_active must be at least 1, got {max_active}")
        self.lm, self.retriever, self.max_active = lm, retriever, max_active
        self.batcher = Batcher(lm, retriever, dedup=dedup, cache_size=cache_size)

    @property
    def batches(self) -> dict[str, int]:
        return self.batcher.batches

    @property
    def dedup_stats(self) -> dict[str, int]:
        return self.batcher.dedup_stats

    def context(self, budget: int | None = None) -> Context:
        """A fresh Context for one question, with its own meter and optional token budget."""
        return Context(self.lm, self.retriever, Meter(budget=budget))

    def run(self, coros: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run all coroutines to completion; results in input order."""
        results: list[Any] = [None] * len(coros)
        for index, result in self.stream(coros):
            results[index] = result
        return results

    def map(
        self, strategy: Callable[..., Coroutine[Any, Any, Any]], items: Iterable[Any]
    ) -> Iterator[tuple[int, Any]]:
        """Yield (index, result) for `strategy(item)` over items as each finishes, lazily."""
        return self.stream(strategy(item) for item in items)

    def stream(self, coros: Iterable[Coroutine[Any, Any, Any]]) -> Iterator[tuple[int, Any]]:
        """Yield (index, result) as each root coroutine finishes.

        An exception in a question's strategy propagates out of the run; inside `ctx.gather` it
        cancels the sibling coroutines and is raised at the gather.
        """
        source = enumerate(coros)
        active = 0
        ready: _Ready = deque()
        waiting: list[tuple[_Task, _Op]] = []
        exhausted = False
        while True:
            while not exhausted and active < self.max_active:
                nxt = next(source, None)
                if nxt is None:
                    exhausted = True
                    break
                ready.append((_Task(nxt[1], root=nxt[0]), None, None))
                active += 1
            finished: list[tuple[int, Any]] = []
            while ready:
                task, value, error = ready.popleft()
                if task.dead():
                    task.coro.close()
                    continue
                try:
                    op = task.coro.throw(error) if error is not None else task.coro.send(value)
                except StopIteration as stop:
                    self._finish(task, stop.value, None, ready, finished)
                    continue
                except BaseException as exc:  # propagate into the parent, or out of the run
                    if task.parent is None:
                        for other, *_ in [*ready, *waiting]:  # abandon the run cleanly
                            other.coro.close()
                        raise
                    self._finish(task, None, exc, ready, finished)
                    continue
                if isinstance(op, _Gather):
                    task.results = [None] * len(op.coros)
                    task.waiting_on = len(op.coros)
                    task.children = [
                        _Task(child, parent=task, slot=slot, root=task.root)
                        for slot, child in enumerate(op.coros)
                    ]
                    ready.extend((child, None, None) for child in task.children)
                elif isinstance(op, _Op):
                    waiting.append((task, op))
                else:
                    task.coro.close()
                    raise TypeError(f"strategies may only await ctx calls, not {op!r}")
            for item in finished:
                active -= 1
                yield item
            waiting = [(task, op) for task, op in waiting if not task.dead()]
            if not waiting:
                if exhausted and active == 0:
                    return
                continue
            ready.extend(self._dispatch(waiting))
            waiting = []

    def _finish(
        self,
        task: _Task,
        value: Any,
        error: BaseException | None,
        ready: _Ready,
        finished: list[tuple[int, Any]],
    ) -> None:
        parent = task.parent
        if parent is None:
            finished.append((task.root, value))
            return
        if error is not None:
            for sibling in parent.children:
                if sibling is not task:
                    sibling.cancelled = True
            parent.children, parent.waiting_on = [], 0
            ready.append((parent, None, error))
            return
        parent.results[task.slot] = value
        parent.waiting_on -= 1
        if parent.waiting_on == 0:
            parent.children = []
            ready.append((parent, parent.results, None))

    def _dispatch(self, waiting: list[tuple[_Task, _Op]]) -> list[tuple[_Task, Any, None]]:
        """One batched backend call per kind of pending operation."""
        by_kind: dict[str, list[tuple[_Task, _Op]]] = defaultdict(list)
        for task, op in waiting:
            by_kind[op.kind].append((task, op))
        resumed: list[tuple[_Task, Any, None]] = []
        for kind, items in by_kind.items():
            payloads = [op.payload for _, op in items]
            if kind == "search":
                outputs: list[Any] = self.batcher.search(payloads)
            else:
                outputs = self.batcher.call_model(kind, payloads)
            resumed.extend((task, out, None) for (task, _), out in zip(items, outputs, strict=True))
        return resumed


def _request_key(request: GenerationRequest | ScoreRequest | ChoiceRequest) -> str | None:
    """What makes two requests give the same result, or None when they need not (unseeded sampling)."""
    if isinstance(request, ScoreRequest):
        fields = [request.messages, request.target, request.temperature]
        return json.dumps(["score", *fields], sort_keys=True, ensure_ascii=False)
    if isinstance(request, ChoiceRequest):
        fields = [request.messages, request.targets, request.temperature]
        return json.dumps(["choices", *fields], sort_keys=True, ensure_ascii=False)
    greedy = request.temperature <= 0
    if not greedy and request.seed is None:
        return None
    fields = [request.messages, request.max_new_tokens, request.n, request.stop]
    fields += [None, None] if greedy else [request.temperature, request.seed]
    return json.dumps(["generate", *fields], sort_keys=True, ensure_ascii=False)


async def gather_cancelling(coros: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run coroutines concurrently, results in argument order; the first failure (in argument order
    among those that failed) cancels the others and is raised, as the stepped executor's gather does."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        raise
    failed = [t for t in tasks if t in done and not t.cancelled() and t.exception() is not None]
    if failed:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise failed[0].exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


class _Queue:
    """Calls of one kind: everything queued goes as one batch. With `overlap` each batch is sent as soon
    as it forms, beside the batches in flight (an asynchronous engine merges them); without, the next
    batch waits for the one in flight."""

    def __init__(self, call: Callable[[list[Any]], Awaitable[list[Any]]], overlap: bool = False) -> None:
        self.call, self.overlap = call, overlap
        self.pending: list[tuple[Any, asyncio.Future]] = []
        self.busy = False
        self.in_flight: set[asyncio.Task] = set()

    def submit(self, payload: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((payload, future))
        if not self.busy:
            self.busy = True
            loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(0)  # questions resumed in this turn of the loop join the batch
                batch, self.pending = self.pending, []
                if self.overlap:
                    task = asyncio.create_task(self._send(batch))
                    self.in_flight.add(task)  # held until done (the loop keeps only weak references)
                    task.add_done_callback(self.in_flight.discard)
                else:
                    await self._send(batch)
        finally:
            self.busy = False

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            outputs = await self.call([p for p, _ in batch])
        except Exception as error:  # every caller of the batch sees it
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), output in zip(batch, outputs, strict=True):
            if not future.done():  # a cancelled question leaves a cancelled future
                future.set_result(output)


class AsyncExecutor(Executor):
    """Runs strategy coroutines as asyncio tasks with batched, overlapping backend calls (the same
    Batcher as the stepped executor).

    Contexts must come from `context()` (they submit to this executor). `max_active` bounds the
    questions in flight; `run` returns results in input order.
    """

    def __init__(
        self, lm: LM, retriever: Retriever | None = None, max_active: int = 256, dedup: bool = True
    ) -> None:
        super().__init__(lm, retriever, max_active=max_active, dedup=dedup)
        self._model = threading.Lock()  # generations and scorings share the model: one batch at a time
        self._queues: dict[str, _Queue] = {}

    def context(self, budget: int | None = None) -> Context:
        return Context(self.lm, self.retriever, Meter(budget=budget), submit=self._submit)

    async def _submit(self, op: _Op) -> Any:
        if op.kind == "search" and self.retriever is None:
            raise RuntimeError("this strategy needs a retriever, but none was given")
        return await self._queues[op.kind].submit(op.payload)

    def _model_call(self, kind: str) -> Callable[[list[Any]], Awaitable[list[Any]]]:
        engine = getattr(self.lm, "a" + MODEL_CALLS[kind], None)
        if engine is not None:  # an asynchronous engine: awaited here, batches overlap

            async def submit(payloads: list[Any]) -> list[Any]:
                plan = self.batcher.plan(kind, payloads)
                return self.batcher.settle(plan, await engine(plan.sent) if plan.sent else [])

            return submit

        def call(payloads: list[Any]) -> list[Any]:
            with self._model:
                return self.batcher.call_model(kind, payloads)

        return lambda payloads: asyncio.to_thread(call, payloads)

    def run(self, coros: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run all coroutines to completion; results in input order."""
        return asyncio.run(self._run(list(coros)))

    def stream(self, coros: Iterable[Coroutine[Any, Any, Any]]) -> Iterator[tuple[int, Any]]:
        """Yield (index, result) as each question finishes (the loop runs in a thread meanwhile);
        a failure is raised here after the run has stopped."""
        finished: queue.Queue = queue.Queue()
        done = object()

        def work() -> None:
            try:
                asyncio.run(self._run(list(coros), lambda i, r: finished.put((i, r))))
                finished.put(done)
            except BaseException as error:  # handed to the consuming thread
                finished.put(error)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        while (item := finished.get()) is not done:
            if isinstance(item, BaseException):
                thread.join()
                raise item
            yield item
        thread.join()

    async def _run(
        self, coros: list[Coroutine[Any, Any, Any]], on_result: Callable[[int, Any], None] | None = None
    ) -> list[Any]:
        overlap = hasattr(self.lm, "agenerate")
        self._queues = {
            "generate": _Queue(self._model_call("generate"), overlap),
            "score": _Queue(self._model_call("score"), overlap),
            "choices": _Queue(self._model_call("choices"), overlap),
            "search": _Queue(lambda payloads: asyncio.to_thread(self.batcher.search, payloads)),
        }
        slots = asyncio.Semaphore(self.max_active)
        results: list[Any] = [None] * len(coros)

        async def one(index: int, coro: Coroutine[Any, Any, Any]) -> None:
            try:
                results[index] = await coro
                if on_result is not None:
                    on_result(index, results[index])
            finally:
                slots.release()

        tasks = []
        try:
            for index, coro in enumerate(coros):
                await slots.acquire()
                task = asyncio.create_task(one(index, coro))
                tasks.append(task)
                failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
            await gather_cancelling(tasks)
        finally:
            for task in tasks:
                task.cancel()
            for coro in coros[len(tasks) :]:
                coro.close()
        return results


EXECUTORS = {"stepped": Executor, "async": AsyncExecutor}  # the commands' --executor choices


def in_order(results: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """(index, result) pairs as they finish, yielded in index order as soon as each is next."""
    waiting: dict[int, Any] = {}  # finished before a question ahead of them
    following = 0
    for index, result in results:
        waiting[index] = result
        while following in waiting:
            yield waiting.pop(following)
            following += 1
