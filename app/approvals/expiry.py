"""Writing the expiry of approvals whose deadline has passed, for the audit chain.

An approval reads as expired from its deadline on whether or not this has run
(app.approvals.service.status_of); the expiry row makes the end of the request evidence in
the chain, like a person's decision. Its ``decided_at`` is the deadline: when it expired,
not when the row was written. Several server processes may run this at once: each expiry is
inserted under a savepoint, and one that another process (or a person's decision just before
the deadline) wrote first is skipped, its chain entry with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError

from app.audit.canonical import covered
from app.audit.chain import append
from app.db.approvals import EXPIRED
from app.db.engine import Database
from app.webhooks import enqueue_many

from . import repository
from .service import decided_message

log = logging.getLogger("cstp.approvals")

EVERY_SECONDS = 5.0
"""How often a server looks for approvals to expire (their status is right without it)."""
BATCH = 100
SKEW = timedelta(seconds=60)
"""How far another server process's clock may be behind this one's."""
GRACE = timedelta(seconds=5)
"""How long after a deadline by this clock its expiry is written: a person deciding at the
last moment through a server whose clock is a little behind is not refused for an expiry
written by this one. (The status reads expired from the deadline on, whatever this says.)"""
FULL_PASS = timedelta(minutes=10)
"""How often a pass looks at every deadline again (one written late, by a clock far behind)."""


async def expire_overdue(
    db: Database, now: Callable[[], datetime], since: datetime | None = None
) -> int:
    """Write the expiry of up to ``BATCH`` overdue approvals (those whose deadline is after
    ``since``, when given); how many were written."""
    _found, written = await _pass(db, now, since)
    return written


async def _pass(
    db: Database, now: Callable[[], datetime], since: datetime | None
) -> tuple[int, int]:
    """One pass: how many overdue approvals it found, and of those how many it expired."""
    moment = now() - GRACE
    overdue = await db.read(
        lambda conn: repository.overdue(conn, now=moment, since=since, limit=BATCH)
    )
    if not overdue:
        return 0, 0
    written = 0
    told = []
    async with db.transaction(write=True) as session:
        for approval in overdue:
            row = {
                "approval_id": approval.id,
                "workspace": approval.workspace,
                "verdict": EXPIRED,
                "decided_by": None,
                "decided_at": approval.expires_at,
                "reason": None,
            }
            try:
                async with session.begin_nested():
                    await repository.insert_decision(session, row)
            except IntegrityError:  # decided, or expired by another process, meanwhile
                continue
            append(session, covered("approval_decisions", row))
            told.append(decided_message(approval, row))
            written += 1
        await enqueue_many(session, told)
    return len(overdue), written


async def loop(db: Database, now: Callable[[], datetime]) -> None:
    """Every ``EVERY_SECONDS``, write the expiries that are due. The first pass looks at every
    approval (a server that was down has a backlog); once a pass has found them all, the next
    ones look only at deadlines since the last such pass (less ``SKEW``): an approval is
    made before its deadline, so an earlier deadline was there to be found then. Every
    ``FULL_PASS`` a pass looks at all of them again."""
    since: datetime | None = None
    full = now()
    while True:
        try:
            started = now()
            if started - full >= FULL_PASS:
                since, full = None, started
            found, written = await _pass(db, now, since)
            if written:
                log.info("approvals: %d expired", written)
            if found < BATCH:  # none left over: the next pass looks from here on
                since = started - GRACE - SKEW
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writing the expiry of approvals failed")
        await asyncio.sleep(EVERY_SECONDS)
