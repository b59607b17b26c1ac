"""The SQL of the decisions context: every read and write of the decision tables
(``decisions``, ``decision_reasons``, ``decision_tags``, ``decision_reviews``) made by
record, get, list, review, import and export, and the reads searches make of them.

Functions take the session (or, for a search's reads, the connection) they run in; the
callers own the transactions. What the rows become for the outside world (YAML, index entry,
wire shapes) is app.decisions.document's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, ScalarResult, Select, bindparam, case, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from app.audit.chain import append
from app.db.decisions import Decision, DecisionReason, DecisionReview, DecisionTag
from app.errors import decision_not_found
from app.operations.params import parse_timestamp

from .schemas import ListDecisionsParams

# --- a search's reads: plain column values, by statements built once ----------------------


@dataclass(slots=True)
class Brief:
    """A decision as a search reads it: these columns as plain values (no ORM object to build
    or track), then its tags and reasons when the search asked for them. ``list_item``,
    ``index_metadata`` and ``reasons_of`` (app.decisions.document) read it like a
    ``Decision``."""

    id: str
    summary: str
    category: str
    confidence: float
    stakes: str
    status: str
    created_at: datetime
    recorded_by: str
    project: str | None
    feature: str | None
    pr: int | None
    outcome: str | None
    actual_result: str | None
    lessons: str | None
    review_notes: str | None
    tag_names: list[str] = field(default_factory=list)
    reasons: list[Any] = field(default_factory=list)


# What a search reads of a row: the columns named by Brief's fields, in that order.
SEARCH_COLUMNS = tuple(
    getattr(Decision, f.name) for f in fields(Brief) if f.name not in ("tag_names", "reasons")
)

# Built once: building a statement (and its cache key) costs more than running it here.
_BRIEFS = select(*SEARCH_COLUMNS).where(Decision.id.in_(bindparam("ids", expanding=True)))
_TAGS = (
    select(DecisionTag.decision_id, DecisionTag.tag)
    .where(DecisionTag.decision_id.in_(bindparam("ids", expanding=True)))
    .order_by(DecisionTag.decision_id, DecisionTag.position)
)
_REASONS = (
    select(
        DecisionReason.decision_id,
        DecisionReason.type,
        DecisionReason.text,
        DecisionReason.strength,
    )
    .where(DecisionReason.decision_id.in_(bindparam("ids", expanding=True)))
    .order_by(DecisionReason.decision_id, DecisionReason.position)
)


def load_briefs(conn: Connection, ids: Sequence[str]) -> dict[str, Brief]:
    """SEARCH_COLUMNS of the rows with these ids (absent ids are left out); no tags yet."""
    if not ids:
        return {}
    return {row[0]: Brief(*row) for row in conn.execute(_BRIEFS, {"ids": list(ids)})}


def add_tags(conn: Connection, briefs: Sequence[Brief]) -> None:
    """Fill ``tag_names`` of ``briefs``, in each decision's tag order."""
    by_id = {b.id: b for b in briefs}
    if by_id:
        for decision_id, tag in conn.execute(_TAGS, {"ids": list(by_id)}):
            by_id[decision_id].tag_names.append(tag)


def add_reasons(conn: Connection, briefs: Sequence[Brief]) -> None:
    """Fill ``reasons`` of ``briefs`` (rows with type, text and strength), in order."""
    by_id = {b.id: b for b in briefs}
    if by_id:
        for row in conn.execute(_REASONS, {"ids": list(by_id)}):
            by_id[row.decision_id].reasons.append(row)


# --- whole rows ------------------------------------------------------------------------------


async def load_decisions(session: AsyncSession, ids: Sequence[str]) -> dict[str, Decision]:
    """Rows by id with every column, their tags and their reasons."""
    if not ids:
        return {}
    # Tags and reasons each by ``decision_id IN (...)``: a join would let Postgres hash-join
    # against a full scan of decision_tags, which grows with the corpus.
    rows = await session.scalars(
        select(Decision)
        .where(Decision.id.in_(list(ids)))
        .options(selectinload(Decision.tags), selectinload(Decision.reasons))
    )
    return {row.id: row for row in rows}


async def load_one(session: AsyncSession, decision_id: str) -> Decision:
    """One row as ``load_decisions`` loads it; -32007 (decision not found) when there is none."""
    found = await load_decisions(session, [decision_id])
    if decision_id not in found:
        raise decision_not_found(decision_id)
    return found[decision_id]


