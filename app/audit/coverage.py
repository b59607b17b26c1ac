"""What ``cstp audit verify`` checks beyond walking the chain (app.audit.verify): audited rows
that no entry covers (``inserted``) or that two cover (``duplicate``), the stored rule sets
(``rule-set``), and decisions whose review columns, which the chain leaves out, are not a copy
of their latest review (``review``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Connection, String, and_, cast, exists, func, select, type_coerce
from sqlalchemy.types import NullType

from app.db.base import table_of
from app.db.decisions import Decision, DecisionReview
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleSet

from .canonical import AUDITED, Audited
from .chain import CHAIN
from .problems import Problem

MAX_INSERTED = 100  # inserted rows reported one by one; beyond, a count


def _row_id(audited: Audited) -> Any:
    key = audited.table.c[audited.key]
    return key if isinstance(key.type, String) else cast(key, String(64))


def duplicates(conn: Connection) -> list[Problem]:
    rows = conn.execute(
        select(CHAIN.c.table_name, CHAIN.c.row_id, func.min(CHAIN.c.seq), func.max(CHAIN.c.seq))
        .group_by(CHAIN.c.table_name, CHAIN.c.row_id)
        .having(func.count() > 1)
    ).all()
    return [
        Problem("duplicate", int(r[3]), str(r[0]), str(r[1]), f"also covered by seq {r[2]}")
        for r in rows
    ]


def inserted(conn: Connection) -> list[Problem]:
    """Audited rows that no entry covers, oldest first, each placed after the last entry
    whose row is not newer."""
    found: list[tuple[Any, str, str]] = []
    for audited in AUDITED.values():
        table, row_id = audited.table, _row_id(audited)
        # as stored: a forged row's time may be nothing a timestamp column type can read
        time = type_coerce(table.c[audited.time], NullType())
        covered = exists().where(and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == row_id))
        rows = conn.execute(
            select(row_id, time).where(~covered).order_by(time).limit(MAX_INSERTED + 1)
        ).all()
        found.extend((r[1], audited.name, str(r[0])) for r in rows)
    found.sort(key=lambda f: (str(f[0]), f[1], f[2]))  # ISO-like text, or UTC timestamptz
    out: list[Problem] = []
    for when, name, key in found[:MAX_INSERTED]:
        out.append(
            Problem(
                "inserted",
                _position(conn, when),
                name,
                key,
                "no entry covers this row (it was inserted behind the chain's back)",
            )
        )
    if len(found) > MAX_INSERTED:
        out.append(Problem("inserted", None, None, None, "more rows with no entry"))
    return out


def _position(conn: Connection, when: Any) -> int:
    best = 0
    for audited in AUDITED.values():
        table = audited.table
        seq = conn.execute(
            select(func.max(CHAIN.c.seq))
            .select_from(
                CHAIN.join(
                    table,
                    and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == _row_id(audited)),
                )
            )
            .where(type_coerce(table.c[audited.time], NullType()) <= when)
        ).scalar()
        best = max(best, int(seq or 0))
    return best


# A decision's review columns, which the chain does not cover (every review updates them), and
# the columns of its latest review they copy: the reviews are chained, so the copy is checked.
REVIEW_COPY = (
    ("outcome", "outcome"),
    ("actual_result", "actual_result"),
    ("lessons", "lessons"),
    ("review_notes", "notes"),
    ("affected_kpis", "affected_kpis"),
    ("reviewed_by", "reviewed_by"),
    ("reviewed_at", "reviewed_at"),
)


def review_copies(conn: Connection) -> list[Problem]:
    """Decisions whose review columns are not those of their latest review (or, with no
    review, not empty and ``pending``), compared as stored. The latest is the review with the
    greatest id, as everywhere (app.decisions.repository, "which review is the latest"), never
    the one with the latest ``reviewed_at``."""
    decisions, reviews = table_of(Decision), table_of(DecisionReview)

    def raw(column: Any, label: str) -> Any:
        return type_coerce(column, NullType()).label(label)

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
            *(raw(decisions.c[d], f"d_{d}") for d, _ in REVIEW_COPY),
            *(raw(reviews.c[r], f"r_{r}") for _, r in REVIEW_COPY),
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
    out = []
    for row in conn.execute(query).mappings():
        if row["review_id"] is None:
            differ = [d for d, _ in REVIEW_COPY if row[f"d_{d}"] is not None]
            if row["status"] != "pending":
                differ.insert(0, "status")
            if not differ:
                continue
            why = f"{', '.join(differ)} set, yet it has no review"
        else:
            differ = [
                d for d, r in REVIEW_COPY if _value(d, row[f"d_{d}"]) != _value(d, row[f"r_{r}"])
            ]
            if row["status"] != "reviewed":
                differ.insert(0, "status")
            if not differ:
                continue
            why = (
                f"{', '.join(differ)} not those of its latest review "
                f"(decision_reviews {row['review_id']})"
            )
        seq = row["seq"] if type(row["seq"]) is int else None
        out.append(Problem("review", seq, "decisions", str(row["id"]), why))
    return out


def _value(column: str, stored: Any) -> Any:
    """A review column's value for comparison: ``affected_kpis``'s JSON text parsed (the ORM
    writes a None as SQL NULL in one table and as JSON ``null`` in the other), anything else
    as stored."""
    if column == "affected_kpis" and isinstance(stored, str):
        try:
            return json.loads(stored)
        except ValueError:
            return stored
    return stored


def rule_sets(conn: Connection) -> list[Problem]:
    out = []
    sets = table_of(GuardrailRuleSet)
    for r in conn.execute(select(sets.c.hash, sets.c.content)):
        if hashlib.sha256(str(r.content).encode("utf-8")).hexdigest() != r.hash:
            out.append(
                Problem(
                    "rule-set",
                    None,
                    "guardrail_rule_sets",
                    str(r.hash),
                    "its content does not hash to its key (the rules were edited)",
                )
            )
    evaluations = table_of(GuardrailEvaluation)
    stored = exists().where(sets.c.hash == evaluations.c.rule_set_hash)
    missing = conn.execute(
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
    for rule_set_hash, first, count in missing:
        out.append(
            Problem(
                "rule-set",
                None if first is None else int(first),
                "guardrail_rule_sets",
                str(rule_set_hash),
                f"not stored, yet {count} evaluation(s) used it (the rule set was deleted)",
            )
        )
    return out
