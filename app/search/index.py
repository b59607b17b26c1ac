"""Vector index adapter over Chroma (embedded ``PersistentClient`` or a ``chroma run`` server).

- We embed texts ourselves and hand Chroma vectors with ``embedding_function=None``: Chroma's
  default function downloads a model (no network here); a custom one is rebuilt on every write.
- The server may be down at start-up or restart later: client and collection are created lazily
  and dropped after a failure, so the next call reconnects. Every failure is ``IndexUnavailable``.
- Chroma's HTTP client has no timeout (``httpx.Client(timeout=None)``) and its constructor makes
  three requests: a short heartbeat probe goes first, then the session gets finite timeouts.
- Writes are group-committed: concurrent ``upsert`` calls share one embedding batch and one
  Chroma call, which keeps throughput up under load.
- Chroma's upsert *merges* metadata (old keys survive); we send the old keys as None, which
  deletes them, so the new metadata replaces the old.

Each workspace has a collection of its own (``collection_name``): a search looks only at its
workspace's entries, and costs what its workspace's size makes it cost. (A ``where`` filter on
a workspace key in one shared collection makes Chroma scan the metadata of every entry first,
which grows with the whole index: docs/performance-history.md, "Workspaces", has the
figures.) Workspace ``default``'s collection keeps the name it always had, so an index built
before workspaces existed needs no rebuild.

This module is the facade; connection management (lazy connect, reconnect, the
metadata-replacing upsert) lives in ``app.search.chroma``, building a client (timeouts,
collection settings) in ``app.search.chroma_client``, whether the index is failing in
``app.search.health``, the write batching (group commit, prepared vectors) in
``app.search.batching``; what they share (the entry, the hit, the
counters, ``IndexUnavailable``) in ``app.search.types``, which this module re-exports.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from chromadb.api.client import Client
from chromadb.api.models.Collection import Collection

from app.db.base import DEFAULT_WORKSPACE
from app.observability import spans
from app.search import chroma as chroma_ops
from app.search.batching import MAX_FLUSH_ENTRIES, WriteBatcher
from app.search.chroma import ChromaCollection, clean_metadata, replace
from app.search.chroma_client import (
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    embedded_connector,
    http_connector,
)
from app.search.embedder import Embedder
from app.search.health import Health
from app.search.types import Hit, IndexEntry, IndexStats, IndexUnavailable, unavailable

__all__ = ["Hit", "IndexEntry", "IndexStats", "IndexUnavailable", "VectorIndex", "clean_metadata"]

T = TypeVar("T")

WORKSPACE_INFIX = "-ws-"


def collection_name(base: str, workspace: str) -> str:
    """The collection of ``workspace``'s entries in the index whose own collection is
    ``base``: ``base`` itself for workspace ``default``, ``<base>-ws-<workspace>`` else. A
    workspace id is ``[a-z0-9][a-z0-9-]*``; Chroma wants a name to end with a letter or a
    digit, so an id that ends with ``-`` gets ``.0`` after it (no id holds a ``.``, so no
    two workspaces share a name)."""
    if workspace == DEFAULT_WORKSPACE:
        return base
    name = f"{base}{WORKSPACE_INFIX}{workspace}"
    return f"{name}.0" if workspace.endswith("-") else name


class VectorIndex:
    """Async facade over one Chroma collection per workspace (``collection_name``); safe to
    use from many coroutines at once. Every read names its workspace; an entry carries its
    own."""

    def __init__(
        self,
        connect: Callable[[], Client],
        embedder: Embedder,
        collection: str = "decisions",
        *,
        remote: bool,
    ) -> None:
        """Prefer ``embedded``/``http``; ``connect`` builds a client and may raise."""
        self._embedder = embedder
        self.stats = IndexStats()
        self._chroma = ChromaCollection(
            connect, collection, remote=remote, embedder=embedder, stats=self.stats
        )
        # the other workspaces' collections, made when first used (same Chroma, same health)
        self._others: dict[str, ChromaCollection] = {}
        self._batcher = WriteBatcher(embedder, self._flush, self.stats)
        self._health = Health(self.stats, self.ping)
        self._embedding = (
            f"embeddings {embedder.model_id}",
            {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": embedder.model_id},
        )

    @classmethod
    def embedded(cls, path: Path, embedder: Embedder, collection: str = "decisions") -> VectorIndex:
        """In-process Chroma persisted under ``path`` (one process per directory only)."""
        return cls(embedded_connector(path), embedder, collection, remote=False)

    @classmethod
    def http(
        cls,
        url: str,
        embedder: Embedder,
        collection: str = "decisions",
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> VectorIndex:
        """A Chroma server at ``url`` (``http://host:port``); nothing is contacted until used."""
        connect = http_connector(
            url, connect_timeout=connect_timeout, request_timeout=request_timeout
        )
        return cls(connect, embedder, collection, remote=True)

    @property
    def name(self) -> str:
        """The name of this index's collection."""
        return self._chroma.name

    def sibling(self, collection: str) -> VectorIndex:
        """The same Chroma (and embedder) with another collection, e.g. to rebuild into."""
        return VectorIndex(
            self._chroma.connect, self._embedder, collection, remote=self._chroma.remote
        )

    async def promote(self, live: str) -> None:
        """Make this collection the one named ``live`` and drop the one that had the name.

        Chroma has no aliases, so the old collection is renamed aside first; clients of the
        old one find the new one by name on their next call (see ``ChromaCollection.run``).
        """
        retired = f"{live}-retired-{uuid.uuid4().hex[:8]}"

        def op(c: Collection) -> None:
            client = self._chroma.client
            assert client is not None
            names = {col.name for col in client.list_collections()}
            if live in names:
                client.get_collection(live, embedding_function=None).modify(name=retired)
            c.modify(name=live)
            if live in names:
                client.delete_collection(retired)

        await self._op(op)
        self._chroma.rename(live)

    async def drop_collections(
        self, prefixes: Sequence[str], keep: Sequence[str] = ()
    ) -> list[str]:
        """Delete every collection of this Chroma whose name starts with one of ``prefixes``
        (never this index's own, nor one named in ``keep``); returns their names."""

        def op(own: Collection) -> list[str]:
            client = self._chroma.client
            assert client is not None
            names = sorted(col.name for col in client.list_collections())
            kept = {own.name, *keep}
            doomed = [n for n in names if n.startswith(tuple(prefixes)) and n not in kept]
            for name in doomed:
                client.delete_collection(name)
            return doomed

        return await self._op(op)

    @property
    def failing(self) -> bool:
        """Whether the last call to the index failed (and none has worked since)."""
        return self._health.failing

    def recheck(self) -> None:
        """Ping a failing index in the background (app.search.health)."""
        self._health.recheck()

    def _collection(self, workspace: str) -> ChromaCollection:
        if workspace == DEFAULT_WORKSPACE:
            return self._chroma
        found = self._others.get(workspace)
        if found is None:
            found = self._others.setdefault(
                workspace,
                ChromaCollection(
                    self._chroma.connect,
                    collection_name(self._chroma.name, workspace),
                    remote=self._chroma.remote,
                    embedder=self._embedder,
                    stats=self.stats,
                ),
            )
        return found

    async def _op(self, op: Callable[[Collection], T], workspace: str = DEFAULT_WORKSPACE) -> T:
        chroma = self._collection(workspace)
        return await self._health.call(lambda: chroma.run(op))

    # ---- writes (group commit in app.search.batching) ----

    async def upsert(self, entries: Sequence[IndexEntry]) -> None:
        """Embed and store ``entries``; returns when they are searchable.

        Concurrent callers are coalesced: one flusher at a time writes everything pending in
        one embedding batch and one Chroma call, then resolves every waiting caller.
        """
        with _chroma_span("upsert", self.name):
            await self._batcher.upsert(entries)

    async def prepare(self, texts: Sequence[str]) -> None:
        """Embed ``texts`` ahead of their upsert, e.g. while the transaction that writes the
        rows commits, so the embedding is off the critical path. Concurrent calls are embedded
        in one batch. Never raises: a failed prepare only means ``upsert`` embeds itself."""
        await self._batcher.prepare(texts)

    async def _flush(self, entries: list[IndexEntry]) -> int:
        return await self._health.call(lambda: self._write(entries))

    def _write(self, entries: list[IndexEntry]) -> int:
        """One flush, in a worker thread: one embedding batch, one Chroma call per chunk of
        each workspace's entries."""
        latest: dict[str, IndexEntry] = {}
        for entry in entries:  # duplicate ids in one flush: the last one wins
            latest.pop(entry.id, None)
            latest[entry.id] = entry
        items = list(latest.values())
        vectors = self._batcher.vectors_for([item.document for item in items])
        by_workspace: dict[str, list[int]] = {}
        for n, item in enumerate(items):
            by_workspace.setdefault(item.workspace, []).append(n)
        for workspace, positions in by_workspace.items():
            chroma = self._collection(workspace)
            for start in range(0, len(positions), MAX_FLUSH_ENTRIES):
                chunk = positions[start : start + MAX_FLUSH_ENTRIES]
                chroma.run(
                    functools.partial(
                        replace,
                        ids=[items[n].id for n in chunk],
                        vectors=[vectors[n] for n in chunk],
                        metadatas=[clean_metadata(items[n].metadata) for n in chunk],
                    )
                )
        return len(items)

    async def delete(self, ids: Sequence[str], *, workspace: str) -> None:
        """Remove ``ids`` from ``workspace``'s entries (unknown ids are ignored)."""
        wanted = list(dict.fromkeys(ids))
        if wanted:
            await self._op(lambda c: c.delete(ids=wanted), workspace)

    # ---- reads ----

    def _embed_one(self, text: str) -> list[float]:
        try:
            with spans.span(*self._embedding):
                return list(self._embedder.embed([text])[0])
        except Exception as exc:
            raise unavailable(exc) from exc

    async def embed_query(self, text: str) -> list[float]:
        """The query vector for ``text`` (computed in a worker thread)."""
        return await self._health.call(lambda: self._embed_one(text), reaches_chroma=False)

    async def query(
        self, text: str, *, workspace: str, where: dict[str, Any] | None = None, limit: int = 10
    ) -> list[Hit]:
        """Nearest ``limit`` documents of ``workspace`` to ``text`` that satisfy ``where``,
        nearest first."""
        return (await self.query_text(text, workspace=workspace, where=where, limit=limit))[1]

    async def query_text(
        self,
        text: str,
        *,
        workspace: str,
        where: dict[str, Any] | None = None,
        limit: int = 10,
        metadata: bool = True,
    ) -> tuple[list[float], list[Hit]]:
        """Embed ``text`` and query with it in one trip to a worker thread; returns the
        vector too, so a caller can query again without embedding again."""

        chroma = self._collection(workspace)

        def work() -> tuple[list[float], list[Hit]]:
            vector = self._embed_one(text)
            if limit < 1:
                return vector, []
            with _chroma_span("query", chroma.name):
                return vector, chroma.run(chroma_ops.nearest(vector, where, limit, metadata))

        vector, hits = await self._health.call(work)
        self.stats.queries += 1
        return vector, hits

    async def query_vector(
        self,
        vector: Sequence[float],
        *,
        workspace: str,
        where: dict[str, Any] | None = None,
        limit: int = 10,
        metadata: bool = True,
    ) -> list[Hit]:
        """Like ``query`` with a precomputed vector (lets callers reuse one embedding).
        ``metadata=False`` leaves ``Hit.metadata`` empty: Chroma then answers several times
        faster."""
        if limit < 1:
            return []
        with _chroma_span("query", self._collection(workspace).name):
            hits = await self._op(
                chroma_ops.nearest(list(vector), where, limit, metadata), workspace
            )
        self.stats.queries += 1
        return hits

    async def distances(
        self, vector: Sequence[float], ids: Sequence[str], *, workspace: str
    ) -> dict[str, float]:
        """The cosine distance from ``vector`` to each of ``ids`` that ``workspace``'s
        collection holds (computed from their stored vectors: Chroma's own query restricted
        to ids fails on an id it does not hold, and costs several times more)."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        with _chroma_span("get", self._collection(workspace).name):
            return await self._op(
                functools.partial(chroma_ops.distances, vector=vector, ids=wanted), workspace
            )

    async def get_metadata(
        self, ids: Sequence[str], *, workspace: str
    ) -> dict[str, dict[str, Any]]:
        """Stored metadata by id in ``workspace``'s collection; ids that are not indexed there
        are absent from the result."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        with _chroma_span("get", self._collection(workspace).name):
            return await self._op(functools.partial(chroma_ops.metadata_of, ids=wanted), workspace)

    async def count(self, workspace: str = DEFAULT_WORKSPACE) -> int:
        """Number of documents indexed for ``workspace``."""
        return await self._op(lambda c: c.count(), workspace)

    async def ping(self) -> None:
        """Readiness check: raises IndexUnavailable unless the collection answers."""
        await self.count()

    # ---- shutdown ----

    async def aclose(self) -> None:
        """Let pending writes finish, then close."""
        await self._batcher.drain()
        await self._health.aclose()
        self.close()

    def close(self) -> None:
        """Release the clients; later calls raise IndexUnavailable. Await pending upserts
        first."""
        for chroma in (self._chroma, *self._others.values()):
            chroma.close()


def _chroma_span(operation: str, collection: str) -> AbstractContextManager[object]:
    """A child span of the running call around a Chroma call (tracing on; else nothing)."""
    return spans.span(
        f"{operation} {collection}",
        {
            "db.system.name": "chromadb",
            "db.operation.name": operation,
            "db.collection.name": collection,
        },
    )
