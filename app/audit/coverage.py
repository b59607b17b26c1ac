"""What ``cstp audit verify`` checks beyond walking the chain (app.audit.verify): audited rows
that no entry covers (``inserted``) or that two cover (``duplicate``), the stored rule sets
(``rule-set``), decisions whose review columns, which the chain leaves out, are not a copy
of their latest review (``review``), decisions whose ``superseded_by`` is not the decision
of their latest supersede link (``supersede``), and workspaces that disagree
(``workspace``): an entry's or a child row's (a reason's, a match's, …) that is not its
row's. A row's own workspace is in its digest; these are not, and row-level security reads
them (docs/AUDIT.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Connection

from .canonical import AUDITED
from .problems import Problem
from .repository import rows as stored

MAX_INSERTED = 100  # inserted rows reported one by one; beyond, a count


def duplicates(conn: Connection) -> list[Problem]:
    rows = stored.duplicates(conn)
    return [
        Problem("duplicate", int(r[3]), str(r[0]), str(r[1]), f"also covered by seq {r[2]}")
        for r in rows
    ]


def inserted(conn: Connection) -> list[Problem]:
    """Audited rows that no entry covers, oldest first, each placed after the last entry
    whose row is not newer."""
    found: list[tuple[Any, str, str]] = []
    for audited in AUDITED.values():
        rows = stored.uncovered(conn, audited, MAX_INSERTED + 1)
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
    return max(
        (stored.last_covered_before(conn, audited, when) for audited in AUDITED.values()),
        default=0,
    )


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
    ("review_source", "source"),
)


def review_copies(conn: Connection) -> list[Problem]:
    """Decisions whose review columns are not those of their latest review (or, with no
    review, not empty and ``pending``), compared as stored. The latest is the review with the
    greatest id, as everywhere (app.decisions.repository, "which review is the latest"), never
    the one with the latest ``reviewed_at``."""
    out = []
    for row in stored.review_copies(conn, REVIEW_COPY):
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


def supersede_copies(conn: Connection) -> list[Problem]:
    """Decisions whose ``superseded_by``, which the chain does not cover (it is set when a
    later decision supersedes this one), is not the decision of the latest link naming them
    (the greatest id: links are made under the superseded decision's row lock, like reviews);
    or is set while no link names them. The links are child rows of the superseding decision,
    covered by its entry: one deleted or changed is also reported there."""
    out = []
    for row in stored.supersede_copies(conn):
        if row["link_id"] is None:
            why = f"superseded_by is {row['superseded_by']!r}, yet no supersede link names it"
        elif row["superseded_by"] != row["by"]:
            why = (
                f"superseded_by is {row['superseded_by']!r}, not {row['by']!r}, the decision "
                f"of its latest supersede link (decision_supersedes {row['link_id']})"
            )
        else:
            continue
        seq = row["seq"] if type(row["seq"]) is int else None
        out.append(Problem("supersede", seq, "decisions", str(row["id"]), why))
    return out


def rule_sets(conn: Connection) -> list[Problem]:
    out = []
    for r in stored.rule_sets(conn):
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
    missing = stored.unstored_rule_sets(conn)
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


def workspaces(conn: Connection) -> list[Problem]:
    out: list[Problem] = []
    for audited in AUDITED.values():
        for seq, row_id, entry, row in stored.misplaced_entries(conn, audited, MAX_INSERTED):
            detail = f"the entry says workspace {entry!r}, the row is in {row!r}"
            out.append(Problem("workspace", int(seq), audited.name, str(row_id), detail))
        for child in audited.children:
            found = stored.misplaced_children(
                conn, audited, child.table, child.parent, MAX_INSERTED
            )
            for seq, row_id, theirs, row in found:
                detail = (
                    f"a row of {child.table.name} is in workspace {theirs!r}, its row in {row!r}"
                )
                place = None if seq is None else int(seq)
                out.append(Problem("workspace", place, audited.name, str(row_id), detail))
    return out