async def stored_ids(session: AsyncSession, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` are stored."""
    return set(await session.scalars(select(Decision.id).where(Decision.id.in_(ids))))


async def created_at_of(session: AsyncSession, ids: Sequence[str]) -> dict[str, datetime]:
    """The creation time of each stored one of ``ids``."""
    rows = await session.execute(
        select(Decision.id, Decision.created_at).where(Decision.id.in_(list(ids)))
    )
    return {row[0]: row[1] for row in rows.all()}


async def count_all(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(Decision)) or 0)


async def ids_after(session: AsyncSession, last_id: str | None, limit: int) -> list[str]:
    """Up to ``limit`` ids in id order, after ``last_id`` (from the first when None)."""
    query = select(Decision.id).order_by(Decision.id).limit(limit)
    if last_id is not None:
        query = query.where(Decision.id > last_id)
    return list(await session.scalars(query))


# --- listDecisions ---------------------------------------------------------------------------

STAKES_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}
_SORT = {
    "createdAt": Decision.created_at,
    "confidence": Decision.confidence,
    "category": Decision.category,
    "stakes": case(STAKES_ORDER, value=Decision.stakes, else_=-1),  # by severity
    "status": Decision.status,
}


def _filtered(p: ListDecisionsParams) -> Select[Decision]:
    query = select(Decision)
    for column, value in (
        (Decision.category, p.category),
        (Decision.stakes, p.stakes),
        (Decision.status, p.status),
        (Decision.recorded_by, p.agent),
        (Decision.correlation_id, p.correlation_id),
    ):
        if value is not None:
            query = query.where(column == value)
    for tag in dict.fromkeys(t.strip() for t in p.tags):  # each tag once, in the given order
        query = query.where(
            select(DecisionTag.decision_id)
            .where(DecisionTag.decision_id == Decision.id, DecisionTag.tag == tag)
            .exists()
        )
    if p.date_from:
        query = query.where(Decision.created_at >= parse_timestamp("dateFrom", p.date_from))
    if p.date_to:
        # A timestamp is an exclusive end; a bare date means "through that day".
        end = parse_timestamp("dateTo", p.date_to)
        if len(p.date_to.strip()) == 10 and end.year < 9999:
            end += timedelta(days=1)
        query = query.where(Decision.created_at < end)
    if p.search and p.search.strip():
        needle = "%" + _escape_like(p.search.strip().lower()) + "%"
        query = query.where(
            or_(
                func.lower(Decision.decision).like(needle, escape="\\"),
                func.lower(func.coalesce(Decision.context, "")).like(needle, escape="\\"),
            )
        )
    return query


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def list_page(
    session: AsyncSession, p: ListDecisionsParams
) -> tuple[int, ScalarResult[Decision]]:
    """How many rows match listDecisions' filters, and the requested page of them (with
    their tags) in the requested order (ties by id)."""
    query = _filtered(p)
    total = await session.scalar(select(func.count()).select_from(query.subquery()))
    column = _SORT[p.sort]
    ordering = column.asc() if p.order == "asc" else column.desc()
    tiebreak = Decision.id.asc() if p.order == "asc" else Decision.id.desc()
    rows = await session.scalars(
        query.options(selectinload(Decision.tags))
        .order_by(ordering, tiebreak)
        .offset(p.offset)
        .limit(p.limit)
    )
    return int(total or 0), rows


# --- writes (INSERTs and UPDATEs are sent at the session's next flush) -----------------------


def add_decision(session: AsyncSession, decision: Decision) -> None:
    """INSERT the decision with its reasons and tags."""
    session.add(decision)
    append(session, decision)


async def try_insert(session: AsyncSession, decision: Decision) -> bool:
    """INSERT the decision now, in a savepoint; False when its id is taken (the primary key
    refused it, even for a row another transaction has not committed yet). Rolling back the
    savepoint takes ``decision`` out of the session again."""
    try:
        async with session.begin_nested():
            session.add(decision)
            await session.flush()
    except IntegrityError:
        return False
    append(session, decision)
    return True


def add_imported(session: AsyncSession, decision: Decision) -> None:
    """INSERT an imported decision, and its review history row when it has an outcome."""
    session.add(decision)
    append(session, decision)
    if decision.outcome is not None:
        history = _history_row(decision)
        session.add(history)
        append(session, history)


def _history_row(decision: Decision) -> DecisionReview:
    assert decision.outcome is not None and decision.reviewed_at is not None
    return DecisionReview(
        decision_id=decision.id,
        outcome=decision.outcome,
        actual_result=decision.actual_result,
        lessons=decision.lessons,
        notes=decision.review_notes,
        affected_kpis=decision.affected_kpis,
        reviewed_by=decision.reviewed_by or "import",
        reviewed_at=decision.reviewed_at,
    )


def add_review(
    session: AsyncSession,
    decision: Decision,
    *,
    outcome: str,
    actual_result: str | None,
    lessons: str | None,
    notes: str | None,
    affected_kpis: dict[str, Any] | None,
    reviewed_by: str,
    reviewed_at: datetime,
) -> None:
    """INSERT a review into the decision's history and UPDATE the decision to show it."""
    review = DecisionReview(
        decision_id=decision.id,
        outcome=outcome,
        actual_result=actual_result,
        lessons=lessons,
        notes=notes,
        affected_kpis=affected_kpis,
        reviewed_by=reviewed_by,
        reviewed_at=reviewed_at,
    )
    session.add(review)
    append(session, review)
    decision.status = "reviewed"
    decision.outcome = outcome
    decision.reviewed_at = reviewed_at
    decision.reviewed_by = reviewed_by
    decision.actual_result = actual_result
    decision.lessons = lessons
    decision.review_notes = notes
    decision.affected_kpis = affected_kpis


async def review_rows(session: AsyncSession, decision_id: str) -> ScalarResult[DecisionReview]:
    """The decision's reviews, oldest first."""
    return await session.scalars(
        select(DecisionReview)
        .where(DecisionReview.decision_id == decision_id)
        .order_by(DecisionReview.reviewed_at, DecisionReview.id)
    )
