"""The reads of audited rows: the rows (and child rows) entries cover, for digests and
verification, and the joins of the coverage checks (rows no entry covers, rows two cover,
review columns against the latest review, ``superseded_by`` against the latest supersede
link, rule sets against their evaluations)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    String,
    Table,
    Text,
    and_,
    cast,
    exists,
    func,
    select,
    type_coerce,
)
from sqlalchemy.types import NullType

from app.audit.canonical import Audited
from app.db.base import table_of
from app.db.decisions import Decision, DecisionReview, DecisionSupersede
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleSet

from .entries import CHAIN

Children = dict[str, dict[str, list[dict[str, Any]]]]


def _as_stored(column: Any) -> Any:
    """A column as the database holds it, without its type's conversion."""
    return type_coerce(column, NullType())


# --- audited rows ------------------------------------------------------------------------------


def fetch(
    conn: Connection,
    audited: Audited,
    keys: Sequence[Any],
    columns: Sequence[str],
    *,
    raw: bool,
    child_columns: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, dict[str, Any]], Children]:
    """The stored rows among ``keys`` (key as text -> column -> value, for ``columns``) and
    their child rows (key as text -> child table -> rows, for ``child_columns`` of that table,
    by default its ``Child.columns``); with ``raw``, the values as the database returns them,
    without the column types' conversions."""

    def col(table: Table, name: str) -> Any:
        c = table.c[name]
        if not raw:
            return c
        if isinstance(c.type, JSON):  # its text as stored (asyncpg would hand it over parsed)
            return cast(c, Text).label(name)
        return _as_stored(c).label(name)

    table, key = audited.table, audited.table.c[audited.key]
    listed = select(*(col(table, c) for c in columns)).where(key.in_(keys))
    rows = {str(r[audited.key]): dict(r) for r in conn.execute(listed).mappings()}
    children: Children = {r: {} for r in rows}
    for child in audited.children:
        parent = child.table.c[child.parent]
        listed_children = (child_columns or {}).get(child.table.name, child.columns)
        wanted = select(parent, *(col(child.table, c) for c in listed_children))
        for r in conn.execute(wanted.where(parent.in_(keys))).mappings():
            children[str(r[child.parent])].setdefault(child.table.name, []).append(dict(r))
    return rows, children


# --- coverage ----------------------------------------------------------------------------------


def _row_id(audited: Audited) -> Any:
    key = audited.table.c[audited.key]
    return key if isinstance(key.type, String) else cast(key, String(64))


def duplicates(conn: Connection) -> Sequence[Any]:
    """(table, row id, first seq, last seq) of each row covered by more than one entry."""
    return conn.execute(
        select(CHAIN.c.table_name, CHAIN.c.row_id, func.min(CHAIN.c.seq), func.max(CHAIN.c.seq))
        .group_by(CHAIN.c.table_name, CHAIN.c.row_id)
        .having(func.count() > 1)
    ).all()


def uncovered(conn: Connection, audited: Audited, limit: int) -> Sequence[Any]:
    """(row id, time as stored) of up to ``limit`` rows of ``audited`` no entry covers,
    oldest first."""
    table, row_id = audited.table, _row_id(audited)
    # as stored: a forged row's time may be nothing a timestamp column type can read
    time = _as_stored(table.c[audited.time])
    covered = exists().where(and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == row_id))
    return conn.execute(select(row_id, time).where(~covered).order_by(time).limit(limit)).all()


def last_covered_before(conn: Connection, audited: Audited, when: Any) -> int:
    """The greatest seq of an entry covering a row of ``audited`` not newer than ``when``."""
    table = audited.table
    seq = conn.execute(
        select(func.max(CHAIN.c.seq))
        .select_from(
            CHAIN.join(
                table,
                and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == _row_id(audited)),
            )
        )
        .where(_as_stored(table.c[audited.time]) <= when)
    ).scalar()
    return int(seq or 0)


