"""The chain seen from inside a running server: its head, and verifying it whole (the
console's "verify now", and the periodic verification behind the metrics) as ``cstp audit
verify`` does.

A verification reads every entry and every audited row: it runs in a thread of its own, on
a snapshot of its own (app.audit.snapshot: its own engine, so it holds none of the server's
connections), so the server's calls go on meanwhile; and one at a time in a process, so two
requests for it never read the database twice over at once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from . import snapshot
from .problems import Report
from .repository import entries
from .verify import verify

if TYPE_CHECKING:
    from app.db.engine import Database


async def head_seq(db: Database) -> int:
    """The sequence number of the chain's last entry (0 for an empty chain)."""
    async with db.transaction(write=False) as session:
        seq, _hash = await session.run_sync(
            lambda sync: entries.head(sync.connection(), lock=False)
        )
    return seq


# One verification at a time in a process: each reads the whole chain.
_running = threading.Lock()


class Busy(Exception):
    """A verification is already running in this process."""


def busy() -> bool:
    """A verification is running in this process now."""
    return _running.locked()


async def verify_chain(database_url: str, key: bytes | None) -> Report:
    """The report of a verification of the whole chain of ``database_url`` under ``key``,
    made now in a worker thread; ``Busy`` when one is already running in this process."""
    if not _running.acquire(blocking=False):
        raise Busy
    try:
        return await asyncio.to_thread(_verify, database_url, key)
    finally:
        _running.release()


def _verify(database_url: str, key: bytes | None) -> Report:
    # A loop of the thread's own: the snapshot's engine is bound to the loop it is used in.
    return asyncio.run(snapshot.read(database_url, lambda conn: verify(conn, key)))
