"""Batching: work submitted while one batch runs is done together in the next batch.

This is the server's one group-commit mechanism. recordDecision and announceIntent hand their
rows to a ``Batcher`` whose batch is one write transaction: on SQLite every write transaction
holds the database's only write lock from its first statement to its COMMIT, and on either
database a COMMIT has a fixed cost (a log flush), so one transaction for the calls that queued
while the previous one was written costs less than one each. The vector index batches its
upserts the same way (an upsert has a fixed cost per call too). docs/ARCHITECTURE.md,
"Transactions", lists every commit boundary and why it is there.

A lone call is a batch of one: a batch waits for nothing but one turn of the event loop, so
that calls whose requests have already arrived join it. Each call keeps its own outcome: when
a batch raises, ``recover`` says what becomes of each item (usually: done again alone, so one
call's failure never fails another's). A caller waits under a shield: a call whose client
hung up does not cancel work already queued, since an evaluated call must be recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from app.errors import STORAGE_ERROR, CstpError

log = logging.getLogger("cstp.batches")

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 64  # items done in one batch at most

# What becomes of each item of a batch that raised: a result, or the exception to raise to
# its caller.
Recover = Callable[[list[T], Exception], Awaitable[Sequence["R | BaseException"]]]


def shutting_down(_item: object) -> BaseException:
    """The outcome of work the server stopped before doing it."""
    return CstpError(STORAGE_ERROR, "Storage error: server shutting down")


class Batcher(Generic[T, R]):
    """Runs ``run`` on batches of the submitted items; see the module docstring."""

    def __init__(
        self,
        name: str,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        recover: Recover[T, R] | None = None,
        stopped: Callable[[T], R | BaseException] = shutting_down,
        limit: int = MAX_BATCH,
        weight: Callable[[T], int] | None = None,
    ) -> None:
        self.name = name  # what a batch is of, for log lines
        self._run = run
        self._recover = recover
        self._stopped = stopped  # the outcome of an item left undone by a shutdown
        self._limit = limit  # a batch's items at most, or their total weight: never below one
        self._weight = weight
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._worker: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        """Items queued and not yet taken into a batch."""
        return len(self._queue)

    async def submit(self, item: T) -> R:
        """``item``'s outcome once its batch is done: its result, or what it raised."""
        return await asyncio.shield(self.enqueue(item))

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` now; the future of its outcome (``submit`` waits for it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, future))
        worker = self._worker
        if worker is None or worker.done() or worker.get_loop() is not loop:
            self._worker = loop.create_task(self._work())
        return future

    async def drain(self) -> None:
        """Wait until everything submitted so far is done (shutdown, tests). Cancelling the
        wait leaves the work alone: its callers still get their outcomes."""
        while self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})  # unlike gather, a cancelled wait cancels nothing

    async def _work(self) -> None:
        while self._queue:
            batch: list[tuple[T, asyncio.Future[R]]] = []
            try:
                await asyncio.sleep(0)  # one turn: calls already arrived join this batch
                batch = self._take()
                outcomes = await self._outcomes([item for item, _ in batch])
            except asyncio.CancelledError:
                for item, future in (*batch, *self._queue):
                    _settle(future, self._stopped(item))
                self._queue.clear()
                raise
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                _settle(future, outcome)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        """The oldest items, up to the limit (by count, or by weight); always at least one."""
        if self._weight is None:
            return [self._queue.popleft() for _ in range(min(self._limit, len(self._queue)))]
        batch = [self._queue.popleft()]
        total = self._weight(batch[0][0])
        while self._queue and total + self._weight(self._queue[0][0]) <= self._limit:
            total += self._weight(self._queue[0][0])
            batch.append(self._queue.popleft())
        return batch

    async def _outcomes(self, items: list[T]) -> Sequence[R | BaseException]:
        try:
            return await self._run(items)
        except Exception as exc:
            if self._recover is None:
                return [exc] * len(items)
            log.info("a batch of %d %s failed; recovering each", len(items), self.name)
            try:
                return await self._recover(items, exc)
            except Exception as failure:  # no item's outcome is known: each gets the failure
                log.exception("recovering a failed batch of %s failed", self.name)
                return [failure] * len(items)


def each_alone(alone: Callable[[T], Awaitable[R]]) -> Recover[T, R]:
    """A ``recover`` that does each item of a failed batch again in a batch of its own (a
    batch of one has failed alone already: its failure is its outcome)."""

    async def recover(items: list[T], exc: Exception) -> list[R | BaseException]:
        if len(items) == 1:
            return [exc]
        outcomes: list[R | BaseException] = []
        for item in items:
            try:
                outcomes.append(await alone(item))
            except Exception as failure:  # that item's outcome
                outcomes.append(failure)
        return outcomes

    return recover


def _settle(future: asyncio.Future[R], outcome: R | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
