"""The audit rows of an announcement, and group commit for them on SQLite.

An announcement writes its guardrail evaluation, its ``intents`` row, the decisions it was
shown (``intent_matches``) and their audit chain entries. ``write_rows`` writes those of one
or more announcements in a transaction: one INSERT per table for all of them, and a savepoint
for each that carries a correlation id of the caller's (a retry may have taken it).

On SQLite every write transaction holds the database's only write lock from its first
statement to its COMMIT. Written in the call's own transaction, an announcement held it
across several hand-offs to the driver's thread, each waiting for the event loop's next turn
(which the other calls' searches keep busy): with several clients announcing, throughput was
the lock's. ``IntentWriter`` writes the announcements that queued while the previous group
was written in one transaction, which takes the lock once for all of them. A lone call is a
group of one. Postgres has
no such lock; there each announcement writes in its own call's transaction.

Each call keeps its own outcome: when a group's transaction fails, each of its announcements
is written again alone, so one call's failure never fails another's. The rows carry ids drawn
before the write; a group that failed after the database committed it (which a local SQLite
file does not do) then fails its calls on those ids, and nothing is written twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.canonical import Covered
from app.audit.chain import append
from app.db.engine import Database
from app.errors import STORAGE_ERROR, CstpError
from app.guardrails.service import Staged, store

from . import repository

log = logging.getLogger("cstp.intents")

MAX_GROUP = 64  # announcements written in one transaction at most


@dataclass
class Announcement:
    """The rows of one announcement, built (and digested) but not written."""

    evaluation: Staged
    row: dict[str, Any]  # the intents row, by column
    matches: list[dict[str, Any]]  # its intent_matches rows
    entry: Covered  # the intents row's audit chain entry
    callers_correlation: bool  # the correlation id is the caller's: a retry may hold it


async def write_rows(session: AsyncSession, announcements: Sequence[Announcement]) -> list[bool]:
    """Write ``announcements`` in ``session``'s transaction. Per announcement, True when its
    intent row was written, False when its correlation id was already taken by a successful
    announcement of the same agent (committed before, or earlier in the same group): its
    evaluation is written all the same, and the caller answers as the stored one did."""
    await store(session, [a.evaluation for a in announcements])
    written = [not a.callers_correlation for a in announcements]
    fresh = [a.row for a in announcements if not a.callers_correlation]
    if fresh:  # a correlation id of the server's making is fresh: no retry can race for it
        await repository.insert_intents(session, fresh)
    for i, announcement in enumerate(announcements):
        if announcement.callers_correlation:
            written[i] = await repository.insert_intent_unless_taken(session, announcement.row)
    matches = [m for a, ok in zip(announcements, written, strict=True) if ok for m in a.matches]
    if matches:
        await repository.insert_matches(session, matches)
    append(session, *(a.entry for a, ok in zip(announcements, written, strict=True) if ok))
    return written


@dataclass
class _Unit:
    announcement: Announcement
    future: asyncio.Future[bool] = field(repr=False)


class IntentWriter:
    """Group commit of announcements (SQLite; see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: deque[_Unit] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, announcement: Announcement) -> bool:
        """Write one announcement's rows; what ``write_rows`` says of it once committed.
        Raises what its transaction raised. Cancelling the caller does not cancel the write:
        an announcement that was evaluated is recorded."""
        loop = asyncio.get_running_loop()
        unit = _Unit(announcement, loop.create_future())
        self._queue.append(unit)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush_loop())
        return await asyncio.shield(unit.future)

    async def drain(self) -> None:
        """Wait until everything queued now is written (shutdown, tests)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.wait({self._flusher})  # a cancelled wait cancels nothing

    async def _flush_loop(self) -> None:
        while self._queue:
            group: list[_Unit] = []
            try:
                # One turn of the loop first: calls whose rows are ready join this group.
                await asyncio.sleep(0)
                group = [self._queue.popleft() for _ in range(min(MAX_GROUP, len(self._queue)))]
                outcomes = await self._commit(group)
            except asyncio.CancelledError:
                for unit in group:
                    _fail(unit, CstpError(STORAGE_ERROR, "Storage error: server shutting down"))
                raise
            except Exception as exc:
                if len(group) == 1:
                    _fail(group[0], exc)
                    continue
                log.info("a group of %d announcements failed; writing each alone", len(group))
                for unit in group:
                    try:
                        (outcome,) = await self._commit([unit])
                    except Exception as failure:  # that call's outcome
                        _fail(unit, failure)
                    else:
                        _done(unit, outcome)
            else:
                for unit, outcome in zip(group, outcomes, strict=True):
                    _done(unit, outcome)

    async def _commit(self, group: list[_Unit]) -> list[bool]:
        async with self.db.transaction(write=True) as session:
            return await write_rows(session, [u.announcement for u in group])


def _done(unit: _Unit, outcome: bool) -> None:
    if not unit.future.done():
        unit.future.set_result(outcome)


def _fail(unit: _Unit, exc: BaseException) -> None:
    if not unit.future.done():
        unit.future.set_exception(exc)
