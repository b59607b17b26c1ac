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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.config import Settings
from chromadb.errors import NotFoundError

from app.search.embedder import Embedder

logger = logging.getLogger(__name__)

T = TypeVar("T")
MetadataValue = str | int | float | bool | list[str]
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
MAX_FLUSH_ENTRIES = 256  # well under Chroma's max batch (5461) and keeps a flush short
PREPARED_LIMIT = 2048  # prepared vectors kept at most (oldest dropped first)


class IndexUnavailable(Exception):
    """Chroma cannot be reached or used; the cause is chained, the message stays generic."""


@dataclass(frozen=True)
class IndexEntry:
    """One document to index: ``metadata`` values that are None or empty lists mean "absent"."""

    id: str
    document: str
    metadata: Mapping[str, MetadataValue | None]


@dataclass(frozen=True)
class Hit:
    """A search result; ``distance`` is Chroma's cosine distance (0 = same meaning)."""

    id: str
    distance: float
    metadata: dict[str, Any]


@dataclass
class IndexStats:
    """Counters for tests and metrics (``connects`` changes under the lock, the rest on the loop)."""

    upsert_calls: int = 0
    flushes: int = 0
    entries_written: int = 0
    queries: int = 0
    failures: int = 0
    connects: int = 0


@dataclass
class _Pending:
    entries: list[IndexEntry]
    future: asyncio.Future[None]


