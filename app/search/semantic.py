"""The vector side of search: the index's nearest hits, checked against every filter in SQL.

A filtered search first probes the nearest PROBE times as many hits as it needs, unfiltered,
and keeps those whose rows match; when that holds too few, it looks WIDEN times further, then
ranks the matches exactly from their stored vectors when SQL finds at most EXACT_AT_MOST of
them, and only then leaves the filter to Chroma's ``where`` (``nearest``). The hybrid search
(``app.search.service``) reuses the probe and the ways of looking further.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from sqlalchemy import Connection

from app.operations.context import CallContext
from app.records import repository
from app.records.entries import index_metadata
from app.records.filters import SearchFilters, matches, to_where

from .repository import filter_sql
from .types import Hit

OVERFETCH = 10  # extra hits asked of the index, in case some are stale and dropped
PROBE = 4  # a filtered search first looks this many times further, unfiltered
WIDEN = 8  # and then, when that held too few matches, this many times further still
EXACT_AT_MOST = 200  # matches few enough to rank exactly from their stored vectors


@dataclass(frozen=True)
class Match:
    """A result: ``distance`` is the cosine distance (0 = same meaning), None for a
    decision the vector side did not find (unless every distance was asked for); ``score``
    is what the results are ordered by (see ``query_decisions``)."""

    decision: repository.Brief
    distance: float | None
    score: float


async def probe(
    ctx: CallContext, text: str, filters: SearchFilters, limit: int
) -> tuple[list[float], list[Hit]]:
    """The query's vector and the index's first answer, in one trip to a worker thread:
    the nearest ``limit + OVERFETCH``, or PROBE times as many when filtered (see
    ``nearest``). Ids and distances only: reading Chroma's metadata costs more than the
    nearest-neighbour search itself, and SQL has the last word on every filter anyway."""
    wanted = limit + OVERFETCH
    first = wanted if filters.is_empty() else wanted * PROBE
    return await ctx.services.index.query_text(
        text, workspace=filters.workspace, limit=first, metadata=False
    )


async def nearest(
    ctx: CallContext,
    vector: list[float],
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Match]:
    """The nearest decisions satisfying every filter, from the probe's hits. A search keeps
    the probe's hits whose rows match (unfiltered, those not superseded): when that yields
    ``limit`` results, or the probe saw the whole collection, they are exactly the query's
    results. Otherwise it looks further: ``wider``, then ``by_filter``. Raises
    IndexUnavailable."""
    wanted = limit + OVERFETCH
    probed = wanted if filters.is_empty() else wanted * PROBE
    found = await _verified(ctx, hits, filters, limit, tags, reasons)
    # Unfiltered, only superseded decisions (or stale entries) are dropped: rarely so many
    # that the probe's overfetch does not make up for them, but then it looks further too.
    if len(found) == limit or len(hits) < probed:
        return found
    hits, complete = await wider(ctx, vector, probed, filters.workspace)
    found = await _verified(ctx, hits, filters, limit, tags, reasons)
    if len(found) == limit or complete:
        return found
    hits = await by_filter(ctx, vector, filters, wanted)
    return await _verified(ctx, hits, filters, limit, tags, reasons)


# A filtered search whose probe held too few matches looks further. Chroma pre-filters a
# ``where`` query by scanning metadata, which grows with the collection whatever the filter
# (even for a filter that few decisions match), so that comes last: first the ``WIDEN`` x
# nearest, unfiltered, which costs little more than the probe; then, when SQL finds at most
# ``EXACT_AT_MOST`` decisions that satisfy the filters, those, ranked exactly from their
# stored vectors (read by id, cheap for so few); docs/ARCHITECTURE.md, "Search", has the
# figures.


async def wider(
    ctx: CallContext, vector: list[float], probed: int, workspace: str
) -> tuple[list[Hit], bool]:
    """The ``WIDEN`` x ``probed`` nearest of ``workspace``, unfiltered otherwise, and whether
    they are its whole collection (then every match is among them)."""
    asked = probed * WIDEN
    hits = await ctx.services.index.query_vector(
        vector, workspace=workspace, limit=asked, metadata=False
    )
    return hits, len(hits) < asked


async def by_filter(
    ctx: CallContext, vector: list[float], filters: SearchFilters, limit: int
) -> list[Hit]:
    """The nearest ``limit`` indexed decisions that satisfy ``filters``: every one of them
    when SQL finds at most ``EXACT_AT_MOST``, ranked by their stored vectors; else the index's
    own filtered query."""
    index = ctx.services.index
    ids = await ctx.services.db.read(
        functools.partial(filter_sql.matching_ids, f=filters, cap=EXACT_AT_MOST + 1),
        session=ctx.open_session,
    )
    if len(ids) > EXACT_AT_MOST:
        return await index.query_vector(
            vector,
            workspace=filters.workspace,
            where=to_where(filters),
            limit=limit,
            metadata=False,
        )
    known = await index.distances(vector, ids, workspace=filters.workspace)
    ranked = sorted(known.items(), key=lambda item: (item[1], item[0]))[:limit]
    return [Hit(i, max(0.0, distance), {}) for i, distance in ranked]


async def _verified(
    ctx: CallContext,
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Match]:
    """The hits whose row in SQL (the source of truth) satisfies the filters, in order.

    Read by ``Database.read``: on SQLite in a read transaction of its own (a write method,
    announceIntent, must not hold the write lock while it searches), on Postgres in the
    call's own transaction (fewer round trips)."""
    return await ctx.services.db.read(
        functools.partial(
            _read_verified, hits=hits, filters=filters, limit=limit, tags=tags, reasons=reasons
        ),
        session=ctx.open_session,
    )


