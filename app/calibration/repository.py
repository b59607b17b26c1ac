"""The SQL of the calibration context: the sums getCalibration reads of the ``decisions``
table, aggregated by the database (COUNT/SUM/GROUP BY over the filtered decisions), so only a
handful of sums per slice reach Python.

Functions take the session they run in; the caller owns the transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Select,
    case,
    func,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.decisions import Decision

from .schemas import BUCKETS, Filters, Sums

# Outcome -> score; an outcome missing here (``abandoned``) is reviewed but never scored.
SCORES = {"success": 1.0, "partial": 0.5, "failure": 0.0}


def _score() -> ColumnElement[Any]:
    """The outcome's score, NULL for unreviewed and abandoned decisions (so COUNT and SUM of
    it cover scored decisions only)."""
    whens = [(Decision.outcome == name, literal(value, Float())) for name, value in SCORES.items()]
    return case(*whens, else_=null())


def _bucket() -> ColumnElement[Any]:
    """Index 0-9 of the confidence's 0.1-wide bucket; 1.0 joins the top bucket.

    Compared against the bucket edges instead of FLOOR/CAST of ``confidence * 10``: SQLite's
    CAST truncates but Postgres' rounds, SQLite may lack FLOOR, and products such as 0.7 * 10
    are not exact in floating point. ``i / 10`` is the same double as the literal ``0.i``, so
    a decision at exactly 0.7 lands in 0.7-0.8 on both databases.
    """
    edges = [
        (Decision.confidence >= literal(i / 10, Float()), i) for i in range(BUCKETS - 1, 0, -1)
    ]
    return case(*edges, else_=0)


GROUP_KEYS = {
    "category": lambda: Decision.category,
    "stakes": lambda: Decision.stakes,
    "agent": lambda: Decision.recorded_by,
    "confidenceBucket": _bucket,
}


def _conditions(workspace: str, f: Filters) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = [Decision.workspace == workspace]
    if f.agent is not None:
        conditions.append(Decision.recorded_by == f.agent)
    if f.category is not None:
        conditions.append(Decision.category == f.category)
    if f.stakes is not None:
        conditions.append(Decision.stakes == f.stakes)
    if f.since is not None:
        conditions.append(Decision.created_at >= f.since)
    if f.until is not None:
        conditions.append(Decision.created_at < f.until)
    if f.source is not None:
        conditions.append(Decision.review_source.in_(f.source))
    # a status update flagged at recording time counts only once an agent reviewed it anyway
    # (not CI's sweep of a pull request's decisions, nor a person's)
    conditions.append(or_(Decision.quality_flags.is_(None), Decision.review_source == "agent"))
    return conditions


def _aggregate_query(workspace: str, f: Filters, key: str | None) -> Select[Any]:
    """One row of sums per slice. The key is computed in a subquery and grouped by its column,
    so Postgres never has to match a bound parameter in SELECT with one in GROUP BY."""
    columns: list[ColumnElement[Any]] = [
        Decision.confidence.label("confidence"),
        Decision.outcome.label("outcome"),
        _score().label("score"),
    ]
    if key is not None:
        columns.append(GROUP_KEYS[key]().label("key"))
    scoped = select(*columns).where(*_conditions(workspace, f)).subquery("scoped")
    c = scoped.c
    error = c.confidence - c.score
    sums: list[ColumnElement[Any]] = [
        func.count().label("matched"),
        func.count(c.outcome).label("reviewed"),
        func.count(c.score).label("scored"),
        func.sum(case((c.score.is_not(None), c.confidence), else_=null())).label("conf"),
        func.sum(c.score).label("score"),
        func.sum(error * error).label("squared"),
    ]
    if key is None:
        return select(*sums).select_from(scoped)
    return select(c.key, *sums).select_from(scoped).group_by(c.key).order_by(c.key)


async def aggregate(
    session: AsyncSession, workspace: str, f: Filters, key: str | None
) -> list[tuple[Any, Sums]]:
    """``(key, sums)`` per slice of ``workspace``'s decisions; with no key, a single
    ``(None, sums)`` for all of them."""
    result = await session.execute(_aggregate_query(workspace, f, key))
    out: list[tuple[Any, Sums]] = []
    for row in result.mappings():
        sums = Sums(
            matched=int(row["matched"] or 0),
            reviewed=int(row["reviewed"] or 0),
            scored=int(row["scored"] or 0),
            sum_confidence=float(row["conf"] or 0.0),
            sum_score=float(row["score"] or 0.0),
            sum_squared_error=float(row["squared"] or 0.0),
        )
        out.append((row["key"] if key is not None else None, sums))
    return out


async def sources_scored(session: AsyncSession, workspace: str, f: Filters) -> list[str]:
    """The sources of the scored outcomes (reviewed, not abandoned) the filters select."""
    scored = [Decision.outcome.in_(tuple(SCORES)), Decision.review_source.is_not(None)]
    rows = await session.execute(
        select(Decision.review_source)
        .where(*_conditions(workspace, f), *scored)
        .distinct()
        .order_by(Decision.review_source)
    )
    return [str(r[0]) for r in rows]


# --- drift: recent against baseline windows, by review time ---------------------------------


def _drift_query(
    workspace: str,
    agent: str | None,
    category: str | None,
    since: datetime,
    split: datetime,
    until: datetime,
) -> Select[Any]:
    """Sums per (agent, category, window) of the scored decisions reviewed in
    ``(since, until]``: window ``recent`` from ``split`` on, ``baseline`` before it."""
    window = case((Decision.reviewed_at > split, literal("recent")), else_=literal("baseline"))
    conditions: list[ColumnElement[bool]] = [
        Decision.workspace == workspace,
        Decision.outcome.in_(tuple(SCORES)),
        Decision.reviewed_at > since,
        Decision.reviewed_at <= until,
    ]
    if agent is not None:
        conditions.append(Decision.recorded_by == agent)
    if category is not None:
        conditions.append(Decision.category == category)
    scoped = (
        select(
            Decision.recorded_by.label("agent"),
            Decision.category.label("category"),
            window.label("window"),
            Decision.confidence.label("confidence"),
            _score().label("score"),
        )
        .where(*conditions)
        .subquery("scoped")
    )
    c = scoped.c
    error = c.confidence - c.score
    return (
        select(
            c.agent,
            c.category,
            c.window,
            func.count().label("n"),
            func.sum(c.score).label("score"),
            func.sum(error * error).label("squared"),
        )
        .group_by(c.agent, c.category, c.window)
        .order_by(c.agent, c.category, c.window)
    )


def drift_sums(
    conn: Connection,
    *,
    workspace: str,
    agent: str | None,
    category: str | None,
    since: datetime,
    split: datetime,
    until: datetime,
) -> list[tuple[str, str, str, int, float, float]]:
    """``(agent, category, window, n, sum of scores, sum of squared errors)`` rows."""
    rows = conn.execute(_drift_query(workspace, agent, category, since, split, until))
    return [
        (
            str(r.agent),
            str(r.category),
            str(r.window),
            int(r.n),
            float(r.score or 0.0),
            float(r.squared or 0.0),
        )
        for r in rows
    ]
