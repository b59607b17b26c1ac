"""Verification of the audit chain, and checkpoints of its head.

``verify`` reads the chain in order of ``seq`` (in batches, in one read transaction, so a live
server's commits are either wholly in its snapshot or not at all) and reports every problem
with the entry's sequence number, table and row id:

- ``missing``: entries absent from the sequence (deleted);
- ``hash``: an entry whose hash is not the hash of its own content under the audit key (the
  entry was edited, or computed without the key);
- ``link``: an entry whose ``prev_hash`` is not the previous entry's hash;
- ``changed``: the covered row (with its child rows) no longer has the digest recorded, or
  holds a value that is not in the form the server stores (app.audit.stored);
- ``deleted``: the covered row is gone;
- ``inserted``: an audited row that no entry covers; its ``seq`` is the last entry whose
  row is not newer than it (where it would have been chained);
- ``duplicate``: a row covered by more than one entry;
- ``rule-set``: a stored rule set whose content does not hash to its key, or an evaluation
  whose rule set is not stored;
- ``review``: a decision whose review columns (which the chain leaves out: every review
  updates them) are not a copy of its latest review, which is chained;
- ``checkpoint``: a checkpoint that does not match the chain (its entry differs), whose MAC
  does not hold, or that is beyond the chain's end (``truncated``: entries were cut off).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, String, and_, cast, exists, func, select, type_coerce
from sqlalchemy.types import NullType

from app.db.base import table_of
from app.db.decisions import Decision, DecisionReview
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleSet

from .canonical import AUDITED, Audited, digest_of, load_checked
from .chain import CHAIN, GENESIS, entry_hash
from .checkpoints import Checkpoint, check_point
from .problems import Problem, Report

Progress = Callable[[int, int], None]
BATCH = 500
MAX_INSERTED = 100  # inserted rows reported one by one; beyond, a count


# SQLite keeps whatever an UPDATE writes in ``seq``: the entries whose seq is a whole number
# are the chain; the others (text, a real) are reported on their own.
_WHOLE = CHAIN.c.seq == cast(CHAIN.c.seq, BigInteger)


def _batches(conn: Connection, start: int) -> Iterator[Sequence[Any]]:
    after = start - 1
    while True:
        rows = conn.execute(
            select(CHAIN).where(_WHOLE, CHAIN.c.seq > after).order_by(CHAIN.c.seq).limit(BATCH)
        ).all()
        if not rows:
            return
        yield rows
        after = int(rows[-1].seq)


def _not_whole(conn: Connection) -> list[Problem]:
    return [
        Problem(
            "hash",
            None,
            str(e.table_name),
            str(e.row_id),
            f"its seq ({str(e.seq)[:20]!r}) is not a whole number (the entry was edited)",
        )
        for e in conn.execute(select(CHAIN).where(~_WHOLE)).all()
    ]


def verify(
    conn: Connection,
    secret: bytes | None,
    *,
    start: int = 1,
    checkpoints: Sequence[Checkpoint] = (),
    progress: Progress | None = None,
) -> Report:
    """Check the chain from entry ``start`` on (links from the entry before it), every
    audited row's coverage, the rule sets, and each checkpoint."""
    start = max(start, 1)
    last = int(conn.execute(select(func.max(CHAIN.c.seq)).where(_WHOLE)).scalar() or 0)
    total = int(
        conn.execute(select(func.count()).where(_WHOLE, CHAIN.c.seq >= start)).scalar() or 0
    )
    report = Report(first=start, last=last)
    problems: list[Problem] = []
    if start == 1:
        prev: str | None = GENESIS
    else:
        before = conn.execute(select(CHAIN.c.hash).where(CHAIN.c.seq == start - 1)).first()
        prev = None if before is None else str(before[0])
        if start - 1 > last:  # what was verified up to start - 1 is no longer there
            problems.append(
                Problem(
                    "missing",
                    last + 1,
                    None,
                    None,
                    f"the chain ends at seq {last}, before the entry --from follows (entries "
                    "deleted from its end)",
                    start - 1,
                )
            )
        elif before is None:
            problems.append(
                Problem(
                    "missing",
                    start - 1,
                    None,
                    None,
                    "the entry before --from is missing (deleted): the link into the range "
                    "cannot be checked",
                )
            )
    expected = start
    for rows in _batches(conn, start):
        for e in rows:
            seq = int(e.seq)
            gap = seq != expected
            if gap:
                problems.append(
                    Problem("missing", expected, None, None, "entries missing (deleted)", seq - 1)
                )
            problems.extend(_entry_problems(e, secret, None if gap else prev))
            prev, expected = str(e.hash), seq + 1
        problems.extend(_row_problems(conn, rows))
        report.checked += len(rows)
        if progress is not None:
            progress(report.checked, max(total, report.checked))
    problems.extend(_not_whole(conn))
    problems.extend(_duplicates(conn))
    problems.extend(_inserted(conn))
    problems.extend(_rule_sets(conn))
    problems.extend(_review_copies(conn))
    for point in checkpoints:
        problems.extend(check_point(conn, point, secret, last))
    report.problems = _ranges(problems)
    return report