def review_copies(conn: Connection, copy: Sequence[tuple[str, str]]) -> Any:
    """Per decision, by id: its ``id``, the ``seq`` covering it, its ``status``, its latest
    review's ``review_id`` (the greatest id), and for each (decision column, review column)
    of ``copy`` the values as stored, labelled ``d_<column>`` and ``r_<column>``."""
    decisions, reviews = table_of(Decision), table_of(DecisionReview)

    def raw(column: Any, label: str) -> Any:
        return _as_stored(column).label(label)

    latest = (
        select(reviews.c.decision_id, func.max(reviews.c.id).label("review_id"))
        .group_by(reviews.c.decision_id)
        .subquery()
    )
    query = (
        select(
            decisions.c.id,
            CHAIN.c.seq,
            raw(decisions.c.status, "status"),
            reviews.c.id.label("review_id"),
            *(raw(decisions.c[d], f"d_{d}") for d, _ in copy),
            *(raw(reviews.c[r], f"r_{r}") for _, r in copy),
        )
        .select_from(
            decisions.outerjoin(latest, latest.c.decision_id == decisions.c.id)
            .outerjoin(reviews, reviews.c.id == latest.c.review_id)
            .outerjoin(
                CHAIN, and_(CHAIN.c.table_name == "decisions", CHAIN.c.row_id == decisions.c.id)
            )
        )
        .order_by(decisions.c.id)
    )
    return conn.execute(query).mappings()


def supersede_copies(conn: Connection) -> Any:
    """Per decision that has ``superseded_by`` set or a link naming it, by id: its ``id``,
    the ``seq`` covering it, ``superseded_by`` as stored, and its latest link's ``link_id``
    (the greatest id among the links naming it) and ``by`` (that link's decision)."""
    decisions, links = table_of(Decision), table_of(DecisionSupersede)
    latest = (
        select(links.c.superseded_id, func.max(links.c.id).label("link_id"))
        .group_by(links.c.superseded_id)
        .subquery()
    )
    query = (
        select(
            decisions.c.id,
            CHAIN.c.seq,
            _as_stored(decisions.c.superseded_by).label("superseded_by"),
            links.c.id.label("link_id"),
            _as_stored(links.c.decision_id).label("by"),
        )
        .select_from(
            decisions.outerjoin(latest, latest.c.superseded_id == decisions.c.id)
            .outerjoin(links, links.c.id == latest.c.link_id)
            .outerjoin(
                CHAIN, and_(CHAIN.c.table_name == "decisions", CHAIN.c.row_id == decisions.c.id)
            )
        )
        .where(decisions.c.superseded_by.is_not(None) | latest.c.link_id.is_not(None))
        .order_by(decisions.c.id)
    )
    return conn.execute(query).mappings()


def rule_sets(conn: Connection) -> Any:
    """Every stored rule set's ``hash`` and ``content``."""
    sets = table_of(GuardrailRuleSet)
    return conn.execute(select(sets.c.hash, sets.c.content))


def unstored_rule_sets(conn: Connection) -> Sequence[Any]:
    """(hash, first seq covering an evaluation that used it, how many did) of each rule set
    evaluations name that is not stored."""
    sets, evaluations = table_of(GuardrailRuleSet), table_of(GuardrailEvaluation)
    stored = exists().where(sets.c.hash == evaluations.c.rule_set_hash)
    return conn.execute(
        select(evaluations.c.rule_set_hash, func.min(CHAIN.c.seq), func.count())
        .select_from(
            evaluations.outerjoin(
                CHAIN,
                and_(
                    CHAIN.c.table_name == "guardrail_evaluations",
                    CHAIN.c.row_id == evaluations.c.id,
                ),
            )
        )
        .where(evaluations.c.rule_set_hash.is_not(None), ~stored)
        .group_by(evaluations.c.rule_set_hash)
    ).all()


# --- workspaces -------------------------------------------------------------------------------


def misplaced_entries(conn: Connection, audited: Audited, limit: int) -> Sequence[Any]:
    """(seq, row id, entry's workspace, row's workspace) of up to ``limit`` entries covering a
    row of ``audited`` whose workspace is not the row's."""
    table = audited.table
    return conn.execute(
        select(CHAIN.c.seq, _row_id(audited), CHAIN.c.workspace, table.c.workspace)
        .select_from(
            CHAIN.join(
                table,
                and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == _row_id(audited)),
            )
        )
        .where(CHAIN.c.workspace != table.c.workspace)
        .order_by(CHAIN.c.seq)
        .limit(limit)
    ).all()


def misplaced_children(
    conn: Connection, audited: Audited, child: Table, parent: str, limit: int
) -> Sequence[Any]:
    """(parent's seq, parent's id, child's workspace, parent's workspace), once each, of up
    to ``limit`` parents with child rows whose workspace is not theirs."""
    table = audited.table
    key = table.c[audited.key]
    return conn.execute(
        select(CHAIN.c.seq, _row_id(audited), child.c.workspace, table.c.workspace)
        .select_from(
            child.join(table, child.c[parent] == key).outerjoin(
                CHAIN,
                and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == _row_id(audited)),
            )
        )
        .where(child.c.workspace != table.c.workspace)
        .distinct()
        .limit(limit)
    ).all()
