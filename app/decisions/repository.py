"""The SQL of the decisions context: every read and write of the decision tables
(``decisions``, ``decision_reasons``, ``decision_tags``, ``decision_reviews``) made by
record, get, list, review, import and export. The reads other contexts make of them too (a
search's, the whole rows with tags and reasons) are app.records.repository's.

Functions take the session (or connection) they run in; the callers own the transactions.
What the rows become for the outside world is app.decisions.document's (YAML, wire shapes)
and app.records.entries' (index entry, list item).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    ScalarResult,
    Select,
    bindparam,
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from app.audit.chain import append
from app.db.base import table_of
from app.db.decisions import Decision, DecisionReview, DecisionSupersede, DecisionTag
from app.errors import decision_not_found
from app.operations.params import parse_timestamp

from .schemas import ListDecisionsParams

# --- whole rows ------------------------------------------------------------------------------


async def lock_one(session: AsyncSession, workspace: str, decision_id: str) -> Decision:
    """One row of ``workspace`` with its tags and reasons, locked until the transaction ends
    (``FOR UPDATE`` on Postgres, which waits for a transaction that holds it and then reads
    the row as that one committed it; SQLite's write transactions hold the database's only
    write lock already).
    -32007 when there is none, in that workspace."""
    row = await session.scalar(
        select(Decision)
        .where(Decision.id == decision_id, Decision.workspace == workspace)
        .with_for_update(of=Decision)
        .options(selectinload(Decision.tags), selectinload(Decision.reasons))
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise decision_not_found(decision_id)
    return row


async def lock_unreviewed_of_pr(session: AsyncSession, workspace: str, pr: int) -> list[Decision]:
    """The decisions of ``workspace`` with pull request ``pr`` and no outcome yet, with their
    tags and reasons, in id order, each locked until the transaction ends like ``lock_one``'s
    (in id order, so two such transactions never wait for each other round a cycle). On
    Postgres a row another transaction reviewed while this one waited for its lock is read
    again as committed and left out, since it has an outcome now. A CI report's reviews."""
    rows = await session.scalars(
        select(Decision)
        .where(Decision.workspace == workspace, Decision.pr == pr, Decision.outcome.is_(None))
        .order_by(Decision.id)
        .with_for_update(of=Decision)
        .options(selectinload(Decision.tags), selectinload(Decision.reasons))
        .execution_options(populate_existing=True)
    )
    return list(rows)


async def load_with_reviews(
    session: AsyncSession, workspace: str, decision_id: str
) -> tuple[Decision, list[DecisionReview]]:
    """One row of ``workspace`` with its tags, reasons and supersede links, and its reviews
    oldest first: by id, the latest last (see "which review is the latest" below). Both are
    read by one statement, so they are one snapshot even under Postgres' READ COMMITTED,
    where each statement sees what was committed before it: a review committed between two
    statements would otherwise be in the history and not yet in the row. -32007 when there
    is none, in that workspace."""
    result = await session.execute(
        select(Decision, DecisionReview)
        .outerjoin(DecisionReview, DecisionReview.decision_id == Decision.id)
        .where(Decision.id == decision_id, Decision.workspace == workspace)
        .order_by(DecisionReview.id)
        .options(
            selectinload(Decision.tags),
            selectinload(Decision.reasons),
            selectinload(Decision.supersedes),
        )
    )
    rows = result.all()
    if not rows:
        raise decision_not_found(decision_id)
    return rows[0][0], [review for _, review in rows if review is not None]


async def stored_ids(session: AsyncSession, ids: Sequence[str]) -> dict[str, str]:
    """Which of ``ids`` are stored, in any workspace (an import must not take an id another
    workspace holds): id -> its workspace."""
    rows = await session.execute(
        select(Decision.id, Decision.workspace).where(Decision.id.in_(ids))
    )
    return {row[0]: row[1] for row in rows}


async def created_at_of(session: AsyncSession, ids: Sequence[str]) -> dict[str, datetime]:
    """The creation time of each stored one of ``ids``."""
    rows = await session.execute(
        select(Decision.id, Decision.created_at).where(Decision.id.in_(list(ids)))
    )
    return {row[0]: row[1] for row in rows.all()}