def _entry_problems(e: Any, secret: bytes | None, prev: str | None) -> list[Problem]:
    seq, table, row_id = int(e.seq), str(e.table_name), str(e.row_id)
    out: list[Problem] = []
    if e.keyed and secret is None:
        out.append(
            Problem("hash", seq, table, row_id, "keyed entries: verify with the audit key set")
        )
    else:
        hashed = entry_hash(secret, seq, table, row_id, str(e.digest), str(e.prev_hash))
        if not hmac.compare_digest(hashed.encode(), str(e.hash).encode()):
            why = (
                "the entry's hash is not the HMAC of its content under the audit key "
                "(the entry was edited, or written without the key)"
                if secret is not None
                else "the entry's hash is not the SHA-256 of its content (the entry was edited)"
            )
            out.append(Problem("hash", seq, table, row_id, why))
    if prev is not None and str(e.prev_hash) != prev:
        out.append(
            Problem(
                "link",
                seq,
                table,
                row_id,
                "its prev_hash is not the previous entry's hash (an entry was removed, "
                "inserted or rewritten before it)",
            )
        )
    return out


def _row_problems(conn: Connection, rows: Sequence[Any]) -> list[Problem]:
    out: list[Problem] = []
    by_table: dict[str, list[Any]] = {}
    for e in rows:
        by_table.setdefault(str(e.table_name), []).append(e)
    for table, entries in by_table.items():
        audited = AUDITED.get(table)
        if audited is None:
            out.extend(
                Problem("changed", int(e.seq), table, str(e.row_id), "not an audited table")
                for e in entries
            )
            continue
        docs, unreadable = load_checked(conn, audited, [str(e.row_id) for e in entries])
        for e in entries:
            row_id = str(e.row_id)
            doc = docs.get(row_id)
            if row_id in unreadable:
                kind, why = (
                    "changed",
                    f"a value is not in the form the server stores ({unreadable[row_id]})",
                )
            elif doc is None:
                kind, why = "deleted", "the row is gone"
            elif digest_of(doc) != str(e.digest):
                kind, why = "changed", "the row (or one of its child rows) is not what was recorded"
            else:
                continue
            out.append(Problem(kind, int(e.seq), table, row_id, why))
    return out


def _row_id(audited: Audited) -> Any:
    key = audited.table.c[audited.key]
    return key if isinstance(key.type, String) else cast(key, String(64))


def _duplicates(conn: Connection) -> list[Problem]:
    rows = conn.execute(
        select(CHAIN.c.table_name, CHAIN.c.row_id, func.min(CHAIN.c.seq), func.max(CHAIN.c.seq))
        .group_by(CHAIN.c.table_name, CHAIN.c.row_id)
        .having(func.count() > 1)
    ).all()
    return [
        Problem("duplicate", int(r[3]), str(r[0]), str(r[1]), f"also covered by seq {r[2]}")
        for r in rows
    ]


def _inserted(conn: Connection) -> list[Problem]:
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


def _review_copies(conn: Connection) -> list[Problem]:
    """Decisions whose review columns are not those of their latest review (or, with no
    review, not empty and ``pending``), compared as stored."""
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


def _rule_sets(conn: Connection) -> list[Problem]:
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


def _ranges(problems: list[Problem]) -> list[Problem]:
    """In order of ``seq``, with consecutive ``hash`` problems of one kind merged into a
    range (a chain recomputed without the key fails at every entry)."""
    merged: list[Problem] = []
    for p in (p for p in problems if p.kind == "hash"):
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and p.detail == prev.detail
            and p.seq is not None
            and (prev.last or prev.seq) == p.seq - 1
        ):
            merged[-1] = Problem(prev.kind, prev.seq, None, None, prev.detail, p.seq)
        else:
            merged.append(p)
    rest = [p for p in problems if p.kind != "hash"]
    return sorted([*merged, *rest], key=lambda p: (p.seq is None, p.seq or 0))
