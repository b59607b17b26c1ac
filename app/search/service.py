"""Semantic search over decisions: the vector index ranks, the database has the last word.

The hits are read from SQL (the source of truth) and checked against every filter there, so
a stale index entry (say, a review not yet re-indexed) can never leak a result that breaks a
filter; when the nearest hits hold too few matches, the filters are pushed down into Chroma,
so a top-k search never loses a match (see ``search``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.decisions import document
from app.errors import query_failed
from app.operations.context import CallContext
from app.operations.params import parse_timestamp

from .filters import SearchFilters, matches, to_where
from .schemas import QueryDecisionsParams, QueryFiltersIn
from .types import Hit, IndexUnavailable

OVERFETCH = 10  # extra hits asked of the index, in case some are stale and dropped
PROBE = 4  # a filtered search first looks this many times further, unfiltered


@dataclass(frozen=True)
class Found:
    decision: document.Brief
    distance: float


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def to_filters(f: QueryFiltersIn | None, *, category: str | None = None) -> SearchFilters:
    if f is None:
        return SearchFilters(category=category)
    return SearchFilters(
        category=f.category if f.category is not None else category,
        stakes=_as_tuple(f.stakes),
        status=_as_tuple(f.status),
        min_confidence=f.min_confidence,
        max_confidence=f.max_confidence,
        date_after=parse_timestamp("filters.dateAfter", f.date_after) if f.date_after else None,
        date_before=(
            parse_timestamp("filters.dateBefore", f.date_before) if f.date_before else None
        ),
        agent=f.agent,
        tags=tuple(f.tags) if f.tags else None,
        project=f.project,
        feature=f.feature,
        pr=f.pr,
        has_outcome=f.has_outcome,
    )


async def search(
    ctx: CallContext,
    text: str,
    filters: SearchFilters,
    limit: int,
    *,
    tags: bool = True,
    reasons: bool = False,
) -> list[Found]:
    """Nearest decisions satisfying every filter, nearest first. -32003 if the index fails.

    The index is asked only for ids and distances: reading Chroma's metadata costs more than
    the nearest-neighbour search itself (top-60 at 10,000 decisions: 3.7 ms with metadata,
    1.1 ms without), and SQL has the last word on every filter anyway. Chroma pre-filters a
    ``where`` query by scanning metadata, which grows with the corpus (9 ms for a top-15 at
    10,000 decisions), so a filtered search first probes the nearest ``PROBE`` x as many
    decisions unfiltered and keeps those whose rows match: when that yields ``limit``
    results, or the probe saw the whole collection, they are exactly the filtered query's
    results. Otherwise it asks Chroma with the ``where`` clause, which never misses a match.
    ``tags`` and ``reasons`` say whether the results need each decision's tags and reasons.
    """
    index = ctx.services.index
    wanted = limit + OVERFETCH
    where = to_where(filters)
    try:
        # The embedding and the first query share one trip to a worker thread.
        first = wanted if where is None else wanted * PROBE
        vector, hits = await index.query_text(text, limit=first, metadata=False)
        if where is not None:
            found = await _verified(ctx, hits, filters, limit, tags, reasons)
            if len(found) == limit or len(hits) < first:
                return found
            hits = await index.query_vector(vector, where=where, limit=wanted, metadata=False)
    except IndexUnavailable:
        raise query_failed() from None
    return await _verified(ctx, hits, filters, limit, tags, reasons)


async def _verified(
    ctx: CallContext,
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Found]:
    """The hits whose row in SQL (the source of truth) satisfies the filters, in order.

    Read by ``Database.read``: on SQLite in a read transaction of its own (a write method,
    announceIntent, must not hold the write lock while it searches), on Postgres in the
    call's own transaction (fewer round trips)."""
    return await ctx.services.db.read(
        functools.partial(
            _read_verified, hits=hits, filters=filters, limit=limit, tags=tags, reasons=reasons
        ),
        session=ctx.session,
    )


def _read_verified(
    conn: Connection,
    *,
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Found]:
    """Rows are read as plain column values (``document.Brief``). Unfiltered, nearly every
    hit is kept, so rows are read ``limit`` at a time (doubling); filtered, the whole list is
    read at once, one statement instead of several. Tags are read before the check only when
    a filter needs them, else only for the results."""
    found: list[Found] = []
    filtered = not filters.is_empty()
    start, chunk = 0, max(1, len(hits) if filtered else limit)
    while start < len(hits) and len(found) < limit:
        batch = hits[start : start + chunk]
        start, chunk = start + chunk, chunk * 2
        rows = document.load_briefs(conn, [h.id for h in batch])
        if filters.tags:
            document.add_tags(conn, list(rows.values()))
        for hit in batch:
            row = rows.get(hit.id)
            if row is None or (filtered and not matches(filters, document.index_metadata(row))):
                continue
            found.append(Found(row, max(0.0, hit.distance)))
            if len(found) == limit:
                break
    briefs = [f.decision for f in found]
    if tags and not filters.tags:
        document.add_tags(conn, briefs)
    if reasons:
        document.add_reasons(conn, briefs)
    return found


def summary(found: Found, *, include_reasons: bool) -> dict[str, Any]:
    item = document.list_item(found.decision)
    item["distance"] = round(found.distance, 6)
    if include_reasons:
        item["reasons"] = document.reasons_of(found.decision)
    return item


async def query_decisions(ctx: CallContext, p: QueryDecisionsParams) -> dict[str, Any]:
    started = time.perf_counter()
    filters = to_filters(p.filters)
    found = await search(ctx, p.query, filters, p.limit, reasons=p.include_reasons)
    return {
        "decisions": [summary(f, include_reasons=p.include_reasons) for f in found],
        "total": len(found),
        "query": p.query,
        "queryTimeMs": round((time.perf_counter() - started) * 1000, 2),
        "agent": ctx.agent,
        "retrievalMode": "semantic",
    }
