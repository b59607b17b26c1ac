"""The reads of ``cstp reindex`` (app.search.reindex): the decision count, and the ids of
the decisions to copy, a batch at a time in id order. Each runs in the caller's read."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.db.decisions import Decision, DecisionSupersede


async def count_decisions(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(Decision)) or 0)


async def workspaces(session: AsyncSession) -> list[str]:
    """The workspaces that have decisions, in order."""
    query = select(Decision.workspace).distinct().order_by(Decision.workspace)
    return list(await session.scalars(query))


def of_workspace(workspace: str) -> ColumnElement[bool]:
    return Decision.workspace == workspace


def touched_since(workspace: str, started: datetime) -> ColumnElement[bool]:
    """The decisions of ``workspace`` recorded, reviewed or superseded since ``started`` (for
    ``ids_after``). Superseded: a link made by a decision recorded since (a link has no time
    of its own; it is written with the decision that makes it)."""
    newer = aliased(Decision)
    superseded = (
        select(DecisionSupersede.superseded_id)
        .join(newer, newer.id == DecisionSupersede.decision_id)
        .where(newer.created_at >= started)
    )
    return and_(
        of_workspace(workspace),
        or_(
            Decision.created_at >= started,
            Decision.reviewed_at >= started,
            Decision.id.in_(superseded),
        ),
    )


async def ids_after(
    session: AsyncSession,
    last_id: str | None,
    where: ColumnElement[bool] | None,
    batch: int,
) -> list[str]:
    """The next ``batch`` decision ids after ``last_id`` (from the first without it), in id
    order, of those ``where`` holds for (all without it)."""
    query = select(Decision.id).order_by(Decision.id).limit(batch)
    if where is not None:
        query = query.where(where)
    if last_id is not None:
        query = query.where(Decision.id > last_id)
    return list(await session.scalars(query))
