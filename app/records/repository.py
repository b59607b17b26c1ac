"""The reads of the decision rows that more than one context makes: a search's (``Brief``:
plain column values, then tags and reasons when asked for) and the whole rows with their tags
and reasons (``load_decisions``: getDecision, reviews, the outbox relay, ``cstp reindex``).

Functions take the session or connection they run in; the callers own the transactions. The
rest of the decisions' SQL is app.decisions.repository's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from app.db.decisions import Decision, DecisionReason, DecisionTag

# --- a search's reads: plain column values, by statements built once ----------------------


@dataclass(slots=True)
class Brief:
    """A decision as a search reads it: these columns as plain values (no ORM object to build
    or track), then its tags and reasons when the search asked for them. ``list_item``,
    ``index_metadata`` and ``reasons_of`` (app.records.entries) read it like a
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
    superseded_by: str | None
    tag_names: list[str] = field(default_factory=list)
    reasons: list[Any] = field(default_factory=list)


# What a search reads of a row: the columns named by Brief's fields, in that order.
SEARCH_COLUMNS = tuple(
    getattr(Decision, f.name) for f in fields(Brief) if f.name not in ("tag_names", "reasons")
)

# Built once: building a statement (and its cache key) costs more than running it here.
_BRIEFS = select(*SEARCH_COLUMNS).where(
    Decision.id.in_(bindparam("ids", expanding=True)), Decision.workspace == bindparam("workspace")
)
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


def load_briefs(conn: Connection, ids: Sequence[str], workspace: str) -> dict[str, Brief]:
    """SEARCH_COLUMNS of the rows of ``workspace`` with these ids (absent ids are left out);
    no tags yet."""
    if not ids:
        return {}
    params = {"ids": list(ids), "workspace": workspace}
    return {row[0]: Brief(*row) for row in conn.execute(_BRIEFS, params)}


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