async def count_all(session: AsyncSession, workspace: str | None = None) -> int:
    """How many decisions ``workspace`` has (every workspace's, None)."""
    query = select(func.count()).select_from(Decision)
    if workspace is not None:
        query = query.where(Decision.workspace == workspace)
    return int(await session.scalar(query) or 0)


async def ids_after(
    session: AsyncSession, last_id: str | None, limit: int, workspace: str | None = None
) -> list[str]:
    """Up to ``limit`` ids in id order, after ``last_id`` (from the first when None), of
    ``workspace`` (of every workspace, None)."""
    query = select(Decision.id).order_by(Decision.id).limit(limit)
    if workspace is not None:
        query = query.where(Decision.workspace == workspace)
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


def _filtered(workspace: str, p: ListDecisionsParams) -> Select[Decision]:
    query = select(Decision).where(Decision.workspace == workspace)
    if not p.include_superseded:
        query = query.where(Decision.superseded_by.is_(None))
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
    session: AsyncSession, workspace: str, p: ListDecisionsParams
) -> tuple[int, ScalarResult[Decision]]:
    """How many rows of ``workspace`` match listDecisions' filters, and the requested page of
    them (with their tags) in the requested order (ties by id)."""
    query = _filtered(workspace, p)
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
    """INSERT an imported decision, and its review history row when it has an outcome (an
    imported outcome is the agent's claim, as its file has no source)."""
    if decision.outcome is not None and decision.review_source is None:
        decision.review_source = "agent"
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
        workspace=decision.workspace,
        outcome=decision.outcome,
        actual_result=decision.actual_result,
        lessons=decision.lessons,
        notes=decision.review_notes,
        affected_kpis=decision.affected_kpis,
        reviewed_by=decision.reviewed_by or "import",
        reviewed_at=decision.reviewed_at,
        source=decision.review_source or "agent",
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
    source: str,
) -> DecisionReview:
    """INSERT a review into the decision's history and UPDATE the decision to show it. The
    caller holds the decision's row lock (``lock_one``) and took ``reviewed_at`` after it,
    later than every earlier review's: then this review is the latest, by id and by time (see
    "which review is the latest")."""
    review = DecisionReview(
        decision_id=decision.id,
        workspace=decision.workspace,
        outcome=outcome,
        actual_result=actual_result,
        lessons=lessons,
        notes=notes,
        affected_kpis=affected_kpis,
        reviewed_by=reviewed_by,
        reviewed_at=reviewed_at,
        source=source,
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
    decision.review_source = source
    return review


# --- supersede links --------------------------------------------------------------------------
#
# A link is a child row of the superseding decision (inserted with it, covered by its chain
# entry); the superseded decision's ``superseded_by`` copies the latest link naming it. Links
# are made under the superseded decisions' row locks (``lock_superseded``, taken before the
# links' ids are drawn and held to the commit), so, as with reviews, the latest link naming a
# decision is the one with the greatest id, and the row holds its decision: concurrent
# recordDecision calls superseding one decision are written one after the other, in any number
# of server processes. ``cstp audit verify`` holds the copy to the links (app.audit.coverage).

_EXISTING = select(Decision.id, Decision.recorded_by).where(
    Decision.id.in_(bindparam("ids", expanding=True)), Decision.workspace == bindparam("workspace")
)
_DECISIONS = table_of(Decision)
_MARK_SUPERSEDED = (
    update(_DECISIONS)
    .where(_DECISIONS.c.id == bindparam("b_superseded"))
    .values(superseded_by=bindparam("b_by"))
)


def existing(conn: Connection, workspace: str, ids: Sequence[str]) -> dict[str, str]:
    """Which of ``ids`` are decisions of ``workspace``, each with the agent that recorded it."""
    if not ids:
        return {}
    rows = conn.execute(_EXISTING, {"ids": list(ids), "workspace": workspace})
    return {str(r.id): str(r.recorded_by) for r in rows}


async def lock_superseded(session: AsyncSession, ids: Sequence[str]) -> None:
    """Lock the rows of ``ids`` until the transaction ends, in id order (so two writers never
    wait for each other round a cycle), before the links naming them are inserted. Postgres
    only: SQLite's write transactions already hold the database's only write lock."""
    if ids and session.get_bind().dialect.name != "sqlite":
        await session.execute(
            select(Decision.id)
            .where(Decision.id.in_(sorted(set(ids))))
            .order_by(Decision.id)
            .with_for_update()
        )


def supersede_links(workspace: str, ids: Sequence[str]) -> list[DecisionSupersede]:
    """The link rows of a new decision superseding ``ids``, in that order."""
    return [
        DecisionSupersede(workspace=workspace, superseded_id=superseded, position=n)
        for n, superseded in enumerate(ids)
    ]


async def mark_superseded(session: AsyncSession, decisions: Sequence[Decision]) -> list[str]:
    """UPDATE the decisions that ``decisions`` (flushed, in the order their links were
    inserted) supersede to show it: each its latest superseding decision, the last given.
    Returns their ids."""
    latest: dict[str, str] = {}
    for decision in decisions:
        for link in decision.supersedes:
            latest[link.superseded_id] = decision.id  # a later one replaces an earlier
    if latest:
        await session.execute(
            _MARK_SUPERSEDED,
            [{"b_superseded": old, "b_by": new} for old, new in sorted(latest.items())],
        )
    return sorted(latest)


# --- which review is the latest --------------------------------------------------------------
#
# A decision's latest review is the one with the greatest id: reviews are made one at a time
# under the decision's row lock (``lock_one``), and each takes its id from the sequence (on
# SQLite, the greatest rowid plus one) while it holds the lock, so ids follow the order the
# reviews were made and committed in. The decision row copies the latest review (it is written
# in the same transaction, under the same lock), getDecision's ``reviews`` end with it, and
# ``cstp audit verify`` compares the row with it (app.audit.coverage). ``reviewed_at`` is read
# from the clock after the lock and kept later than every earlier review's
# (app.decisions.reviews), so it grows with the id as well; a YAML file, which has no review
# id, is compared by it (app.decisions.export). Nothing orders reviews by it.

# The columns a review writes into the decision row, and ``superseded_by``: the whole of what
# changes in a decision row, so two reads that find them equal found the same version of it.
REVIEW_STATE = (
    Decision.superseded_by,  # set when a later decision supersedes it: it changes the entry
    Decision.status,
    Decision.outcome,
    Decision.reviewed_at,
    Decision.reviewed_by,
    Decision.actual_result,
    Decision.lessons,
    Decision.review_notes,
    Decision.affected_kpis,
    Decision.review_source,
)
_REVIEW_STATES = select(Decision.id, *REVIEW_STATE).where(
    Decision.id.in_(bindparam("ids", expanding=True))
)


async def last_review_times(
    session: AsyncSession, decision_ids: Sequence[str]
) -> dict[str, datetime]:
    """The latest ``reviewed_at`` among each decision's reviews; decisions without a review
    are not in it."""
    rows = await session.execute(
        select(DecisionReview.decision_id, func.max(DecisionReview.reviewed_at))
        .where(DecisionReview.decision_id.in_(list(decision_ids)))
        .group_by(DecisionReview.decision_id)
    )
    return {row[0]: row[1] for row in rows.all() if row[1] is not None}


async def last_review_time(session: AsyncSession, decision_id: str) -> datetime | None:
    """The latest ``reviewed_at`` among the decision's reviews; None before any."""
    return await session.scalar(
        select(func.max(DecisionReview.reviewed_at)).where(
            DecisionReview.decision_id == decision_id
        )
    )


def review_state(decision: Decision) -> tuple[Any, ...]:
    """The values of ``REVIEW_STATE`` that ``decision`` holds."""
    return tuple(getattr(decision, column.key) for column in REVIEW_STATE)


def changed_rows(conn: Connection, decisions: Sequence[Decision]) -> list[str]:
    """The ids of ``decisions`` whose row in the database is no longer the version given: a
    review committed since (or the row is gone)."""
    if not decisions:
        return []
    stored = {
        row[0]: tuple(row[1:])
        for row in conn.execute(_REVIEW_STATES, {"ids": [d.id for d in decisions]})
    }
    return [d.id for d in decisions if stored.get(d.id) != review_state(d)]
