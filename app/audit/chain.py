"""Appending to the audit chain, in the transaction of the rows an entry covers.

Insert sites call ``append(session, …)`` once per insert: with the ``Covered`` of rows they
inserted with Core (``canonical.covered``), or with ORM objects they added (digested when the
transaction commits, after the last flush, so their keys are assigned). Nothing is written
then: the entries of a transaction are written together just before it commits (a
``before_commit`` hook on every Session, registered when this module is imported), with one
lock, one read of the head and one INSERT, whatever the number of entries:

- Postgres: ``SELECT seq, hash FROM cstp_audit_head()`` takes a transaction-level advisory
  lock (``LOCK_KEY``) and then reads the head. The function is VOLATILE, so its read takes a
  fresh snapshot after the lock is granted and sees the entries of the transaction that held
  it before (committed when it let go). The lock is held until this transaction ends: for
  the INSERT and the COMMIT.
- SQLite: a write transaction already holds the database's only write lock (``BEGIN
  IMMEDIATE``), so the head needs no lock of its own. Each of the server's engines
  (app.db.sqlite_driver; any other engine reads the head) remembers the head its last
  committed append left, and appends after it without reading it: ``seq`` is the primary key
  and has no gaps, so when another engine or process appended since, the first entry's
  ``seq`` is taken and the INSERT fails as a whole (nothing written); the head is then read
  and the entries linked after it. A statement saved in every audited write transaction, and
  so time under the write lock. On the server's engines (app.db.sqlite_driver) the
  entries are linked after that head in the hook (when the engine has no head yet, as after a
  start, on the driver's worker thread after reading it), and inserted on that thread in the
  same hand-off as COMMIT (where a stale head is read and the entries linked anew), so the
  chain adds no hand-off of its own to a transaction.

The entry hash is an HMAC-SHA256 under the audit key when one is configured for the engine
(``use_key``), else a plain SHA-256; the key never reaches the database.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import sqlite3
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from app.db.base import Base
from app.db.sqlite_driver import OneHopConnection

from .canonical import Covered, covered_object, encode
from .repository import entries as store
from .repository.entries import CHAIN as CHAIN
from .repository.entries import GENESIS as GENESIS
from .repository.entries import HEAD_FUNCTION as HEAD_FUNCTION

LOCK_KEY = 0x6373747061756474  # "cstpaudt": the advisory lock that serializes appends
PENDING = "cstp.audit.pending"


@dataclass(frozen=True)
class Key:
    """The audit key of an engine's database (``secret`` None: a plain SHA-256 chain)."""

    secret: bytes | None = None

    def __repr__(self) -> str:  # never the key itself
        return f"Key(keyed={self.secret is not None})"


_keys: weakref.WeakKeyDictionary[Engine, Key] = weakref.WeakKeyDictionary()


def use_key(engine: AsyncEngine | Engine, secret: bytes | None) -> None:
    """Sessions on ``engine`` chain under ``secret`` (None: no key). Every engine that writes
    audited rows must be given its key, even none: an unknown engine fails the commit rather
    than writing entries under the wrong key."""
    _keys[engine.sync_engine if isinstance(engine, AsyncEngine) else engine] = Key(secret)


def key_for(engine: Engine) -> Key:
    try:
        return _keys[engine]
    except KeyError:
        raise RuntimeError(
            "audited rows written on a database engine with no audit key setting "
            "(app.audit.chain.use_key)"
        ) from None


def entry_hash(
    secret: bytes | None, seq: int, table: str, row_id: str, digest: str, prev: str
) -> str:
    """An entry's hash: over the compact sorted-key JSON of its seq, table, row id, digest and
    previous hash; HMAC-SHA256 under the key, or SHA-256 without one."""
    message = encode({"seq": seq, "table": table, "row_id": row_id, "digest": digest, "prev": prev})
    if secret is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def append(session: AsyncSession | Session, *items: Covered | Base) -> None:
    """Chain these rows when ``session``'s transaction commits (no I/O now). An ORM object
    must be added to the session; it is digested after the commit's last flush."""
    pending: list[Covered | Base] = session.info.setdefault(PENDING, [])
    pending.extend(items)


def link(
    start: tuple[int, str], entries: Sequence[Covered], secret: bytes | None
) -> list[dict[str, Any]]:
    """The rows of ``entries`` appended after the entry ``start`` (seq, hash)."""
    seq, prev = start
    rows = []
    for entry in entries:
        seq += 1
        digest = entry.digest
        hashed = entry_hash(secret, seq, entry.table, entry.row_id, digest, prev)
        rows.append(
            {
                "seq": seq,
                "table_name": entry.table,
                "row_id": entry.row_id,
                "digest": digest,
                "prev_hash": prev,
                "hash": hashed,
                "keyed": secret is not None,
                "workspace": entry.workspace,
            }
        )
        prev = hashed
    return rows


