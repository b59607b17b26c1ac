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
- ``supersede``: a decision whose ``superseded_by`` (which the chain leaves out: it is set
  when a later decision supersedes it) is not the decision of its latest supersede link,
  which is chained with the superseding decision;
- ``token``: a stored token that disagrees with its grants, which are chained (revoked_at
  cleared, scopes widened, …; app.audit.grants), or a grant whose token is gone;
- ``checkpoint``: a checkpoint that does not match the chain (its entry differs), whose MAC
  does not hold, or that is beyond the chain's end (``truncated``: entries were cut off).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection

from .canonical import AUDITED, digest_of
from .chain import GENESIS, entry_hash
from .checkpoints import Checkpoint, check_point
from .coverage import (
    duplicates,
    inserted,
    review_copies,
    rule_sets,
    supersede_copies,
    workspaces,
)
from .grants import token_problems
from .problems import Problem, Report
from .repository import entries as store
from .stored import load_checked

Progress = Callable[[int, int], None]
BATCH = 500


def _batches(conn: Connection, start: int) -> Iterator[Sequence[Any]]:
    after = start - 1
    while True:
        rows = store.entries_after(conn, after, BATCH)
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
        for e in store.not_whole(conn)
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
    last = store.last_seq(conn)
    total = store.count_from(conn, start)
    report = Report(first=start, last=last)
    problems: list[Problem] = []
    if start == 1:
        prev: str | None = GENESIS
    else:
        prev = before = store.hash_at(conn, start - 1)
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
    problems.extend(duplicates(conn))
    problems.extend(inserted(conn))
    problems.extend(rule_sets(conn))
    problems.extend(review_copies(conn))
    problems.extend(supersede_copies(conn))
    problems.extend(workspaces(conn))
    problems.extend(token_problems(conn))
    for point in checkpoints:
        problems.extend(check_point(conn, point, secret, last))
    report.problems = _ranges(problems)
    return report


def entry_problems(conn: Connection, entries: Sequence[Any], secret: bytes | None) -> list[Problem]:
    """The problems of these entries on their own: each one's hash and its row (the console
    shows a decision's entries so; the links between entries are the whole chain's check)."""
    out: list[Problem] = []
    for e in entries:
        out.extend(_entry_problems(e, secret, None))
    out.extend(_row_problems(conn, entries))
    return out


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
