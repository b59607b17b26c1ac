"""Verification of the audit chain, and checkpoints of its head.

``verify`` reads the chain in order of ``seq`` (in batches, in one read transaction, so a live
server's commits are either wholly in its snapshot or not at all) and reports every problem
with the entry's sequence number, table and row id:

- ``missing``: entries absent from the sequence (deleted);
- ``hash``: an entry whose hash is not the hash of its own content under the audit key (the
  entry was edited, or computed without the key);
- ``link``: an entry whose ``prev_hash`` is not the previous entry's hash;
- ``changed``: the covered row (with its child rows) no longer has the digest recorded;
- ``deleted``: the covered row is gone;
- ``inserted``: an audited row that no entry covers; its ``seq`` is the last entry whose
  row is not newer than it (where it would have been chained);
- ``duplicate``: a row covered by more than one entry;
- ``rule-set``: a stored rule set whose content does not hash to its key, or an evaluation
  whose rule set is not stored;
- ``checkpoint``: a checkpoint that does not match the chain (its entry differs), whose MAC
  does not hold, or that is beyond the chain's end (``truncated``: entries were cut off).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, and_, cast, exists, func, select

from app.db.base import table_of
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleSet

from .canonical import AUDITED, Audited, digest_of, encode, iso_utc, load
from .chain import CHAIN, GENESIS, entry_hash

Progress = Callable[[int, int], None]
BATCH = 500
MAX_INSERTED = 100  # inserted rows reported one by one; beyond, a count
CHECKPOINT_FORMAT = "cstp-audit-checkpoint/1"


@dataclass(frozen=True)
class Problem:
    kind: str
    seq: int | None  # the entry (first of a range), or where an inserted row belongs
    table: str | None
    row_id: str | None
    detail: str
    last: int | None = None  # the last entry of a range

    def line(self) -> str:
        where = "seq -" if self.seq is None else f"seq {self.seq}"
        if self.last is not None and self.last != self.seq:
            where += f"..{self.last}"
        if self.kind == "inserted" and self.seq is not None:
            where = f"after seq {self.seq}"
        row = f" {self.table} {self.row_id}" if self.table else ""
        return f"{where}{row}: {self.kind}: {self.detail}"


@dataclass
class Report:
    first: int  # the first entry checked
    last: int  # the chain's last entry (0: empty)
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# ---- checkpoints ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    hash: str
    time: str
    keyed: bool
    mac: str
    source: str = ""

    def signed(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "seq": self.seq,
            "hash": self.hash,
            "time": self.time,
            "keyed": self.keyed,
        }

    def as_json(self) -> str:
        return json.dumps({**self.signed(), "mac": self.mac}, separators=(", ", ": "))


def checkpoint_mac(secret: bytes | None, body: dict[str, Any]) -> str:
    message = encode(body)
    if secret is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def take_checkpoint(conn: Connection, secret: bytes | None, now: datetime) -> Checkpoint:
    """The chain's head now (seq 0 and the genesis hash for an empty chain), with its MAC."""
    row = conn.execute(
        select(CHAIN.c.seq, CHAIN.c.hash).order_by(CHAIN.c.seq.desc()).limit(1)
    ).first()
    seq, hashed = (0, GENESIS) if row is None else (int(row[0]), str(row[1]))
    draft = Checkpoint(seq, hashed, iso_utc(now), secret is not None, "")
    return Checkpoint(seq, hashed, draft.time, draft.keyed, checkpoint_mac(secret, draft.signed()))


def read_checkpoint(text: str, source: str) -> Checkpoint:
    """A checkpoint from its JSON text; ValueError saying why it is not one."""
    try:
        data = json.loads(text)
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a checkpoint (format {data.get('format')!r})")
        point = Checkpoint(
            seq=int(data["seq"]),
            hash=str(data["hash"]),
            time=str(data["time"]),
            keyed=bool(data["keyed"]),
            mac=str(data["mac"]),
            source=source,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: not a checkpoint ({exc})") from None
    return point


def _check_point(
    conn: Connection, point: Checkpoint, secret: bytes | None, last: int
) -> list[Problem]:
    where = f"checkpoint {point.source} ({point.time})"
    if point.keyed and secret is None:
        return [
            Problem("checkpoint", point.seq, None, None, f"{where} is keyed: set the audit key")
        ]
    expected = checkpoint_mac(secret if point.keyed else None, point.signed())
    if not hmac.compare_digest(expected, point.mac):
        return [
            Problem(
                "checkpoint",
                point.seq,
                None,
                None,
                f"{where}: its MAC does not hold (the file was edited, or made with another key)",
            )
        ]
    if point.seq > last:
        return [
            Problem(
                "truncated",
                last + 1,
                None,
                None,
                f"the chain ends at seq {last}, but {where} recorded seq {point.seq}: "
                f"entries {last + 1}..{point.seq} were cut off",
                last=point.seq,
            )
        ]
    if point.seq == 0:
        return []
    row = conn.execute(select(CHAIN.c.hash).where(CHAIN.c.seq == point.seq)).first()
    if row is None:
        return [Problem("checkpoint", point.seq, None, None, f"{where}: the entry is missing")]
    if not hmac.compare_digest(str(row[0]), point.hash):
        return [
            Problem(
                "checkpoint",
                point.seq,
                None,
                None,
                f"{where}: the entry's hash is not the one recorded (the chain was rewritten)",
            )
        ]
    return []


# ---- verification -----------------------------------------------------------------------------


def _batches(conn: Connection, start: int) -> Iterator[Sequence[Any]]:
    after = start - 1
    while True:
        rows = conn.execute(
            select(CHAIN).where(CHAIN.c.seq > after).order_by(CHAIN.c.seq).limit(BATCH)
        ).all()
        if not rows:
            return
        yield rows
        after = int(rows[-1].seq)


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
    last = int(conn.execute(select(func.max(CHAIN.c.seq))).scalar() or 0)
    total = int(conn.execute(select(func.count()).where(CHAIN.c.seq >= start)).scalar() or 0)
    report = Report(first=start, last=last)
    problems: list[Problem] = []
    if start == 1:
        prev: str | None = GENESIS
    else:
        before = conn.execute(select(CHAIN.c.hash).where(CHAIN.c.seq == start - 1)).first()
        prev = None if before is None else str(before[0])
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
    problems.extend(_duplicates(conn))
    problems.extend(_inserted(conn))
    problems.extend(_rule_sets(conn))
    for point in checkpoints:
        problems.extend(_check_point(conn, point, secret, last))
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
        if not hmac.compare_digest(hashed, str(e.hash)):
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
        docs = load(conn, audited, [str(e.row_id) for e in entries])
        for e in entries:
            doc = docs.get(str(e.row_id))
            if doc is None:
                out.append(Problem("deleted", int(e.seq), table, str(e.row_id), "the row is gone"))
            elif digest_of(doc) != str(e.digest):
                out.append(
                    Problem(
                        "changed",
                        int(e.seq),
                        table,
                        str(e.row_id),
                        "the row (or one of its child rows) is not what was recorded",
                    )
                )
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
        time = table.c[audited.time]
        covered = exists().where(and_(CHAIN.c.table_name == audited.name, CHAIN.c.row_id == row_id))
        rows = conn.execute(
            select(row_id, time).where(~covered).order_by(time).limit(MAX_INSERTED + 1)
        ).all()
        found.extend((r[1], audited.name, str(r[0])) for r in rows)
    found.sort()
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
            .where(table.c[audited.time] <= when)
        ).scalar()
        best = max(best, int(seq or 0))
    return best


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
