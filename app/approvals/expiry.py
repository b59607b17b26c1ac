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
from datetime import datetime

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


async def expire_overdue(db: Database, now: Callable[[], datetime]) -> int:
    """Write the expiry of up to ``BATCH`` overdue approvals; how many were written."""
    moment = now()
    overdue = await db.read(lambda conn: repository.overdue(conn, now=moment, limit=BATCH))
    if not overdue:
        return 0
    written = 0
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
            await enqueue_many(session, [decided_message(approval, row)])
            written += 1
    return written


async def loop(db: Database, now: Callable[[], datetime]) -> None:
    """Every ``EVERY_SECONDS``, write the expiries that are due."""
    while True:
        try:
            written = await expire_overdue(db, now)
            if written:
                log.info("approvals: %d expired", written)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writing the expiry of approvals failed")
        await asyncio.sleep(EVERY_SECONDS)
