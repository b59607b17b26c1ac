"""The hybrid search (app.search.service): the vector side's and the keyword side's best
candidates, both checked against every filter in SQL, merged by ``app.search.fusion``; the
keyword statement runs while the query is embedded."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace

from sqlalchemy import Connection

from app.operations.context import CallContext
from app.records.filters import SearchFilters

from . import fusion, keyword, semantic
from .repository import filter_sql
from .semantic import Match
from .types import Hit


async def search(
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
    depth = max(fusion.DEPTH, limit + semantic.OVERFETCH)
    filtered = not filters.is_empty()
    first = (limit + semantic.OVERFETCH) * semantic.PROBE if filtered else depth
    index, db = ctx.services.index, ctx.services.db
    probe = asyncio.ensure_future(
        index.query_text(text, workspace=filters.workspace, limit=first, metadata=False)
    )
    await asyncio.sleep(0)  # the probe reaches its worker thread before the read below
    try:
        by_words = await db.read(
            functools.partial(keyword.search, query=text, filters=filters, limit=depth),
            session=ctx.open_session,
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
    # Unfiltered, the probe's hits can fall short only by superseded decisions (or stale
    # entries): then it looks further too.
    found = await db.read(
        functools.partial(merge, hits=hits, enough=len(hits) < first), session=ctx.open_session
    )
    if found is None:  # too few matches among the probe's hits: look further, as nearest
        hits, complete = await semantic.wider(ctx, vector, first, filters.workspace)
        found = await db.read(
            functools.partial(merge, hits=hits, enough=complete), session=ctx.open_session
        )
    if found is None:
        hits = await semantic.by_filter(ctx, vector, filters, depth + semantic.OVERFETCH)
        found = await db.read(
            functools.partial(merge, hits=hits, enough=True), session=ctx.open_session
        )
    assert found is not None  # enough=True always merges
    if distances:
        found = await semantic.with_distances(ctx, vector, found, filters.workspace)
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
    semantic.complete(conn, [m.decision for m in found], tags, reasons)
    return found
