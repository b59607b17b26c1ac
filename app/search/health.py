"""Whether the vector index is failing, and the background ping that finds it back.

Every blocking call of ``app.search.index.VectorIndex`` runs through ``Health.call``: a failure
makes the index ``failing`` (and is counted), and a call that reaches Chroma and works clears
it. A caller that would rather not wait on a failing index (announceIntent's search) skips it
and asks for a ``recheck`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.search.types import IndexStats, IndexUnavailable

T = TypeVar("T")
#: How often a failing index is pinged at most, from announceIntent's search (``recheck``).
RECHECK_S = 1.0


class Health:
    def __init__(self, stats: IndexStats, ping: Callable[[], Awaitable[None]]) -> None:
        self._stats = stats
        self._ping = ping  # raises IndexUnavailable unless the index answers
        self._failing = False  # the last call failed, and none has worked since
        self._recheck: asyncio.Task[None] | None = None
        self._rechecked_at = -math.inf

    async def call(self, fn: Callable[[], T], *, reaches_chroma: bool = True) -> T:
        """Run blocking work (Chroma, embedding) in a worker thread, counting failures. A
        failure makes the index ``failing``; work that ``reaches_chroma`` and succeeds clears
        it (an embedding alone says nothing of Chroma)."""
        try:
            result = await asyncio.to_thread(fn)
        except IndexUnavailable:
            self._stats.failures += 1
            self._failing = True
            raise
        if reaches_chroma:
            self._failing = False
        return result

    @property
    def failing(self) -> bool:
        """Whether the last call to the index failed (and none has worked since)."""
        return self._failing

    def recheck(self) -> None:
        """Ping the index in the background, when it is ``failing``: one ping at a time, and
        at most one every RECHECK_S. A ping that works clears ``failing`` (as any call that
        works does), so that a caller that skips a failing index uses it again once it is
        back."""
        now = time.monotonic()
        running = self._recheck is not None and not self._recheck.done()
        if not self._failing or running or now - self._rechecked_at < RECHECK_S:
            return
        self._rechecked_at = now
        self._recheck = asyncio.get_running_loop().create_task(self._ping_quietly())

    async def _ping_quietly(self) -> None:
        with contextlib.suppress(IndexUnavailable):  # still failing: the flag says so
            await self._ping()

    async def aclose(self) -> None:
        """Stop a ping in progress."""
        if self._recheck is not None:
            self._recheck.cancel()
            await asyncio.gather(self._recheck, return_exceptions=True)