HEAD_AFTER_COMMIT = "cstp.audit.head"

# Told after each commit that appended entries: the entries, and the sequence number of the
# first (the others follow it). Tracing puts a row's entry on the span of the call that wrote
# it (app.observability.tracing); empty unless tracing is on.
observers: list[Callable[[Sequence[Covered], int], None]] = []

# SQLite: the head each engine's last committed append left (see the module docstring).
_heads: weakref.WeakKeyDictionary[Engine, tuple[int, str]] = weakref.WeakKeyDictionary()


def write(conn: Connection, entries: Sequence[Covered], secret: bytes | None) -> tuple[int, str]:
    """Lock, read the head, and insert ``entries`` after it in one statement
    (``repository.entries.insert_entries``). Returns the new head."""
    rows = link(store.head(conn, lock=True), entries, secret)
    store.insert_entries(conn, rows)
    return rows[-1]["seq"], rows[-1]["hash"]


def _append_at_commit(
    linked: list[dict[str, Any]] | None,
    entries: Sequence[Covered],
    secret: bytes | None,
    new_head: list[tuple[int, str]],
    conn: sqlite3.Connection,
) -> None:
    """SQLite, on the driver's worker thread just before COMMIT (the write lock held): insert
    the entries as ``linked`` (after the head this engine last left; when None, read the head
    and link ``entries`` after it); when another appender took the next ``seq`` since, read
    the head and link after it. The head left is put in ``new_head``."""
    if linked is None:
        rows = store.sqlite_insert(conn, link(store.sqlite_head(conn), entries, secret), None)
    else:
        relink = functools.partial(_relink, entries=entries, secret=secret)
        rows = store.sqlite_insert(conn, linked, relink)
    new_head.append((rows[-1]["seq"], rows[-1]["hash"]))


def _relink(
    start: tuple[int, str], *, entries: Sequence[Covered], secret: bytes | None
) -> list[dict[str, Any]]:
    return link(start, entries, secret)


@event.listens_for(Session, "before_commit")
def _write_pending(session: Session) -> None:
    """Write the transaction's entries just before it commits (not when a savepoint is
    released: the outer transaction's commit writes them all)."""
    if session.in_nested_transaction() or not session.info.get(PENDING):
        return
    session.flush()  # the ORM rows first: their keys, then their digests
    pending = session.info.pop(PENDING)
    entries = [item if isinstance(item, Covered) else covered_object(item) for item in pending]
    conn = session.connection()
    secret = key_for(conn.engine).secret
    new_head: list[tuple[int, str]] = []
    session.info[HEAD_AFTER_COMMIT] = (conn.engine, new_head, entries)
    if conn.dialect.name != "sqlite":
        new_head.append(write(conn, entries, secret))
        return
    driver: Any = conn.connection.dbapi_connection  # typed as the DBAPI protocol
    if isinstance(driver, OneHopConnection):  # the server's engines: in the COMMIT's hand-off
        # Linked here, on the thread that computed the digests, where hashing is still in
        # the CPU's caches: the worker thread's share, under the write lock, is smaller.
        known = _heads.get(conn.engine)
        linked = link(known, entries, secret) if known is not None else None
        driver.run_before_commit(
            functools.partial(_append_at_commit, linked, entries, secret, new_head)
        )
        return
    # Any other SQLite engine (a script's own): read the head and insert after it. The
    # transaction has written the rows it covers, so it holds the database's only write lock
    # and nobody appends in between; had it written nothing yet, and another connection
    # appended since its first read, SQLite refuses the INSERT (a busy snapshot in WAL mode)
    # and the commit fails rather than forking the chain.
    new_head.append(write(conn, entries, secret))


@event.listens_for(Session, "after_commit")
def _remember_head(session: Session) -> None:
    """SQLite: the head this transaction's append left is the engine's head now. Then the
    observers learn what was appended."""
    done = session.info.pop(HEAD_AFTER_COMMIT, None)
    if done is None or not done[1]:
        return
    engine, (head, *_), entries = done
    if engine.dialect.name == "sqlite":
        _heads[engine] = head
    for observer in observers:
        observer(entries, head[0] - len(entries) + 1)


@event.listens_for(Session, "after_rollback")
def _forget_head(session: Session) -> None:
    session.info.pop(HEAD_AFTER_COMMIT, None)
