"""The SQL of approvals: the ``approvals`` and ``approval_decisions`` rows.

Reads are functions of a plain connection (``Database.read`` runs them on SQLite's loop
connection or in the caller's session), so announceIntent, which has no call transaction,
and the approval methods, which have one, share them. Every read is of one workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    case,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.approvals import EXPIRED, PENDING, Approval, ApprovalDecision
from app.db.base import table_of

APPROVALS = table_of(Approval)
DECISIONS = table_of(ApprovalDecision)

# An approval with its decision, if any: one row per approval.
_WITH_DECISION = select(
    APPROVALS,
    DECISIONS.c.verdict,
    DECISIONS.c.decided_by,
    DECISIONS.c.decided_at,
    DECISIONS.c.reason,
).select_from(APPROVALS.outerjoin(DECISIONS, DECISIONS.c.approval_id == APPROVALS.c.id))


def by_id(conn: Connection, *, workspace: str, approval_id: str) -> Row[Any] | None:
    """The approval ``approval_id`` of ``workspace`` with its decision, or None."""
    return conn.execute(
        _WITH_DECISION.where(APPROVALS.c.workspace == workspace, APPROVALS.c.id == approval_id)
    ).first()


def by_any_id(conn: Connection, approval_id: str) -> Row[Any] | None:
    """The approval ``approval_id`` of any workspace, with its decision (``cstp guardrails
    replay``: the auditor's command reads every workspace)."""
    return conn.execute(_WITH_DECISION.where(APPROVALS.c.id == approval_id)).first()


def by_evaluation(conn: Connection, evaluation_id: str) -> Row[Any] | None:
    """The approval that evaluation ``evaluation_id`` asked for, with its decision, or None
    (``cstp guardrails replay``: the auditor's command reads every workspace)."""
    return conn.execute(_WITH_DECISION.where(APPROVALS.c.evaluation_id == evaluation_id)).first()


def by_correlation(
    conn: Connection, *, workspace: str, agent: str, correlation_id: str
) -> Row[Any] | None:
    """The approval ``agent`` asked for under ``correlation_id`` in ``workspace``, or None."""
    return conn.execute(
        _WITH_DECISION.where(
            APPROVALS.c.workspace == workspace,
            APPROVALS.c.requested_by == agent,
            APPROVALS.c.correlation_id == correlation_id,
        )
    ).first()


def _status_is(status: str, now: datetime) -> ColumnElement[bool]:
    """The SQL form of app.approvals.service.status_of."""
    undecided = DECISIONS.c.verdict.is_(None)
    if status == "pending":
        return and_(undecided, APPROVALS.c.expires_at > now)
    if status == "expired":
        return or_(DECISIONS.c.verdict == "expired", and_(undecided, APPROVALS.c.expires_at <= now))
    return DECISIONS.c.verdict == status


def listing(
    conn: Connection,
    *,
    workspace: str,
    status: str | None,
    now: datetime,
    limit: int,
    offset: int,
) -> tuple[list[Any], int]:
    """A page of the workspace's approvals, and how many match in all: pending first (the
    soonest to expire first), then the others, newest first."""
    where: list[ColumnElement[bool]] = [APPROVALS.c.workspace == workspace]
    if status is not None:
        where.append(_status_is(status, now))
    pending = _status_is("pending", now)
    rows = conn.execute(
        _WITH_DECISION.where(*where)
        .order_by(
            case((pending, 0), else_=1),
            case((pending, APPROVALS.c.expires_at), else_=literal(None)),
            APPROVALS.c.created_at.desc(),
            APPROVALS.c.id,
        )
        .limit(limit)
        .offset(offset)
    ).all()
    total = conn.execute(
        select(func.count())
        .select_from(APPROVALS.outerjoin(DECISIONS, DECISIONS.c.approval_id == APPROVALS.c.id))
        .where(*where)
    ).scalar_one()
    return list(rows), total


async def count_by_status(session: AsyncSession, now: datetime) -> dict[str, int]:
    """Approvals of every workspace by status as ``now`` makes it (app.approvals.service
    .status_of: the decision's verdict, else expired from the deadline on, else pending)."""
    status = case(
        (DECISIONS.c.verdict.is_not(None), DECISIONS.c.verdict),
        (APPROVALS.c.expires_at <= now, literal(EXPIRED)),
        else_=literal(PENDING),
    ).label("status")
    # Grouped outside: Postgres would not take the CASE, with its bound values, as the same
    # expression in GROUP BY as in the SELECT list.
    each = (
        select(status)
        .select_from(APPROVALS.outerjoin(DECISIONS, DECISIONS.c.approval_id == APPROVALS.c.id))
        .subquery()
    )
    rows = await session.execute(select(each.c.status, func.count()).group_by(each.c.status))
    return {str(name): int(n) for name, n in rows.all()}


def overdue(conn: Connection, *, now: datetime, since: datetime | None, limit: int) -> list[Any]:
    """Undecided approvals (of every workspace, every column) whose deadline has passed (after
    ``since``, when given), oldest first: the ones whose expiry is still to be written."""
    after = [] if since is None else [APPROVALS.c.expires_at > since]
    return list(
        conn.execute(
            select(APPROVALS)
            .where(
                *after,
                APPROVALS.c.expires_at <= now,
                not_(
                    select(DECISIONS.c.approval_id)
                    .where(DECISIONS.c.approval_id == APPROVALS.c.id)
                    .exists()
                ),
            )
            .order_by(APPROVALS.c.expires_at, APPROVALS.c.id)
            .limit(limit)
        ).all()
    )


_INSERT_APPROVALS = insert(APPROVALS)
_INSERT_DECISIONS = insert(DECISIONS)


async def insert_approvals(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    await session.execute(_INSERT_APPROVALS, list(rows))


async def insert_decision(session: AsyncSession, row: dict[str, Any]) -> None:
    """Raises IntegrityError when the approval has a decision already (its primary key)."""
    await session.execute(_INSERT_DECISIONS, [row])
