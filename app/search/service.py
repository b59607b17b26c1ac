"""Search over decisions: by meaning (the vector index), by words (the database's own
full-text index) or both (hybrid, the default); the database has the last word.

Semantic: the vector hits are read from SQL (the source of truth) and checked against every
filter there, so a stale index entry (say, a review not yet re-indexed) can never leak a
result that breaks a filter; when the nearest hits hold too few matches, the filters are
pushed down into Chroma, so a top-k search never loses a match (see ``semantic.nearest``).
Keyword: one SQL statement ranks the decisions that match and applies every filter
(``app.search.keyword``). Hybrid (``app.search.hybrid``): both sides' best candidates, merged by
``app.search.fusion``; the keyword statement runs while the query is embedded.
announceIntent's search (``similar``) falls back to the keyword side alone, saying so, when
the vector index cannot be used; queryDecisions answers -32003 then.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Connection

from app.errors import query_failed
from app.operations.context import CallContext
from app.operations.params import parse_timestamp
from app.records.entries import list_item, reasons_out
from app.records.filters import SearchFilters
from app.records.repository import Brief

from . import hybrid, keyword, semantic
from .schemas import FoundDecision, QueryDecisionsParams, QueryDecisionsResult, QueryFiltersIn
from .semantic import Match
from .types import IndexUnavailable

Mode = Literal["semantic", "keyword", "hybrid"]
MODES: dict[str, Mode] = {"semantic": "semantic", "keyword": "keyword", "hybrid": "hybrid"}
#: What queryDecisions and announceIntent search with when not told: the setting
#: CSTP_RETRIEVAL_MODE, hybrid unless set (chosen by the benchmark, docs/QUALITY.md).
DEFAULT_MODE: Mode = "hybrid"


def default_mode(ctx: CallContext) -> Mode:
    return MODES.get(ctx.services.settings.retrieval_mode, DEFAULT_MODE)


@dataclass(frozen=True)
class Found:
    """A result with its cosine distance (announceIntent shows and records every one), None
    only in a degraded search (``similar``)."""

    decision: Brief
    distance: float | None
    score: float


@dataclass(frozen=True)
class Similar:
    """announceIntent's similar decisions. ``degraded``: the vector index could not be used,
    and these are the keyword side's best, without distances."""

    found: list[Found]
    degraded: bool = False


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def to_filters(
    f: QueryFiltersIn | None,
    *,
    workspace: str,
    category: str | None = None,
    include_superseded: bool = False,
) -> SearchFilters:
    if f is None:
        return SearchFilters(
            category=category, workspace=workspace, include_superseded=include_superseded
        )
    return SearchFilters(
        workspace=workspace,
        include_superseded=include_superseded,
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


async def similar(ctx: CallContext, text: str, filters: SearchFilters, limit: int) -> Similar:
    """announceIntent's search: the best ``limit`` decisions satisfying every filter, best
    first, in the server's default mode, each with its cosine distance (one the keyword side
    alone found gets it from its stored vector; a decision the vector index does not hold yet
    has none and is left out). Without tags or reasons.

    When the vector index cannot be used, the keyword side's best ``limit`` instead, without
    distances, ``degraded``: the guardrails' verdict needs no vectors, and an agent that asks
    before acting gets its answer during an outage too. While the index is ``failing`` (its
    last call failed), the search does not try it: it asks the index to check itself in the
    background and answers from the keyword side at once. An outage where each attempt
    waits for a connect or request timeout then costs that wait to the announcement that
    found the index failing, and to no other."""
    index = ctx.services.index
    if index.failing:
        index.recheck()
    else:
        try:
            found = await _find(
                ctx, text, filters, limit, tags=False, reasons=False, mode=None, distances=True
            )
        except IndexUnavailable:
            pass
        else:
            return Similar(
                [Found(m.decision, m.distance, m.score) for m in found if m.distance is not None]
            )
    by_words = await ctx.services.db.read(
        functools.partial(
            _read_keyword, text=text, filters=filters, limit=limit, tags=False, reasons=False
        ),
        session=ctx.open_session,
    )
    return Similar([Found(m.decision, None, m.score) for m in by_words], degraded=True)


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
    try:
        return await _find(
            ctx, text, filters, limit, tags=tags, reasons=reasons, mode=mode, distances=distances
        )
    except IndexUnavailable:
        raise query_failed() from None


async def _find(
    ctx: CallContext,
    text: str,
    filters: SearchFilters,
    limit: int,
    *,
    tags: bool,
    reasons: bool,
    mode: Mode | None,
    distances: bool,
) -> list[Match]:
    """``find``; raises IndexUnavailable."""
    mode = mode or default_mode(ctx)
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
            session=ctx.open_session,
        )
        if distances and found:
            vector = await ctx.services.index.embed_query(text)
            found = await semantic.with_distances(ctx, vector, found, filters.workspace)
        return found
    if mode == "semantic":
        vector, hits = await semantic.probe(ctx, text, filters, limit)
        return await semantic.nearest(ctx, vector, hits, filters, limit, tags, reasons)
    return await hybrid.search(ctx, text, filters, limit, tags, reasons, distances)


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
    semantic.complete(conn, [h.decision for h in hits], tags, reasons)
    return [Match(h.decision, None, h.score) for h in hits]


# ---------------------------------------------------------------- queryDecisions


def summary(found: Match, *, include_reasons: bool) -> FoundDecision:
    return list_item(
        found.decision,
        FoundDecision,
        distance=None if found.distance is None else round(found.distance, 6),
        score=round(found.score, 6),
        reasons=reasons_out(found.decision) if include_reasons else None,
    )


async def query_decisions(ctx: CallContext, p: QueryDecisionsParams) -> QueryDecisionsResult:
    started = time.perf_counter()
    filters = to_filters(
        p.filters, workspace=ctx.workspace, include_superseded=p.include_superseded
    )
    mode: Mode = p.retrieval_mode or default_mode(ctx)
    ctx.trace_text("gen_ai.memory.query.text", p.query)
    found = await find(ctx, p.query, filters, p.limit, reasons=p.include_reasons, mode=mode)
    ctx.trace("gen_ai.memory.record.count", len(found))
    return QueryDecisionsResult(
        decisions=[summary(f, include_reasons=p.include_reasons) for f in found],
        total=len(found),
        query=p.query,
        query_time_ms=round((time.perf_counter() - started) * 1000, 2),
        agent=ctx.agent,
        retrieval_mode=mode,
    )
