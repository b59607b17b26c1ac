"""cstp.getCalibration: how well the confidence agents state matches the outcomes they get.

Every figure is aggregated by the database (COUNT/SUM/GROUP BY over the filtered decisions)
and only a handful of sums per slice reach Python, so the call needs the same memory for ten
reviewed decisions or ten million: no rows are loaded, no scan limit, no hidden floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, Select, case, func, literal, null, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.decisions import Decision
from app.errors import invalid_params
from app.operations.context import CallContext
from app.operations.params import parse_timestamp
from app.runtime import iso

from .schemas import (
    BUCKETS,
    DEFAULT_MIN_DECISIONS,
    STAKES_ORDER,
    TOLERANCE,
    CalibrationFilters,
    GetCalibrationParams,
    Sums,
    bucket_label,
    bucket_wire,
    figures,
    interpret,
    percent,
)

# Outcome -> score; an outcome missing here (``abandoned``) is reviewed but never scored.
SCORES = {"success": 1.0, "partial": 0.5, "failure": 0.0}
HEADLINE = ("brierScore", "accuracy", "calibrationGap", "interpretation")
MAX_RECOMMENDATIONS = 8


def _action(gap: float, there: str) -> str:
    if gap < 0:
        return f"lower confidence{there} or gather more evidence before deciding"
    return f"you can state higher confidence{there}"


def _by_gap(rows: list[tuple[Any, Sums]], min_decisions: int) -> list[tuple[Any, Sums, float]]:
    """The miscalibrated slices with enough decisions to judge, worst first."""
    judged = [(k, s, s.gap) for k, s in rows if s.scored >= min_decisions and s.gap is not None]
    return sorted(
        [(k, s, g) for k, s, g in judged if abs(g) > TOLERANCE], key=lambda item: -abs(item[2])
    )


def recommendations(
    overall: Sums,
    by_bucket: list[tuple[int, Sums]],
    groups: list[tuple[str, Sums]] | None,
    group_by: str | None,
    min_decisions: int,
) -> list[str]:
    """Concrete advice, most important first: enough data?, overall, worst buckets, groups."""
    advice: list[str] = []
    if overall.scored < min_decisions:
        advice.append(
            f"Only {overall.scored} reviewed decision(s) can be scored here and at least "
            f"{min_decisions} are needed: review more decisions (cstp.reviewDecision) before "
            "trusting these figures."
        )
    elif overall.gap is not None:
        stated = percent(overall.sum_confidence / overall.scored)
        success = percent(overall.sum_score / overall.scored)
        if abs(overall.gap) <= TOLERANCE:
            advice.append(
                f"Your stated confidence ({stated}%) matches your success rate ({success}%): "
                "keep calibrating the same way."
            )
        else:
            advice.append(
                f"Overall you state {stated}% confidence and succeed {success}% of the time: "
                f"{_action(overall.gap, '')}."
            )
    for index, s, gap in _by_gap(list(by_bucket), min_decisions):
        advice.append(
            f"Your {bucket_label(index)} decisions succeed {percent(s.sum_score / s.scored)}% "
            f"of the time: {_action(gap, ' there')}."
        )
    if groups and group_by != "confidenceBucket":
        for key, s, gap in _by_gap(list(groups), min_decisions):
            advice.append(
                f"{group_by} '{key}' is {interpret(gap).replace('_', ' ')} (gap {gap:+.3f} over "
                f"{s.scored} decisions): {_action(gap, ' there')}."
            )
    pending = overall.matched - overall.reviewed
    if pending:
        advice.insert(
            1,
            f"{pending} matching decision(s) have no review yet: reviewing them makes this "
            "calibration more reliable.",
        )
    return advice[:MAX_RECOMMENDATIONS]


@dataclass(frozen=True)
class Filters:
    """The filters of one call after merging ``filters`` with their top-level aliases."""

    agent: str | None = None
    category: str | None = None
    stakes: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_decisions: int = DEFAULT_MIN_DECISIONS

    def wire(self) -> dict[str, Any]:
        """What was applied, echoed so a client can tell which slice the figures describe."""
        data: dict[str, Any] = {
            "agent": self.agent,
            "category": self.category,
            "stakes": self.stakes,
            "since": iso(self.since) if self.since else None,
            "until": iso(self.until) if self.until else None,
        }
        data = {k: v for k, v in data.items() if v is not None}
        data["minDecisions"] = self.min_decisions
        return data


def resolve_filters(p: GetCalibrationParams) -> Filters:
    """``filters`` wins key by key; a top-level value fills a key ``filters`` leaves out."""
    nested = p.filters or CalibrationFilters()

    def pick(name: str, wire: str) -> tuple[Any, str]:
        value = getattr(nested, name)
        if value is not None:
            return value, f"filters.{wire}"
        return getattr(p, name), wire

    agent, _ = pick("agent", "agent")
    category, _ = pick("category", "category")
    stakes, _ = pick("stakes", "stakes")
    min_decisions, _ = pick("min_decisions", "minDecisions")
    since_text, since_field = pick("since", "since")
    until_text, until_field = pick("until", "until")
    since = parse_timestamp(since_field, since_text) if since_text is not None else None
    until = parse_timestamp(until_field, until_text) if until_text is not None else None
    if since is not None and until is not None and until <= since:
        raise invalid_params(until_field, "must be later than since")
    return Filters(
        agent=agent if isinstance(agent, str) else None,  # an {"id": …} object is informational
        category=category,
        stakes=stakes,
        since=since,
        until=until,
        min_decisions=min_decisions if min_decisions is not None else DEFAULT_MIN_DECISIONS,
    )


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


def _conditions(f: Filters) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
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
    return conditions


def _aggregate_query(f: Filters, key: str | None) -> Select[Any]:
    """One row of sums per slice. The key is computed in a subquery and grouped by its column,
    so Postgres never has to match a bound parameter in SELECT with one in GROUP BY."""
    columns: list[ColumnElement[Any]] = [
        Decision.confidence.label("confidence"),
        Decision.outcome.label("outcome"),
        _score().label("score"),
    ]
    if key is not None:
        columns.append(GROUP_KEYS[key]().label("key"))
    scoped = select(*columns).where(*_conditions(f)).subquery("scoped")
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


async def aggregate(session: AsyncSession, f: Filters, key: str | None) -> list[tuple[Any, Sums]]:
    """``(key, sums)`` per slice; with no key, a single ``(None, sums)`` for everything."""
    result = await session.execute(_aggregate_query(f, key))
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


async def _groups(
    session: AsyncSession, f: Filters, group_by: str, by_bucket: list[tuple[int, Sums]]
) -> list[tuple[str, Sums]]:
    if group_by == "confidenceBucket":
        return [(bucket_label(i), sums) for i, sums in by_bucket]
    rows = [(str(k), s) for k, s in await aggregate(session, f, group_by)]
    if group_by == "stakes":
        rows.sort(key=lambda item: (STAKES_ORDER.get(item[0], len(STAKES_ORDER)), item[0]))
    return rows


async def get_calibration(ctx: CallContext, p: GetCalibrationParams) -> dict[str, Any]:
    f = resolve_filters(p)
    session = ctx.session
    [(_, overall)] = await aggregate(session, f, None)
    by_bucket: list[tuple[int, Sums]] = []
    if overall.matched:
        by_bucket = [(int(k), s) for k, s in await aggregate(session, f, "confidenceBucket")]
    head = figures(overall, f.min_decisions)
    groups = await _groups(session, f, p.group_by, by_bucket) if p.group_by else None
    result: dict[str, Any] = {key: head[key] for key in HEADLINE}
    result["overall"] = head
    result["buckets"] = [bucket_wire(i, s) for i, s in by_bucket if s.scored]
    result["recommendations"] = recommendations(
        overall, by_bucket, groups, p.group_by, f.min_decisions
    )
    if p.group_by is not None and groups is not None:
        result["groupBy"] = p.group_by
        result["groups"] = [{"key": k, **figures(s, f.min_decisions)} for k, s in groups]
    result["filters"] = f.wire()
    result["agent"] = ctx.agent
    return result