def clean_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Drop what Chroma rejects (None, empty lists); turn tuples into lists."""
    cleaned: dict[str, Any] = {}
    for key, value in metadata.items():
        if isinstance(value, tuple):
            value = list(value)
        if value is None or (isinstance(value, list) and not value):
            continue
        cleaned[key] = value
    return cleaned


def _unavailable(exc: BaseException) -> IndexUnavailable:
    """A fresh generic error per waiter, chained to the root cause (not to another wrapper)."""
    if isinstance(exc, IndexUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    err = IndexUnavailable("vector index unavailable")
    err.__cause__ = exc
    return err


def _settings() -> Settings:
    # A fresh object each time: chromadb.HttpClient mutates the Settings it is given.
    return Settings(anonymized_telemetry=False)


class VectorIndex:
    """Async facade over one Chroma collection; safe to use from many coroutines at once."""

    def __init__(self, connect: Callable[[], ClientAPI], embedder: Embedder,
                 collection: str = "decisions", *, remote: bool) -> None:
        """Prefer ``embedded``/``http``; ``connect`` builds a client and may raise."""
        self._connect = connect
        self._embedder = embedder
        self._name = collection
        self._remote = remote
        self._lock = threading.Lock()  # guards _client/_collection across worker threads
        self._client: ClientAPI | None = None
        self._collection: Collection | None = None
        self._closed = False
        self._pending: deque[_Pending] = deque()
        self._flusher: asyncio.Task[None] | None = None
        # Vectors computed ahead of their upsert (``prepare``), consumed by ``_write``.
        self._prepared: OrderedDict[str, list[float]] = OrderedDict()
        self._to_prepare: list[tuple[str, asyncio.Future[None]]] = []
        self._preparer: asyncio.Task[None] | None = None
        self.stats = IndexStats()

    @classmethod
    def embedded(cls, path: Path, embedder: Embedder, collection: str = "decisions") -> VectorIndex:
        """In-process Chroma persisted under ``path`` (one process per directory only)."""
        target = Path(path)

        def connect() -> ClientAPI:
            target.mkdir(parents=True, exist_ok=True)
            return chromadb.PersistentClient(path=str(target), settings=_settings())

        return cls(connect, embedder, collection, remote=False)

    @classmethod
    def http(cls, url: str, embedder: Embedder, collection: str = "decisions", *,
             connect_timeout: float = CONNECT_TIMEOUT_S,
             request_timeout: float = REQUEST_TIMEOUT_S) -> VectorIndex:
        """A Chroma server at ``url`` (``http://host:port``); nothing is contacted until used."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        ssl = parts.scheme == "https"
        host = parts.hostname or "localhost"
        port = parts.port or (443 if ssl else 8000)
        base = f"{parts.scheme}://{parts.netloc}"

        def connect() -> ClientAPI:
            httpx.get(f"{base}/api/v2/heartbeat", timeout=connect_timeout).raise_for_status()
            client = chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=_settings())
            session = getattr(getattr(client, "_server", None), "_session", None)
            if isinstance(session, httpx.Client):
                session.timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
            return client

        return cls(connect, embedder, collection, remote=True)

    # ---- connection management (runs in worker threads) ----

    def _get_collection(self) -> Collection:
        with self._lock:
            if self._closed:
                raise IndexUnavailable("vector index is closed")
            if self._collection is None:
                if self._client is None:
                    self._client = self._connect()
                    self.stats.connects += 1
                self._collection = self._client.get_or_create_collection(
                    self._name,
                    configuration={"hnsw": {"space": "cosine"}},
                    metadata={"embedder": str(getattr(self._embedder, "model_id", "unknown"))},
                    embedding_function=None,
                )
            return self._collection

    def _invalidate(self, failed: Collection | None) -> None:
        """Forget the collection (and, for a server, the client) so the next call reconnects."""
        with self._lock:
            if failed is not None and self._collection is not failed:
                return  # another thread already reconnected; keep the fresh handle
            self._collection = None
            if self._remote and self._client is not None:
                old, self._client = self._client, None
                try:
                    old.close()  # releases Chroma's registry entry; in-flight calls are unaffected
                except Exception:  # noqa: BLE001 - best effort on an already broken client
                    pass

    def _run(self, op: Callable[[Collection], T]) -> T:
        """Run ``op`` on the (lazily connected) collection; any failure -> IndexUnavailable.

        A collection that vanished under us (``cstp reindex`` switched to a rebuilt one) is
        looked up again by name and the call retried once, so the switch costs no error.
        """
        for attempt in (1, 2):
            collection: Collection | None = None
            try:
                collection = self._get_collection()
                return op(collection)
            except IndexUnavailable:
                raise
            except NotFoundError as exc:
                self._invalidate(collection)
                if attempt == 2:
                    raise _unavailable(exc) from exc
            except Exception as exc:
                logger.warning("vector index call failed: %s", type(exc).__name__)
                self._invalidate(collection)
                raise _unavailable(exc) from exc
        raise AssertionError("unreachable")

    def sibling(self, collection: str) -> VectorIndex:
        """The same Chroma (and embedder) with another collection, e.g. to rebuild into."""
        return VectorIndex(self._connect, self._embedder, collection, remote=self._remote)

    async def promote(self, live: str) -> None:
        """Make this collection the one named ``live`` and drop the one that had the name.

        Chroma has no aliases, so the old collection is renamed aside first; clients of the
        old one find the new one by name on their next call (see ``_run``).
        """
        retired = f"{live}-retired-{uuid.uuid4().hex[:8]}"

        def op(c: Collection) -> None:
            client = self._client
            assert client is not None
            names = {getattr(col, "name", col) for col in client.list_collections()}
            if live in names:
                client.get_collection(live, embedding_function=None).modify(name=retired)
            c.modify(name=live)
            if live in names:
                client.delete_collection(retired)

        await self._op(op)
        with self._lock:
            self._name = live

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run blocking work (Chroma, embedding) in a worker thread, counting failures."""
        try:
            return await asyncio.to_thread(fn)
        except IndexUnavailable:
            self.stats.failures += 1
            raise

    async def _op(self, op: Callable[[Collection], T]) -> T:
        return await self._call(lambda: self._run(op))

    # ---- writes (group commit) ----

    async def upsert(self, entries: Sequence[IndexEntry]) -> None:
        """Embed and store ``entries``; returns when they are searchable.

        Concurrent callers are coalesced: one flusher at a time writes everything pending in
        one embedding batch and one Chroma call, then resolves every waiting caller.
        """
        batch = list(entries)
        if not batch:
            return
        self.stats.upsert_calls += 1
        loop = asyncio.get_running_loop()
        pending = _Pending(batch, loop.create_future())
        self._pending.append(pending)
        if self._flusher is None or self._flusher.done() or self._flusher.get_loop() is not loop:
            self._flusher = loop.create_task(self._flush_loop())
        await pending.future

    def _take_pending(self) -> list[_Pending]:
        """Whole caller groups, oldest first, up to MAX_FLUSH_ENTRIES (always at least one)."""
        groups: list[_Pending] = []
        size = 0
        while self._pending:
            nxt = len(self._pending[0].entries)
            if groups and size + nxt > MAX_FLUSH_ENTRIES:
                break
            groups.append(self._pending.popleft())
            size += nxt
        return groups

    async def _flush_loop(self) -> None:
        while self._pending:
            groups = self._take_pending()
            entries = [entry for group in groups for entry in group.entries]
            try:
                written = await self._call(lambda: self._write(entries))
            except BaseException as exc:  # noqa: BLE001 - every waiter must learn the outcome
                for group in groups:
                    if not group.future.done():
                        group.future.set_exception(
                            exc if isinstance(exc, asyncio.CancelledError) else _unavailable(exc)
                        )
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self.stats.flushes += 1
            self.stats.entries_written += written
            for group in groups:
                if not group.future.done():
                    group.future.set_result(None)

    async def prepare(self, texts: Sequence[str]) -> None:
        """Embed ``texts`` ahead of their upsert, e.g. while the transaction that writes the
        rows commits, so the embedding is off the critical path. Concurrent calls are embedded
        in one batch. Never raises: a failed prepare only means ``upsert`` embeds itself."""
        loop = asyncio.get_running_loop()
        waits = []
        for text in texts:
            future: asyncio.Future[None] = loop.create_future()
            self._to_prepare.append((text, future))
            waits.append(future)
        if self._preparer is None or self._preparer.done():
            self._preparer = loop.create_task(self._prepare_loop())
        await asyncio.gather(*waits, return_exceptions=True)

    async def _prepare_loop(self) -> None:
        while self._to_prepare:
            work, self._to_prepare = self._to_prepare, []
            texts = list(dict.fromkeys(text for text, _ in work))
            try:
                vectors = await asyncio.to_thread(self._embedder.embed, texts)
            except Exception:  # noqa: BLE001 - upsert will embed (and report) by itself
                logger.debug("prepare failed", exc_info=True)
            else:
                with self._lock:
                    for text, vector in zip(texts, vectors, strict=True):
                        self._prepared[text] = list(vector)
                    while len(self._prepared) > PREPARED_LIMIT:
                        self._prepared.popitem(last=False)
            for _, future in work:
                if not future.done():
                    future.set_result(None)

    def _vectors_for(self, documents: list[str]) -> list[list[float]]:
        """Prepared vectors where there are some, one embedding batch for the rest."""
        with self._lock:
            found = {d: self._prepared.pop(d) for d in set(documents) if d in self._prepared}
        missing = [d for d in dict.fromkeys(documents) if d not in found]
        if missing:
            try:
                found.update(zip(missing, self._embedder.embed(missing), strict=True))
            except Exception as exc:
                raise _unavailable(exc) from exc
        return [list(found[d]) for d in documents]

    def _write(self, entries: list[IndexEntry]) -> int:
        """One flush, in a worker thread: one embedding batch, one Chroma call per chunk."""
        latest: dict[str, IndexEntry] = {}
        for entry in entries:  # duplicate ids in one flush: the last one wins
            latest.pop(entry.id, None)
            latest[entry.id] = entry
        items = list(latest.values())
        ids = [item.id for item in items]
        documents = [item.document for item in items]
        metadatas = [clean_metadata(item.metadata) for item in items]
        vectors = self._vectors_for(documents)
        for start in range(0, len(items), MAX_FLUSH_ENTRIES):
            chunk = slice(start, start + MAX_FLUSH_ENTRIES)
            self._run(functools.partial(self._replace, ids=ids[chunk], vectors=vectors[chunk],
                                        documents=documents[chunk], metadatas=metadatas[chunk]))
        return len(items)

    @staticmethod
    def _replace(collection: Collection, ids: list[str], vectors: list[list[float]],
                 documents: list[str], metadatas: list[dict[str, Any]]) -> None:
        """Upsert so that the new metadata *replaces* the old (Chroma's upsert merges)."""
        old = collection.get(ids=ids, include=["metadatas"])
        previous = {i: m or {} for i, m in zip(old["ids"], old["metadatas"] or [])}
        final: list[dict[str, Any] | None] = []
        for entry_id, metadata in zip(ids, metadatas):
            stale = {key: None for key in previous.get(entry_id, {}) if key not in metadata}
            final.append({**metadata, **stale} or None)  # None deletes a key; {} is rejected
        collection.upsert(ids=ids, embeddings=vectors, documents=documents,
                          metadatas=final)  # type: ignore[arg-type]

    async def delete(self, ids: Sequence[str]) -> None:
        """Remove ``ids`` (unknown ids are ignored)."""
        wanted = list(dict.fromkeys(ids))
        if wanted:
            await self._op(lambda c: c.delete(ids=wanted))

    # ---- reads ----

    async def embed_query(self, text: str) -> list[float]:
        """The query vector for ``text`` (computed in a worker thread)."""

        def embed() -> list[float]:
            try:
                return list(self._embedder.embed([text])[0])
            except Exception as exc:
                raise _unavailable(exc) from exc

        return await self._call(embed)

    async def query(self, text: str, *, where: dict[str, Any] | None = None,
                    limit: int = 10) -> list[Hit]:
        """Nearest ``limit`` documents to ``text`` that satisfy ``where``, nearest first."""
        return await self.query_vector(await self.embed_query(text), where=where, limit=limit)

    async def query_vector(self, vector: Sequence[float], *, where: dict[str, Any] | None = None,
                           limit: int = 10) -> list[Hit]:
        """Like ``query`` with a precomputed vector (lets callers reuse one embedding)."""
        if limit < 1:
            return []
        embedding = list(vector)

        def op(c: Collection) -> list[Hit]:
            res = c.query(query_embeddings=[embedding], n_results=limit, where=where,
                          include=["metadatas", "distances"])  # type: ignore[list-item]
            rows = zip(res["ids"][0], (res["distances"] or [[]])[0], (res["metadatas"] or [[]])[0])
            hits = [Hit(i, float(d), dict(m or {})) for i, d, m in rows]
            return sorted(hits, key=lambda h: (h.distance, h.id))

        hits = await self._op(op)
        self.stats.queries += 1
        return hits

    async def get_metadata(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Stored metadata by id; ids that are not indexed are absent from the result."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}

        def op(c: Collection) -> dict[str, dict[str, Any]]:
            res = c.get(ids=wanted, include=["metadatas"])  # type: ignore[list-item]
            return {i: dict(m or {}) for i, m in zip(res["ids"], res["metadatas"] or [])}

        return await self._op(op)

    async def count(self) -> int:
        """Number of indexed documents."""
        return await self._op(lambda c: c.count())

    async def ping(self) -> None:
        """Readiness check: raises IndexUnavailable unless the collection answers."""
        await self.count()

    # ---- shutdown ----

    async def aclose(self) -> None:
        """Let pending writes finish, then close."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)
        self.close()

    def close(self) -> None:
        """Release the client; later calls raise IndexUnavailable. Await pending upserts first."""
        with self._lock:
            self._closed = True
            client, self._client, self._collection = self._client, None, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                logger.debug("closing the Chroma client failed", exc_info=True)
