"""Search over decisions: by meaning (the vector index), by words (the database's own
full-text index) or both (hybrid, the default); the database has the last word.

Semantic: the vector hits are read from SQL (the source of truth) and checked against every
filter there, so a stale index entry (say, a review not yet re-indexed) can never leak a
result that breaks a filter; when the nearest hits hold too few matches, the filters are
pushed down into Chroma, so a top-k search never loses a match (see ``_semantic``).
Keyword: one SQL statement ranks the decisions that match and applies every filter
(``app.search.keyword``). Hybrid: both sides' best candidates, merged by
``app.search.fusion``; the keyword statement runs while the query is embedded.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import Connection

from app.decisions import document, repository
from app.errors import query_failed
from app.operations.context import CallContext
from app.operations.params import parse_timestamp

from . import filter_sql, fusion, keyword
from .filters import SearchFilters, matches, to_where
from .schemas import QueryDecisionsParams, QueryFiltersIn
from .types import Hit, IndexUnavailable

Mode = Literal["semantic", "keyword", "hybrid"]
MODES: dict[str, Mode] = {"semantic": "semantic", "keyword": "keyword", "hybrid": "hybrid"}
#: What queryDecisions and announceIntent search with when not told: the setting
#: CSTP_RETRIEVAL_MODE, hybrid unless set (chosen by the benchmark, docs/QUALITY.md).
DEFAULT_MODE: Mode = "hybrid"


def default_mode(ctx: CallContext) -> Mode:
    return MODES.get(ctx.services.settings.retrieval_mode, DEFAULT_MODE)


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


@dataclass(frozen=True)
class Found:
    """A result with its cosine distance (announceIntent shows and records every one)."""

    decision: repository.Brief
    distance: float
    score: float


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
    mode: Mode | None = None,
) -> list[Found]:
    """The best ``limit`` decisions satisfying every filter, best first, each with its
    cosine distance: one the keyword side alone found gets it from its stored vector (a
    decision the vector index does not hold yet has none and is left out). -32003 if the
    index fails."""
    found = await find(
        ctx, text, filters, limit, tags=tags, reasons=reasons, mode=mode, distances=True
    )
    return [Found(m.decision, m.distance, m.score) for m in found if m.distance is not None]


async def find(
    ctx: CallContext,
    text: str,
    filters: SearchFilters,
    limit: int,
    *,
    tags: bool = True,
    reasons: bool = False,
    mode: Mode | None = None,
    distances: bool = False,
) -> list[Match]:
    """The best ``limit`` decisions satisfying every filter, best first, by ``mode`` (the
    server's default mode when None).
    ``tags`` and ``reasons`` say whether the results need each decision's tags and reasons;
    ``distances`` whether every result needs its cosine distance. -32003 if the index fails
    (semantic and hybrid; keyword only when asked for distances)."""
    mode = mode or default_mode(ctx)
    try:
        if mode == "keyword":
            found = await ctx.services.db.read(
                functools.partial(
                    _read_keyword,
                    text=text,
                    filters=filters,
                    limit=limit,
                    tags=tags,
                    reasons=reasons,
                ),
                session=ctx.session,
            )
            if distances and found:
                vector = await ctx.services.index.embed_query(text)
                found = await _with_distances(ctx, vector, found)
            return found
        if mode == "semantic":
            vector, hits = await _probe(ctx, text, filters, limit)
            return await _semantic(ctx, vector, hits, filters, limit, tags, reasons)
        return await _hybrid(ctx, text, filters, limit, tags, reasons, distances)
    except IndexUnavailable:
        raise query_failed() from None


async def _with_distances(ctx: CallContext, vector: list[float], found: list[Match]) -> list[Match]:
    """``found`` with the distance of each result that has none, from its stored vector;
    left None for a decision the index does not hold. Raises IndexUnavailable."""
    missing = [m.decision.id for m in found if m.distance is None]
    if not missing:
        return found
    known = await ctx.services.index.distances(vector, missing)
    return [
        m
        if m.distance is not None or m.decision.id not in known
        else replace(m, distance=max(0.0, known[m.decision.id]))
        for m in found
    ]


# ---------------------------------------------------------------- semantic


async def _probe(
    ctx: CallContext, text: str, filters: SearchFilters, limit: int
) -> tuple[list[float], list[Hit]]:
    """The query's vector and the index's first answer, in one trip to a worker thread:
    the nearest ``limit + OVERFETCH``, or PROBE times as many when filtered (see
    ``_semantic``). Ids and distances only: reading Chroma's metadata costs more than the
    nearest-neighbour search itself (top-60 at 10,000 decisions: 3.7 ms with metadata, 1.1
    ms without), and SQL has the last word on every filter anyway."""
    wanted = limit + OVERFETCH
    first = wanted if filters.is_empty() else wanted * PROBE
    return await ctx.services.index.query_text(text, limit=first, metadata=False)


async def _semantic(
    ctx: CallContext,
    vector: list[float],
    hits: list[Hit],
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Match]:
    """The nearest decisions satisfying every filter, from the probe's hits. A filtered
    search keeps the probe's hits whose rows match: when that yields ``limit`` results, or
    the probe saw the whole collection, they are exactly the filtered query's results.
    Otherwise it looks further: ``_wider``, then ``_by_filter``. Raises IndexUnavailable."""
    wanted = limit + OVERFETCH
    if not filters.is_empty():
        found = await _verified(ctx, hits, filters, limit, tags, reasons)
        if len(found) == limit or len(hits) < wanted * PROBE:
            return found
        hits, complete = await _wider(ctx, vector, wanted * PROBE)
        if not complete:
            found = await _verified(ctx, hits, filters, limit, tags, reasons)
            if len(found) == limit:
                return found
            hits = await _by_filter(ctx, vector, filters, wanted)
    return await _verified(ctx, hits, filters, limit, tags, reasons)


# A filtered search whose probe held too few matches looks further. Chroma pre-filters a
# ``where`` query by scanning metadata, which grows with the collection whatever the filter
# (~9 ms at 10,000 decisions, ~110 ms at 100,000 even for a filter that 500 decisions
# match), so that comes last: first the ``WIDEN`` x nearest, unfiltered (~6 ms for 480 at
# 100,000); then, when SQL finds at most ``EXACT_AT_MOST`` decisions that satisfy the
# filters, those, ranked exactly from their stored vectors (read by id, ~55 µs a vector).


async def _wider(ctx: CallContext, vector: list[float], probed: int) -> tuple[list[Hit], bool]:
    """The ``WIDEN`` x ``probed`` nearest, unfiltered, and whether they are the whole
    collection (then every match is among them)."""
    asked = probed * WIDEN
    hits = await ctx.services.index.query_vector(vector, limit=asked, metadata=False)
    return hits, len(hits) < asked


async def _by_filter(
    ctx: CallContext, vector: list[float], filters: SearchFilters, limit: int
) -> list[Hit]:
    """The nearest ``limit`` indexed decisions that satisfy ``filters``: every one of them
    when SQL finds at most ``EXACT_AT_MOST``, ranked by their stored vectors; else the index's
    own filtered query."""
    index = ctx.services.index
    ids = await ctx.services.db.read(
        functools.partial(filter_sql.matching_ids, f=filters, cap=EXACT_AT_MOST + 1),
        session=ctx.session,
    )
    if len(ids) > EXACT_AT_MOST:
        return await index.query_vector(
            vector, where=to_where(filters), limit=limit, metadata=False
        )
    known = await index.distances(vector, ids)
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
) -> list[Match]:
    """Rows are read as plain column values (``repository.Brief``). Unfiltered, nearly every
    hit is kept, so rows are read ``limit`` at a time (doubling); filtered, the whole list is
    read at once, one statement instead of several. Tags are read before the check only when
    a filter needs them, else only for the results."""
    found: list[Match] = []
    filtered = not filters.is_empty()
    start, chunk = 0, max(1, len(hits) if filtered else limit)
    while start < len(hits) and len(found) < limit:
        batch = hits[start : start + chunk]
        start, chunk = start + chunk, chunk * 2
        rows = repository.load_briefs(conn, [h.id for h in batch])
        if filters.tags:
            repository.add_tags(conn, list(rows.values()))
        for hit in batch:
            row = rows.get(hit.id)
            if row is None or (filtered and not matches(filters, document.index_metadata(row))):
                continue
            distance = max(0.0, hit.distance)
            found.append(Match(row, distance, 1.0 - distance))
            if len(found) == limit:
                break
    _complete(conn, [f.decision for f in found], tags and not filters.tags, reasons)
    return found


def _complete(conn: Connection, briefs: list[repository.Brief], tags: bool, reasons: bool) -> None:
    if tags:
        repository.add_tags(conn, briefs)
    if reasons:
        repository.add_reasons(conn, briefs)


# ---------------------------------------------------------------- keyword


def _read_keyword(
    conn: Connection,
    *,
    text: str,
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
) -> list[Match]:
    hits = keyword.search(conn, text, filters, limit)
    _complete(conn, [h.decision for h in hits], tags, reasons)
    return [Match(h.decision, None, h.score) for h in hits]


# ---------------------------------------------------------------- hybrid


async def _hybrid(
    ctx: CallContext,
    text: str,
    filters: SearchFilters,
    limit: int,
    tags: bool,
    reasons: bool,
    distances: bool,
) -> list[Match]:
    """Each side's best ``depth`` candidates (satisfying the filters), merged. The index's
    probe (the embedding, then Chroma, in a worker thread) is started first and the keyword
    statement runs while it works (on SQLite on this thread, which the probe's thread does
    not need; on Postgres in the call's transaction). Then one read checks the probe's hits
    against the filters in SQL, merges and reads the results' tags. A filtered probe is as
    wide as a semantic search's (PROBE times its limit and overfetch); when it held fewer
    than ``limit`` matches, the search looks further, as a semantic search does.
    Raises IndexUnavailable."""
    depth = max(fusion.DEPTH, limit + OVERFETCH)
    filtered = not filters.is_empty()
    first = (limit + OVERFETCH) * PROBE if filtered else depth
    index, db = ctx.services.index, ctx.services.db
    probe = asyncio.ensure_future(index.query_text(text, limit=first, metadata=False))
    await asyncio.sleep(0)  # the probe reaches its worker thread before the read below
    try:
        by_words = await db.read(
            functools.partial(keyword.search, query=text, filters=filters, limit=depth),
            session=ctx.session,
        )
    except BaseException:
        await asyncio.gather(probe, return_exceptions=True)  # never left running unobserved
        raise
    vector, hits = await probe
    merge = functools.partial(
        _read_hybrid,
        by_words=by_words,
        filters=filters,
        limit=limit,
        depth=depth,
        words=len(keyword.terms(text)),
        tags=tags,
        reasons=reasons,
    )
    found = await db.read(
        functools.partial(merge, hits=hits, enough=not filtered or len(hits) < first),
        session=ctx.session,
    )
    if found is None:  # too few matches among the probe's hits: look further, as _semantic
        hits, complete = await _wider(ctx, vector, first)
        found = await db.read(
            functools.partial(merge, hits=hits, enough=complete), session=ctx.session
        )
    if found is None:
        hits = await _by_filter(ctx, vector, filters, depth + OVERFETCH)
        found = await db.read(functools.partial(merge, hits=hits, enough=True), session=ctx.session)
    assert found is not None  # enough=True always merges
    if distances:
        found = await _with_distances(ctx, vector, found)
    return found


def _read_hybrid(
    conn: Connection,
    *,
    hits: list[Hit],
    by_words: list[keyword.KeywordHit],
    filters: SearchFilters,
    limit: int,
    depth: int,
    words: int,
    tags: bool,
    reasons: bool,
    enough: bool,
) -> list[Match] | None:
    """The vector side's hits whose rows satisfy the filters (in SQL), nearest first, merged
    with the keyword side's; None when they are fewer than ``limit`` and not ``enough``
    (the probe may have missed matches). The results get fresh briefs with their tags and
    reasons as asked."""
    rows = filter_sql.matching_briefs(conn, [h.id for h in hits], filters)
    by_meaning = [(h.id, max(0.0, h.distance)) for h in hits if h.id in rows][:depth]
    if len(by_meaning) < limit and not enough:
        return None
    merged = fusion.fuse(by_meaning, [(h.decision.id, h.score) for h in by_words], words)
    briefs = {h.decision.id: h.decision for h in by_words}
    briefs.update(rows)
    found = [
        Match(replace(briefs[m.id], tag_names=[], reasons=[]), m.distance, m.score)
        for m in merged[:limit]
    ]
    _complete(conn, [m.decision for m in found], tags, reasons)
    return found


# ---------------------------------------------------------------- queryDecisions


def summary(found: Match, *, include_reasons: bool) -> dict[str, Any]:
    item = document.list_item(found.decision)
    if found.distance is not None:
        item["distance"] = round(found.distance, 6)
    item["score"] = round(found.score, 6)
    if include_reasons:
        item["reasons"] = document.reasons_of(found.decision)
    return item


async def query_decisions(ctx: CallContext, p: QueryDecisionsParams) -> dict[str, Any]:
    started = time.perf_counter()
    filters = to_filters(p.filters)
    mode: Mode = p.retrieval_mode or default_mode(ctx)
    found = await find(ctx, p.query, filters, p.limit, reasons=p.include_reasons, mode=mode)
    return {
        "decisions": [summary(f, include_reasons=p.include_reasons) for f in found],
        "total": len(found),
        "query": p.query,
        "queryTimeMs": round((time.perf_counter() - started) * 1000, 2),
        "agent": ctx.agent,
        "retrievalMode": mode,
    }
