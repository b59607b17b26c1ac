"""What the vector index's modules share: the entries and hits they pass around, the counters
and the one error every failure becomes.

``app.search.index`` (the facade), ``app.search.chroma`` (the connection) and
``app.search.batching`` (the group commit) all use these; they live here, below all three, so
that none of those modules needs another one that needs it back. Nothing here imports Chroma.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What the index stores is a decision's entry, built in app.records.entries.
from app.records.entries import IndexEntry

__all__ = [
    "Hit",
    "IndexEntry",
    "IndexStats",
    "IndexUnavailable",
    "unavailable",
]


@dataclass(frozen=True)
class Hit:
    """A search result; ``distance`` is Chroma's cosine distance (0 = same meaning)."""

    id: str
    distance: float
    metadata: dict[str, Any]


@dataclass
class IndexStats:
    """Counters for tests and metrics (``connects`` changes under the lock, the rest on the
    loop)."""

    upsert_calls: int = 0
    flushes: int = 0
    entries_written: int = 0
    queries: int = 0
    failures: int = 0
    connects: int = 0


class IndexUnavailable(Exception):
    """Chroma cannot be reached or used; the cause is chained, the message stays generic."""


def unavailable(exc: BaseException) -> IndexUnavailable:
    """A fresh generic error per waiter, chained to the root cause (not to another wrapper)."""
    if isinstance(exc, IndexUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    err = IndexUnavailable("vector index unavailable")
    err.__cause__ = exc
    return err
