"""The floor: what any implementation has to pay for one semantic lookup on this machine.

floor = p50 of one embedding of a one-sentence intent + p50 of one top-5 query against a Chroma
collection of the same size holding precomputed vectors (embedded Chroma, cosine space, no
filter). Both are measured in the harness process while the server is idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.stats import summarize

EMBED_BATCH = 64
ADD_BATCH = 1000


class Deadline:
    """A phase's time cap, checked between units of work."""

    def __init__(self, what: str, seconds: float) -> None:
        self.what, self.seconds = what, seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def check(self) -> None:
        if time.monotonic() > self.at:
            from bench.server import BenchError

            raise BenchError(f"{self.what} took longer than its cap of {self.seconds:.0f} s")


def time_embedding(
    embedder: Any, texts: Sequence[str], repeats: int, deadline: Deadline
) -> dict[str, Any]:
    """p50 etc. of ``embed([text])`` over ``repeats`` calls, after a short warm-up."""
    for text in texts[:10]:
        embedder.embed([text])
    samples = []
    for i in range(repeats):
        text = texts[i % len(texts)]
        start = time.perf_counter()
        embedder.embed([text])
        samples.append((time.perf_counter() - start) * 1000)
        deadline.check()
    return summarize(samples)


class FloorIndex:
    """An in-process Chroma collection that grows with the server's corpus."""

    def __init__(self, path: Path) -> None:
        import chromadb
        from chromadb.config import Settings

        path.mkdir(parents=True, exist_ok=True)
        self._client = chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False)
        )
        self._collection = self._client.get_or_create_collection(
            "bench_floor", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
        )
        self.count = 0

    def add(
        self,
        embedder: Any,
        documents: Sequence[str],
        deadline: Deadline,
        progress: Callable[[int], None] | None = None,
    ) -> float:
        """Embed ``documents`` in batches and add them; returns the seconds it took."""
        start = time.monotonic()
        pending_ids: list[str] = []
        pending_vecs: list[list[float]] = []
        pending_docs: list[str] = []
        for offset in range(0, len(documents), EMBED_BATCH):
            chunk = list(documents[offset : offset + EMBED_BATCH])
            vectors = embedder.embed(chunk)
            for doc, vec in zip(chunk, vectors, strict=True):
                pending_ids.append(f"d{self.count + len(pending_ids)}")
                pending_vecs.append(vec)
                pending_docs.append(doc)
            if len(pending_ids) >= ADD_BATCH:
                self._flush(pending_ids, pending_vecs, pending_docs)
            if progress:
                progress(min(offset + EMBED_BATCH, len(documents)))
            deadline.check()
        self._flush(pending_ids, pending_vecs, pending_docs)
        return time.monotonic() - start

    def _flush(self, ids: list[str], vecs: list[list[float]], docs: list[str]) -> None:
        if ids:
            self._collection.add(ids=list(ids), embeddings=list(vecs), documents=list(docs))
            self.count += len(ids)
            ids.clear()
            vecs.clear()
            docs.clear()

    def time_query(
        self, vectors: Sequence[list[float]], repeats: int, deadline: Deadline
    ) -> dict[str, Any]:
        for vec in vectors[:10]:
            self._collection.query(query_embeddings=[vec], n_results=5)
        samples = []
        for i in range(repeats):
            vec = vectors[i % len(vectors)]
            start = time.perf_counter()
            self._collection.query(query_embeddings=[vec], n_results=5)
            samples.append((time.perf_counter() - start) * 1000)
            deadline.check()
        return summarize(samples)
