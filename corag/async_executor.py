"""Strategies as asyncio tasks: each call is submitted when its question reaches it, no waves.

The stepped executor (corag.executor) advances every question to its next call, then sends one batch
per kind and waits for all of them: the model idles while searches run, and every wave waits for its
slowest call. Here each question's strategy is an asyncio task. A call joins its kind's queue at once;
one worker per kind takes everything queued whenever it is free (continuous batching at the batch
level: a call never waits for a wave, only for the batch in progress), the model's generations and
scorings in one thread, searches in another, so searches overlap generation. Results come back in
question order; batching, identical-request reuse (`dedup`) and metering are the stepped executor's.

Backends are called as they are (`lm.generate`, `lm.score`, `retriever.search` on lists), so this runs
on every backend. A backend with an asynchronous engine (`agenerate` and `ascore`: `vllm-async`) is
awaited instead, and its batches overlap: each is sent as soon as it forms, and the engine merges it
into the sequences it is already decoding, so a question's next call never waits for another's.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any

from corag.budget import Meter
from corag.executor import Context, Executor, _Op
from corag.lm.base import LM
from corag.retrieval.base import Retriever


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


class AsyncExecutor:
    """Runs strategy coroutines as asyncio tasks with batched, overlapping backend calls.

    Contexts must come from `context()` (they submit to this executor). `max_active` bounds the
    questions in flight; `run` returns results in input order.
    """

    def __init__(
        self, lm: LM, retriever: Retriever | None = None, max_active: int = 256, dedup: bool = True
    ) -> None:
        self.calls = Executor(lm, retriever, max_active=max_active, dedup=dedup)  # batching and reuse
        self.lm, self.retriever, self.max_active = lm, retriever, max_active
        self._model = threading.Lock()  # generations and scorings share the model: one batch at a time
        self._queues: dict[str, _Queue] = {}

    @property
    def batches(self) -> dict[str, int]:
        return self.calls.batches

    @property
    def dedup_stats(self) -> dict[str, int]:
        return self.calls.dedup_stats

    def context(self, budget: int | None = None) -> Context:
        return Context(self.lm, self.retriever, Meter(budget=budget), submit=self._submit)

    async def _submit(self, op: _Op) -> Any:
        if op.kind == "search" and self.retriever is None:
            raise RuntimeError("this strategy needs a retriever, but none was given")
        return await self._queues[op.kind].submit(op.payload)

    def _model_call(self, kind: str) -> Callable[[list[Any]], Awaitable[list[Any]]]:
        engine = getattr(self.lm, "agenerate" if kind == "generate" else "ascore", None)
        if engine is not None:  # an asynchronous engine: awaited here, batches overlap

            async def submit(payloads: list[Any]) -> list[Any]:
                plan = self.calls._plan(kind, payloads)
                return self.calls._settle(plan, await engine(plan.sent) if plan.sent else [])

            return submit

        def call(payloads: list[Any]) -> list[Any]:
            with self._model:
                return self.calls._model_calls(kind, payloads)

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
            "search": _Queue(lambda payloads: asyncio.to_thread(self.calls._search, payloads)),
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


EXECUTORS = {"stepped": Executor, "async": AsyncExecutor}


def add_executor_argument(parser: Any) -> None:
    """The `--executor` option of the commands that decode questions."""
    parser.add_argument(
        "--executor",
        default="stepped",
        choices=sorted(EXECUTORS),
        help="stepped waves of batched calls, or asyncio tasks whose calls are sent as they come "
        "(searches overlap generation; with --backend vllm-async calls join the running batch)",
    )


def in_order(results: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """(index, result) pairs as they finish, yielded in index order as soon as each is next."""
    waiting: dict[int, Any] = {}  # finished before a question ahead of them
    following = 0
    for index, result in results:
        waiting[index] = result
        while following in waiting:
            yield waiting.pop(following)
            following += 1
