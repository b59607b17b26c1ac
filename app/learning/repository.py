"""The SQL of the work list: decisions waiting for an outcome, from the ``decisions`` rows
(their latest review is copied on the row, so no join is needed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.briefs import SessionBrief
from app.db.decisions import Decision

_LISTED = (
    Decision.id,
    Decision.recorded_by,
    Decision.category,
    Decision.summary,
    Decision.review_by,
    Decision.created_at,
)


def _due(workspace: str, agent: str, now: datetime) -> list[ColumnElement[bool]]:
    return [
        Decision.workspace == workspace,
        Decision.recorded_by == agent,
        Decision.outcome.is_(None),
        Decision.review_by <= now,
        Decision.superseded_by.is_(None),  # replaced: its successor is the one to review
    ]


def _stale(workspace: str, agent: str, before: datetime) -> list[ColumnElement[bool]]:
    return [
        Decision.workspace == workspace,
        Decision.recorded_by == agent,
        Decision.outcome.is_(None),
        Decision.review_by.is_(None),
        Decision.created_at < before,
        Decision.quality_flags.is_(None),  # a status update is not waiting for an outcome
        Decision.superseded_by.is_(None),
    ]


def waiting(
    conn: Connection,
    *,
    workspace: str,
    agent: str,
    now: datetime,
    stale_before: datetime,
    limit: int,
) -> tuple[list[Any], int, list[Any], int]:
    """The agent's decisions whose review is due (most overdue first) and its stale pending
    ones (oldest first), at most ``limit`` of each, with how many there are of each."""
    due = _due(workspace, agent, now)
    stale = _stale(workspace, agent, stale_before)
    due_rows = conn.execute(
        select(*_LISTED).where(*due).order_by(Decision.review_by, Decision.id).limit(limit)
    ).all()
    stale_rows = conn.execute(
        select(*_LISTED).where(*stale).order_by(Decision.created_at, Decision.id).limit(limit)
    ).all()
    due_total = conn.execute(select(func.count()).select_from(Decision).where(*due)).scalar_one()
    stale_total = conn.execute(
        select(func.count()).select_from(Decision).where(*stale)
    ).scalar_one()
    return list(due_rows), int(due_total), list(stale_rows), int(stale_total)


def recent_failures(conn: Connection, *, workspace: str, agent: str, limit: int) -> list[Any]:
    """The agent's decisions reviewed as failures, the latest review first."""
    return list(
        conn.execute(
            select(
                Decision.id,
                Decision.summary,
                Decision.category,
                Decision.lessons,
                Decision.actual_result,
                Decision.reviewed_at,
            )
            .where(
                Decision.workspace == workspace,
                Decision.recorded_by == agent,
                Decision.outcome == "failure",
                Decision.superseded_by.is_(None),
            )
            .order_by(Decision.reviewed_at.desc(), Decision.id)
            .limit(limit)
        ).all()
    )


def recent_reviewed(conn: Connection, *, workspace: str, limit: int) -> list[Any]:
    """The workspace's latest reviewed decisions (a brief without a task shows these)."""
    return list(
        conn.execute(
            select(
                Decision.id,
                Decision.summary,
                Decision.category,
                Decision.outcome,
                Decision.lessons,
                Decision.review_notes,
                Decision.confidence,
            )
            .where(
                Decision.workspace == workspace,
                Decision.outcome.is_not(None),
                Decision.superseded_by.is_(None),
            )
            .order_by(Decision.reviewed_at.desc(), Decision.id)
            .limit(limit)
        ).all()
    )


async def store_brief(session: AsyncSession, row: dict[str, Any]) -> None:
    await session.execute(insert(table_of(SessionBrief)), [row])