def _read_verified(
    conn: Connection,
    *,
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Match]:
    """Rows are read as plain column values (``repository.Brief``). Unfiltered, nearly every
    hit is kept, so rows are read ``limit`` at a time (doubling); filtered, the whole list is
    read at once, one statement instead of several. Tags are read before the check only when
    a filter needs them, else only for the results."""
    found: list[Match] = []
    filtered = not filters.is_empty()
    current = not filters.include_superseded  # checked alone when nothing else is filtered
    start, chunk = 0, max(1, len(hits) if filtered else limit)
    while start < len(hits) and len(found) < limit:
        batch = hits[start : start + chunk]
        start, chunk = start + chunk, chunk * 2
        rows = repository.load_briefs(conn, [h.id for h in batch], filters.workspace)
        if filters.tags:
            repository.add_tags(conn, list(rows.values()))
        for hit in batch:
            row = rows.get(hit.id)
            if row is None or (filtered and not matches(filters, index_metadata(row))):
                continue
            if current and row.superseded_by is not None:
                continue
            distance = max(0.0, hit.distance)
            found.append(Match(row, distance, 1.0 - distance))
            if len(found) == limit:
                break
    complete(conn, [f.decision for f in found], tags and not filters.tags, reasons)
    return found


def complete(conn: Connection, briefs: list[repository.Brief], tags: bool, reasons: bool) -> None:
    if tags:
        repository.add_tags(conn, briefs)
    if reasons:
        repository.add_reasons(conn, briefs)


async def with_distances(
    ctx: CallContext, vector: list[float], found: list[Match], workspace: str
) -> list[Match]:
    """``found`` (of ``workspace``) with the distance of each result that has none, from its
    stored vector; left None for a decision the index does not hold. Raises
    IndexUnavailable."""
    missing = [m.decision.id for m in found if m.distance is None]
    if not missing:
        return found
    known = await ctx.services.index.distances(vector, missing, workspace=workspace)
    return [
        m
        if m.distance is not None or m.decision.id not in known
        else replace(m, distance=max(0.0, known[m.decision.id]))
        for m in found
    ]
