"""The one batching mechanism (app.batches): what queues while a batch runs goes in the next
one, each caller gets its own outcome, a failed batch is recovered item by item, a caller
that gives up does not cancel its item, and a shutdown answers every item left."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from app.batches import Batcher, each_alone
from app.errors import STORAGE_ERROR, CstpError


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (no clock involved)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class Recorder:
    """A batch function that records each batch and can be held open or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.refuse: set[int] = set()

    async def run(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.refuse & set(items):
            raise ValueError(f"refused {sorted(self.refuse & set(items))}")
        return [item * 10 for item in items]

    async def alone(self, item: int) -> int:
        (result,) = await self.run([item])
        return result


async def test_calls_that_queue_while_a_batch_runs_go_together_in_the_next() -> None:
    work = Recorder()
    batcher: Batcher[int, int] = Batcher("numbers", work.run)
    work.gate.clear()
    first = asyncio.ensure_future(batcher.submit(1))
    await until(lambda: len(work.batches) == 1)  # the first batch is running (held at the gate)
    rest = [batcher.enqueue(n) for n in (2, 3, 4)]
    work.gate.set()
    assert await first == 10
    assert await asyncio.gather(*rest) == [20, 30, 40]
    assert work.batches == [[1], [2, 3, 4]]


async def test_calls_arrived_together_are_one_batch_and_the_limit_splits_them() -> None:
    work = Recorder()
    batcher: Batcher[int, int] = Batcher("numbers", work.run, limit=3)
    results = await asyncio.gather(*(batcher.submit(n) for n in range(1, 8)))
    assert results == [n * 10 for n in range(1, 8)]
    assert work.batches == [[1, 2, 3], [4, 5, 6], [7]]


async def test_a_weight_limit_never_splits_an_item_and_takes_at_least_one() -> None:
    seen: list[list[str]] = []

    async def run(items: list[str]) -> list[int]:
        seen.append(items)
        return [len(item) for item in items]

    batcher: Batcher[str, int] = Batcher("texts", run, limit=4, weight=len)
    await asyncio.gather(*(batcher.submit(t) for t in ("ab", "cd", "e", "fghijk", "l")))
    assert seen == [["ab", "cd"], ["e"], ["fghijk"], ["l"]]


async def test_a_failed_batch_is_done_again_item_by_item_and_only_the_bad_one_fails() -> None:
    work = Recorder()
    work.refuse = {2}
    batcher: Batcher[int, int] = Batcher("numbers", work.run, recover=each_alone(work.alone))
    outcomes = await asyncio.gather(*(batcher.submit(n) for n in (1, 2, 3)), return_exceptions=True)
    assert outcomes[0] == 10 and outcomes[2] == 30
    assert isinstance(outcomes[1], ValueError) and "refused [2]" in str(outcomes[1])
    assert work.batches == [[1, 2, 3], [1], [2], [3]]


async def test_without_recovery_every_item_of_a_failed_batch_gets_its_failure() -> None:
    work = Recorder()
    work.refuse = {1}
    batcher: Batcher[int, int] = Batcher("numbers", work.run)
    outcomes = await asyncio.gather(*(batcher.submit(n) for n in (1, 2)), return_exceptions=True)
    assert all(isinstance(o, ValueError) for o in outcomes)


async def test_a_caller_that_gives_up_does_not_cancel_its_item() -> None:
    work = Recorder()
    work.gate.clear()
    batcher: Batcher[int, int] = Batcher("numbers", work.run)
    caller = asyncio.ensure_future(batcher.submit(5))
    await until(lambda: len(work.batches) == 1)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    work.gate.set()
    await batcher.drain()
    assert work.batches == [[5]]  # the batch ran to its end


async def test_a_shutdown_answers_the_running_batch_and_everything_queued() -> None:
    work = Recorder()
    work.gate.clear()
    batcher: Batcher[int, int] = Batcher("numbers", work.run)
    running = asyncio.ensure_future(batcher.submit(1))
    await until(lambda: len(work.batches) == 1)
    queued = batcher.enqueue(2)
    worker = batcher._worker
    assert worker is not None
    worker.cancel()
    for call in (running, queued):
        with pytest.raises(CstpError) as failure:
            await call
        assert failure.value.code == STORAGE_ERROR
        assert "shutting down" in failure.value.message
