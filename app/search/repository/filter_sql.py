"""The search filters in SQL: ``app.records.filters.matches`` as WHERE conditions on
``decisions``, for the keyword side's ranked statement and the check of the vector side's
hits. A statement depends only on a filter set's shape (which filters are set, how many
tags, which outcome state); the values are bound when it runs, so the statements of each
shape are built once."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Select,
    bindparam,
    exists,
    literal_column,
    select,
)
from sqlalchemy.orm import InstrumentedAttribute

from app.db.decisions import Decision, DecisionTag
from app.records.filters import SearchFilters
from app.records.repository import SEARCH_COLUMNS, Brief

Shape = tuple[Any, ...]


def _unique(items: Sequence[str] | None) -> list[str]:
    return list(dict.fromkeys(items or ()))


def shape(f: SearchFilters) -> Shape:
    """What the statement depends on: which filters are set (and how many tags, whether an
    outcome is wanted: "with", "without" or None, and whether superseded decisions are left
    out); the values are bound at execution."""
    return (
        f.category is not None,
        bool(f.stakes),
        bool(f.status),
        f.min_confidence is not None,
        f.max_confidence is not None,
        f.date_after is not None,
        f.date_before is not None,
        f.agent is not None,
        len(_unique(f.tags)),
        f.project is not None,
        f.feature is not None,
        f.pr is not None,
        None if f.has_outcome is None else ("with" if f.has_outcome else "without"),
        not f.include_superseded,  # superseded decisions left out
    )


def values(f: SearchFilters) -> dict[str, Any]:
    values: dict[str, Any] = {
        "f_workspace": f.workspace,
        "f_category": f.category,
        "f_stakes": _unique(f.stakes),
        "f_status": _unique(f.status),
        "f_min_confidence": None if f.min_confidence is None else float(f.min_confidence),
        "f_max_confidence": None if f.max_confidence is None else float(f.max_confidence),
        "f_date_after": f.date_after,
        "f_date_before": f.date_before,
        "f_agent": f.agent,
        "f_project": f.project,
        "f_feature": f.feature,
        "f_pr": None if f.pr is None else int(f.pr),
    }
    for n, tag in enumerate(_unique(f.tags)):
        values[f"f_tag{n}"] = tag
    return {key: value for key, value in values.items() if value is not None}


def _unindexed(column: InstrumentedAttribute[Any]) -> ColumnElement[Any]:
    """``column`` written so that SQLite uses no index for a condition on it (a unary plus,
    SQLite's documented way), with the column's type for its bound values."""
    name = getattr(column, "key", None)
    return literal_column(f"+{Decision.__tablename__}.{name}", type_=column.type)


def conditions(shape: Shape, *, by_id: bool = False) -> list[ColumnElement[bool]]:
    """The SQL form of ``app.records.filters.matches`` for a shape (values bound later).
    ``by_id`` (SQLite): the rows are looked up by id and the conditions only check them;
    without it SQLite's planner took the index of a filter (say, a category's thousands of
    rows) over a few dozen lookups by id, which is ten times slower."""
    (
        category,
        stakes,
        status,
        min_confidence,
        max_confidence,
        date_after,
        date_before,
        agent,
        tags,
        project,
        feature,
        pr,
        has_outcome,
        current,
    ) = shape
    d = Decision

    def c(column: InstrumentedAttribute[Any]) -> ColumnElement[Any]:
        return _unindexed(column) if by_id else column.expression

    # every statement is of one workspace's decisions, whatever the shape
    out: list[ColumnElement[bool]] = [c(d.workspace) == bindparam("f_workspace")]
    if category:
        out.append(c(d.category) == bindparam("f_category"))
    if stakes:
        out.append(c(d.stakes).in_(bindparam("f_stakes", expanding=True)))
    if status:
        out.append(c(d.status).in_(bindparam("f_status", expanding=True)))
    if min_confidence:
        out.append(c(d.confidence) >= bindparam("f_min_confidence", type_=Float()))
    if max_confidence:
        out.append(c(d.confidence) <= bindparam("f_max_confidence", type_=Float()))
    if date_after:
        out.append(c(d.created_at) >= bindparam("f_date_after", type_=d.created_at.type))
    if date_before:
        out.append(c(d.created_at) < bindparam("f_date_before", type_=d.created_at.type))
    if agent:
        out.append(c(d.recorded_by) == bindparam("f_agent"))
    for n in range(tags):
        out.append(
            exists().where(
                DecisionTag.decision_id == d.id, DecisionTag.tag == bindparam(f"f_tag{n}")
            )
        )
    if project:
        out.append(c(d.project) == bindparam("f_project"))
    if feature:
        out.append(c(d.feature) == bindparam("f_feature"))
    if pr:
        out.append(c(d.pr) == bindparam("f_pr"))
    if has_outcome is not None:
        outcome = c(d.outcome)
        out.append(outcome.is_not(None) if has_outcome == "with" else outcome.is_(None))
    if current:
        out.append(c(d.superseded_by).is_(None))
    return out


@functools.lru_cache(maxsize=256)
def _briefs(shape: Shape, sqlite: bool) -> Select[Any]:
    return select(*SEARCH_COLUMNS).where(
        Decision.id.in_(bindparam("ids", expanding=True)), *conditions(shape, by_id=sqlite)
    )


def matching_briefs(conn: Connection, ids: Sequence[str], f: SearchFilters) -> dict[str, Brief]:
    """The rows with these ids that satisfy ``f``, by id (no tags yet)."""
    if not ids:
        return {}
    statement = _briefs(shape(f), conn.dialect.name == "sqlite")
    rows = conn.execute(statement, {"ids": list(ids), **values(f)})
    return {row[0]: Brief(*row) for row in rows}


@functools.lru_cache(maxsize=256)
def _ids(shape: Shape) -> Select[Any]:
    return select(Decision.id).where(*conditions(shape)).limit(bindparam("cap"))


def matching_ids(conn: Connection, f: SearchFilters, cap: int) -> list[str]:
    """The ids of up to ``cap`` decisions that satisfy ``f`` (in no particular order)."""
    return list(conn.execute(_ids(shape(f)), {"cap": cap, **values(f)}).scalars())
