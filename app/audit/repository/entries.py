"""The statements on the audit chain's table (``audit_entries``): the head and the INSERT of
an append (and, on the server's SQLite engines, the same at the driver's level, run just
before COMMIT), and the reads of verification and checkpoints."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, cast, func, insert, select, text

from app.db.audit import AuditEntry
from app.db.base import table_of

GENESIS = "0" * 64
"""The ``prev_hash`` of the first entry."""
HEAD_FUNCTION = "cstp_audit_head"

CHAIN = table_of(AuditEntry)

Rows = list[dict[str, Any]]

# --- appending ---------------------------------------------------------------------------


def head(conn: Connection, *, lock: bool) -> tuple[int, str]:
    """The last entry's (seq, hash), (0, GENESIS) for an empty chain. With ``lock`` on
    Postgres, first takes the appenders' lock (held until the transaction ends)."""
    if lock and conn.dialect.name == "postgresql":
        row = conn.execute(text(f"SELECT seq, hash FROM {HEAD_FUNCTION}()")).first()
    else:
        row = conn.execute(
            select(CHAIN.c.seq, CHAIN.c.hash).order_by(CHAIN.c.seq.desc()).limit(1)
        ).first()
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


_INSERT = insert(CHAIN)


def insert_entries(conn: Connection, rows: Rows) -> None:
    """The rows as parameters of one prepared INSERT: a multi-row VALUES clause would be
    compiled anew for every transaction."""
    conn.execute(_INSERT, rows)


_COLUMNS = ("seq", "table_name", "row_id", "digest", "prev_hash", "hash", "keyed", "workspace")
_SQLITE_INSERT = (
    f"INSERT INTO {CHAIN.name} ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_SQLITE_HEAD = f"SELECT seq, hash FROM {CHAIN.name} ORDER BY seq DESC LIMIT 1"
_SQLITE_TAKEN = f"SELECT 1 FROM {CHAIN.name} WHERE seq = ?"


def sqlite_head(conn: sqlite3.Connection) -> tuple[int, str]:
    """``head`` on the driver's own connection."""
    row = conn.execute(_SQLITE_HEAD).fetchone()
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


def sqlite_insert(
    conn: sqlite3.Connection, rows: Rows, relink: Callable[[tuple[int, str]], Rows] | None
) -> Rows:
    """Insert ``rows`` on the driver's own connection, all or none. When the first ``seq`` is
    taken (another appender's entries since) and ``relink`` is given, the rows it links after
    the head read now are inserted instead. Returns the rows inserted."""
    # executemany is not atomic across its rows: under a savepoint, a failure leaves none, so
    # a taken ``seq`` afterwards can only be another appender's.
    conn.execute("SAVEPOINT cstp_chain")
    try:
        conn.executemany(_SQLITE_INSERT, [tuple(r[c] for c in _COLUMNS) for r in rows])
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK TO cstp_chain")
        if relink is None or conn.execute(_SQLITE_TAKEN, (rows[0]["seq"],)).fetchone() is None:
            raise  # not a stale head: some other constraint (a row chained twice)
        rows = relink(sqlite_head(conn))
        conn.executemany(_SQLITE_INSERT, [tuple(r[c] for c in _COLUMNS) for r in rows])
    finally:
        conn.execute("RELEASE cstp_chain")
    return rows


# --- verification and checkpoints ------------------------------------------------------------

# SQLite keeps whatever an UPDATE writes in ``seq``: the entries whose seq is a whole number
# are the chain; the others (text, a real) are reported on their own.
_WHOLE = CHAIN.c.seq == cast(CHAIN.c.seq, BigInteger)


def entries_after(conn: Connection, after: int, limit: int) -> Sequence[Any]:
    """Up to ``limit`` whole-numbered entries after seq ``after``, in order."""
    return conn.execute(
        select(CHAIN).where(_WHOLE, CHAIN.c.seq > after).order_by(CHAIN.c.seq).limit(limit)
    ).all()


def not_whole(conn: Connection) -> Sequence[Any]:
    """The entries whose seq is not a whole number (edited)."""
    return conn.execute(select(CHAIN).where(~_WHOLE)).all()


def last_seq(conn: Connection) -> int:
    """The greatest whole seq, 0 for an empty chain."""
    return int(conn.execute(select(func.max(CHAIN.c.seq)).where(_WHOLE)).scalar() or 0)


def count_from(conn: Connection, start: int) -> int:
    """How many whole-numbered entries have a seq of ``start`` or more."""
    return int(conn.execute(select(func.count()).where(_WHOLE, CHAIN.c.seq >= start)).scalar() or 0)


def hash_at(conn: Connection, seq: int) -> str | None:
    """The hash of the entry ``seq``, None when there is none."""
    row = conn.execute(select(CHAIN.c.hash).where(CHAIN.c.seq == seq)).first()
    return None if row is None else str(row[0])
