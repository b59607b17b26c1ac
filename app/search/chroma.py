"""Connection management for one Chroma collection (embedded ``PersistentClient`` or a
``chroma run`` server, built by app.search.chroma_client), used by
:class:`app.search.index.VectorIndex`.

- The server may be down at start-up or restart later: client and collection are created lazily
  and dropped after a failure, so the next call reconnects. Every failure is ``IndexUnavailable``.
- Chroma's upsert *merges* metadata (old keys survive); ``replace`` sends the old keys as None,
  which deletes them, so the new metadata replaces the old.
- The reads a collection answers (``nearest``, ``distances``, ``metadata_of``) are functions of
  a collection, run by ``ChromaCollection.run`` in a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from chromadb.api.client import Client
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Include
from chromadb.errors import NotFoundError

from app.search.chroma_client import EF_SEARCH, SYNC_THRESHOLD, tuned
from app.search.embedder import Embedder
from app.search.types import Hit, IndexStats, IndexUnavailable, unavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Outage:
    """Tells an outage of the index in two log lines, not one per failed call (a search or
    an outbox retry each fail while it lasts): one when the first call fails, one when a
    call works again, with how many failed meanwhile. Safe across worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed = 0  # calls failed since the outage began; 0: no outage

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failed += 1
            if self._failed > 1:
                return
        cause = exc.__cause__ or exc
        logger.warning(
            "the vector index cannot be reached (%s): calls that need it fail or wait in the "
            "outbox until it answers; failures are counted, not logged, until then",
            type(cause).__name__,
        )

    def worked(self) -> None:
        if not self._failed:  # read without the lock: a stale 0 only defers the line
            return
        with self._lock:
            failed, self._failed = self._failed, 0
        if failed:
            logger.warning("the vector index answers again after %d failed call(s)", failed)


