"""What a metadata ``where`` costs Chroma on a large collection (docs/performance-history.md,
"Workspaces, issue #38"): the measurement behind one collection per workspace.

    python -m bench.chroma_filter [--entries 100000] [--queries 50]

One embedded collection of random 384-dimension vectors (cosine), 1% tagged
``workspace: small`` and the rest ``big``; the top 20 of each query, unfiltered and filtered.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import chromadb
import numpy as np

BATCH = 5000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.chroma_filter")
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=50)
    args = p.parse_args()
    client = chromadb.PersistentClient(path=tempfile.mkdtemp(prefix="cstp-chroma-filter-"))
    collection = client.get_or_create_collection(
        "filter-cost", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((args.entries, 384)).astype(np.float32)
    started = time.monotonic()
    for start in range(0, args.entries, BATCH):
        span = range(start, min(args.entries, start + BATCH))
        collection.upsert(
            ids=[f"id{i}" for i in span],
            embeddings=vectors[span.start : span.stop],
            metadatas=[
                {"workspace": "small" if i % 100 == 0 else "big", "status": "pending"} for i in span
            ],
        )
    print(f"{args.entries} entries written in {time.monotonic() - started:.0f} s")
    queries = rng.standard_normal((args.queries, 384)).astype(np.float32)
    small_and_pending = {"$and": [{"workspace": "small"}, {"status": "pending"}]}
    filters: list[Any] = [None, {"workspace": "small"}, {"workspace": "big"}, small_and_pending]
    for where in filters:
        took = []
        for vector in queries:
            t = time.perf_counter()
            collection.query(
                query_embeddings=[vector], n_results=20, where=where, include=["distances"]
            )
            took.append((time.perf_counter() - t) * 1000)
        took.sort()
        p50, p95 = took[len(took) // 2], took[int(len(took) * 0.95) - 1]
        print(f"where={where}: p50 {p50:.2f} ms, p95 {p95:.2f} ms")


if __name__ == "__main__":
    main()
