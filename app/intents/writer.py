"""The audit rows of an announcement, written in batches.

An announcement writes its guardrail evaluation, the approval it asked for (if it escalated),
its ``intents`` row, the decisions it was shown (``intent_matches``) and their audit chain
entries. ``write_rows`` writes those of one or more announcements in a transaction: one
INSERT per table for all of them, and a savepoint for each that carries a correlation id of
the caller's (a retry may have taken it, or asked for its approval).
``IntentWriter`` commits the announcements that queued while the previous transaction was
written in one transaction (app.batches: why, and what a lone call costs), on either database.

Each call keeps its own outcome: when a batch's transaction fails, each of its announcements
is written again alone. The rows carry ids drawn before the write, so a batch that failed after
the database committed it fails its calls on those ids, and nothing is written twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.approvals import service as approvals
from app.audit.canonical import Covered
from app.audit.chain import append
from app.batches import Batcher, each_alone
from app.db.engine import Database
from app.guardrails.service import Staged, store

from . import repository


@dataclass
class Announcement:
    """The rows of one announcement, built (and digested) but not written."""

    evaluation: Staged
    row: dict[str, Any]  # the intents row, by column
    matches: list[dict[str, Any]]  # its intent_matches rows
    entry: Covered  # the intents row's audit chain entry
    callers_correlation: bool  # the correlation id is the caller's: a retry may hold it
    approval: approvals.Requested | None = None  # the approval an escalation asked for


async def write_rows(session: AsyncSession, announcements: Sequence[Announcement]) -> list[bool]:
    """Write ``announcements`` in ``session``'s transaction. Per announcement, True when its
    intent row (and the approval it asked for) was written, False when its correlation id
    was already taken by a successful announcement of the same agent, or its approval by an
    escalated one (committed before, or earlier in the same group): its evaluation is written
    all the same, and the caller answers as the stored one did."""
    # a correlation id of the server's making is fresh: no retry can race for it
    fresh = [a for a in announcements if not a.callers_correlation]
    await store(
        session,
        [a.evaluation for a in announcements],
        [a.approval for a in fresh if a.approval is not None],
    )
    written = [not a.callers_correlation for a in announcements]
    asked: list[approvals.Requested] = []  # approvals of caller's correlation ids written
    if fresh:
        await repository.insert_intents(session, [a.row for a in fresh])
    for i, announcement in enumerate(announcements):
        if announcement.callers_correlation:
            written[i] = await repository.insert_intent_unless_taken(
                session,
                announcement.row,
                None if announcement.approval is None else announcement.approval.row,
            )
            if written[i] and announcement.approval is not None:
                append(session, announcement.approval.entry)
                asked.append(announcement.approval)
    matches = [m for a, ok in zip(announcements, written, strict=True) if ok for m in a.matches]
    if matches:
        await repository.insert_matches(session, matches)
    append(session, *(a.entry for a, ok in zip(announcements, written, strict=True) if ok))
    await approvals.notify_requested(session, asked)
    return written


class IntentWriter:
    """Batched commits of announcements (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._batches: Batcher[Announcement, bool] = Batcher(
            "announcements", self._commit, recover=each_alone(self._commit_alone)
        )

    async def write(self, announcement: Announcement) -> bool:
        """Write one announcement's rows; what ``write_rows`` says of it once committed.
        Raises what its transaction raised. Cancelling the caller does not cancel the write:
        an announcement that was evaluated is recorded."""
        return await self._batches.submit(announcement)

    async def drain(self) -> None:
        """Wait until everything queued now is written (shutdown, tests)."""
        await self._batches.drain()

    async def _commit(self, announcements: list[Announcement]) -> list[bool]:
        async with self.db.transaction(write=True) as session:
            return await write_rows(session, announcements)

    async def _commit_alone(self, announcement: Announcement) -> bool:
        (written,) = await self._commit([announcement])
        return written