class ChromaCollection:
    """One collection by name, connected lazily and dropped after a failure; the blocking
    methods run in worker threads and are safe to call from several at once."""

    def __init__(
        self,
        connect: Callable[[], Client],
        name: str,
        *,
        remote: bool,
        embedder: Embedder,
        stats: IndexStats,
    ) -> None:
        """``connect`` builds a client and may raise; ``embedder`` is recorded on the
        collection (which model made its vectors); ``stats.connects`` counts connections."""
        self.connect = connect
        self.remote = remote
        self._name = name
        self._embedder = embedder
        self._stats = stats
        self._lock = threading.Lock()  # guards _client/_collection across worker threads
        self._client: Client | None = None
        self._collection: Collection | None = None
        self._closed = False
        self._failed: tuple[float, Exception] | None = None  # when the last attempt failed
        self._outage = _Outage()

    @property
    def client(self) -> Client | None:
        """The current client, if connected."""
        return self._client

    @property
    def name(self) -> str:
        """The name of the collection this looks up."""
        return self._name

    def rename(self, name: str) -> None:
        """Look the collection up by ``name`` from now on."""
        with self._lock:
            self._name = name

    def get(self) -> Collection:
        """The collection, connecting (and creating it) first when needed.

        One attempt at a time, under the lock; the calls that waited for an attempt that
        failed fail with it instead of each trying again in turn (with a server that does
        not answer, each try costs the connect timeout)."""
        asked = time.monotonic()
        with self._lock:
            if self._closed:
                raise IndexUnavailable("vector index is closed")
            if self._collection is None:
                failed = self._failed
                if failed is not None and failed[0] >= asked:
                    raise unavailable(failed[1])
                try:
                    if self._client is None:
                        self._client = self.connect()
                        self._stats.connects += 1
                    collection = self._client.get_or_create_collection(
                        self._name,
                        configuration={
                            "hnsw": {
                                "space": "cosine",
                                "sync_threshold": SYNC_THRESHOLD,
                                "ef_search": EF_SEARCH,
                            }
                        },
                        metadata={"embedder": str(getattr(self._embedder, "model_id", "unknown"))},
                        embedding_function=None,
                    )
                    self._collection = tuned(self._client, collection)
                except Exception as exc:
                    self._failed = (time.monotonic(), exc)
                    raise
                self._failed = None
            return self._collection

    def invalidate(self, failed: Collection | None) -> None:
        """Forget the collection (and, for a server, the client) so the next call reconnects."""
        with self._lock:
            if failed is not None and self._collection is not failed:
                return  # another thread already reconnected; keep the fresh handle
            self._collection = None
            if self.remote and self._client is not None:
                old, self._client = self._client, None
                # Releases Chroma's registry entry (in-flight calls are unaffected); best effort
                # on a client that is already broken.
                with contextlib.suppress(Exception):
                    old.close()

    def run(self, op: Callable[[Collection], T]) -> T:
        """Run ``op`` on the (lazily connected) collection; any failure -> IndexUnavailable.

        A collection that vanished under us (``cstp reindex`` switched to a rebuilt one) is
        looked up again by name and the call retried once, so the switch costs no error.
        """
        try:
            result = self._run(op)
        except IndexUnavailable as exc:
            if not self._closed:  # a call after close() is not an outage
                self._outage.failed(exc)
            raise
        self._outage.worked()
        return result

    def _run(self, op: Callable[[Collection], T]) -> T:
        for attempt in (1, 2):
            collection: Collection | None = None
            try:
                collection = self.get()
                return op(collection)
            except IndexUnavailable:
                raise
            except NotFoundError as exc:
                self.invalidate(collection)
                if attempt == 2:
                    raise unavailable(exc) from exc
            except Exception as exc:
                self.invalidate(collection)
                raise unavailable(exc) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Release the client; later calls raise IndexUnavailable."""
        with self._lock:
            self._closed = True
            client, self._client, self._collection = self._client, None, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing is best effort
                logger.debug("closing the Chroma client failed", exc_info=True)


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


def replace(
    collection: Collection,
    ids: list[str],
    vectors: list[list[float]],
    metadatas: list[dict[str, Any]],
) -> None:
    """Upsert so that the new metadata *replaces* the old (Chroma's upsert merges).

    No document text is stored: SQL holds it, searches never read it back, and Chroma's
    full-text indexing of it is a cost of every upsert."""
    old = collection.get(ids=ids, include=["metadatas"])
    # Chroma's lists are parallel (entry n of each is record n); a record may have no metadata.
    old_metadatas: Sequence[Mapping[str, Any] | None] = old["metadatas"] or [None] * len(old["ids"])
    previous = {i: m or {} for i, m in zip(old["ids"], old_metadatas, strict=True)}
    final: list[dict[str, Any] | None] = []
    for entry_id, metadata in zip(ids, metadatas, strict=True):
        stale = {key: None for key in previous.get(entry_id, {}) if key not in metadata}
        final.append({**metadata, **stale} or None)  # None deletes a key; {} is rejected
    # Chroma's annotations are narrower than what it takes: a list of float lists (they want an
    # invariant list of Sequences) and None for an entry with no metadata (it rejects {}).
    collection.upsert(ids=ids, embeddings=vectors, metadatas=final)  # type: ignore[arg-type]  # Chroma is stricter on paper, see above


# ---- the reads of a collection (each run by ``ChromaCollection.run`` in a worker thread) ----


def nearest(
    embedding: list[float], where: dict[str, Any] | None, limit: int, metadata: bool
) -> Callable[[Collection], list[Hit]]:
    """The query of the ``limit`` nearest to ``embedding`` that satisfy ``where``, nearest
    first (ties by id); without ``metadata``, hits with none (Chroma answers faster)."""
    include: Include = ["metadatas", "distances"] if metadata else ["distances"]
    queries: list[Sequence[float] | Sequence[int]] = [embedding]

    def op(c: Collection) -> list[Hit]:
        res = c.query(query_embeddings=queries, n_results=limit, where=where, include=include)
        metas = (res["metadatas"] or [[]])[0] if metadata else []
        distances = (res["distances"] or [[]])[0]
        hits = [
            Hit(i, float(d), dict(metas[n] or {}) if metadata else {})
            for n, (i, d) in enumerate(zip(res["ids"][0], distances, strict=True))
        ]
        return sorted(hits, key=lambda h: (h.distance, h.id))

    return op


def distances(c: Collection, *, vector: Sequence[float], ids: list[str]) -> dict[str, float]:
    """The cosine distance from ``vector`` to each of ``ids`` the collection holds, from
    their stored vectors."""
    res = c.get(ids=ids, include=["embeddings"])
    found = res["ids"]
    if not found or res["embeddings"] is None:
        return {}
    stored = np.asarray(res["embeddings"], dtype=np.float32)
    query = np.asarray(vector, dtype=np.float32)
    norms = np.linalg.norm(stored, axis=1) * float(np.linalg.norm(query))
    cosine = (stored @ query) / np.where(norms == 0.0, 1.0, norms)
    return {i: float(1.0 - value) for i, value in zip(found, cosine, strict=True)}


def metadata_of(c: Collection, *, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored metadata of each of ``ids`` the collection holds."""
    res = c.get(ids=ids, include=["metadatas"])
    found = res["ids"]  # the lists are parallel: entry n of each is record n
    metadatas: Sequence[Mapping[str, Any] | None] = res["metadatas"] or [None] * len(found)
    return {i: dict(m or {}) for i, m in zip(found, metadatas, strict=True)}
