"""Write-side batching for the vector index: group commit and prepared vectors.

- Writes are group-committed: concurrent ``upsert`` calls share one embedding batch and one
  Chroma call, which keeps throughput up under load.
- ``prepare`` embeds texts ahead of their upsert (e.g. while the transaction that writes the
  rows commits), so the embedding is off the critical path; ``vectors_for`` then uses them.
  Preparing runs on the embedder's throughput-tuned method (``embed_many``) when it has one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from app.batches import Batcher
from app.search.embedder import Embedder
from app.search.types import IndexEntry, IndexStats, unavailable

logger = logging.getLogger(__name__)

MAX_FLUSH_ENTRIES = 256  # well under Chroma's max batch (5461) and keeps a flush short
PREPARED_LIMIT = 2048  # prepared vectors kept at most (oldest dropped first)
# Texts are prepared one at a time by up to two workers at once (each runs the embedder's
# one-thread session), so each decision's vector is ready as soon as a core can make it:
# a decision's text costs about the same per text alone as in a batch, and a batch would
# make its first text wait for its last (docs/ARCHITECTURE.md, "Search").
PREPARE_WORKERS = 2
PREPARE_BATCH = 1


class WriteBatcher:
    """Coalesces the writes of one index. ``write`` stores one flush and returns how many
    entries it wrote; ``vectors_for`` is what it calls (in a worker thread) for the vectors."""

    def __init__(
        self,
        embedder: Embedder,
        write: Callable[[list[IndexEntry]], Awaitable[int]],
        stats: IndexStats,
    ) -> None:
        # Off the callers' path: the throughput-tuned method where the embedder has one.
        self._embed_many: Callable[[Sequence[str]], list[list[float]]] = getattr(
            embedder, "embed_many", embedder.embed
        )
        self._write = write
        self._stats = stats
        # Every caller of a failed flush learns the index is unavailable; a shutdown cancels
        # the callers of the flush it stopped.
        self._flushes: Batcher[list[IndexEntry], None] = Batcher(
            "index upserts",
            self._flush,
            recover=_unavailable,
            stopped=lambda _: asyncio.CancelledError(),
            limit=MAX_FLUSH_ENTRIES,
            weight=len,
        )
        # Vectors computed ahead of their upsert (``prepare``), consumed by ``vectors_for``.
        self._lock = threading.Lock()  # guards _prepared across worker threads
        self._prepared: OrderedDict[str, list[float]] = OrderedDict()
        self._to_prepare: list[tuple[str, asyncio.Future[None]]] = []
        self._preparers: set[asyncio.Task[None]] = set()

    # ---- group commit ----

    async def upsert(self, entries: Sequence[IndexEntry]) -> None:
        """Queue ``entries`` and return once the flush that wrote them is done: concurrent
        callers' entries are written in one embedding batch and one Chroma call
        (app.batches), up to MAX_FLUSH_ENTRIES, a caller's entries never split."""
        batch = list(entries)
        if not batch:
            return
        self._stats.upsert_calls += 1
        await self._flushes.submit(batch)

    async def _flush(self, calls: list[list[IndexEntry]]) -> list[None]:
        written = await self._write([entry for entries in calls for entry in entries])
        self._stats.flushes += 1
        self._stats.entries_written += written
        return [None] * len(calls)

    async def drain(self) -> None:
        """Wait until the writes pending now (and any queued behind them) are done; a
        cancelled wait does not cancel them."""
        await self._flushes.drain()

    # ---- prepared vectors ----

    async def prepare(self, texts: Sequence[str]) -> None:
        """Embed ``texts`` for a later ``vectors_for`` (PREPARE_WORKERS at once, PREPARE_BATCH
        texts each). Never raises: a failed prepare only means the flush embeds them itself."""
        loop = asyncio.get_running_loop()
        waits = []
        for text in texts:
            future: asyncio.Future[None] = loop.create_future()
            self._to_prepare.append((text, future))
            waits.append(future)
        # A worker that has returned stays in the set until its done-callback runs, in a
        # later turn of the loop; it would never see the texts queued now, so count only the
        # running ones (a running worker checks the queue again before it returns).
        if sum(not task.done() for task in self._preparers) < PREPARE_WORKERS:
            task = loop.create_task(self._prepare_loop())
            self._preparers.add(task)
            task.add_done_callback(self._preparers.discard)
        await asyncio.gather(*waits, return_exceptions=True)

    async def _prepare_loop(self) -> None:
        while self._to_prepare:
            work = self._to_prepare[:PREPARE_BATCH]
            del self._to_prepare[:PREPARE_BATCH]
            texts = list(dict.fromkeys(text for text, _ in work))
            try:
                vectors = await asyncio.to_thread(self._embed_many, texts)
                with self._lock:
                    for text, vector in zip(texts, vectors, strict=True):
                        self._prepared[text] = list(vector)
                    while len(self._prepared) > PREPARED_LIMIT:
                        self._prepared.popitem(last=False)
            except Exception:  # upsert will embed (and report) by itself
                logger.debug("prepare failed", exc_info=True)
            finally:
                # Whatever happened (cancelled too), the callers go on; their records wait
                # for these futures.
                for _, future in work:
                    if not future.done():
                        future.set_result(None)

    def vectors_for(self, documents: list[str]) -> list[list[float]]:
        """Prepared vectors where there are some, one embedding batch for the rest."""
        with self._lock:
            found = {d: self._prepared.pop(d) for d in set(documents) if d in self._prepared}
        missing = [d for d in dict.fromkeys(documents) if d not in found]
        if missing:
            try:
                found.update(zip(missing, self._embed_many(missing), strict=True))
            except Exception as exc:
                raise unavailable(exc) from exc
        return [list(found[d]) for d in documents]


async def _unavailable(calls: list[list[IndexEntry]], exc: Exception) -> list[BaseException]:
    return [unavailable(exc)] * len(calls)
