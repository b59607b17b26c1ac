"""Every statement the outbox runs on ``outbox_events``: the relay's claims, leases and
results (app.outbox.loop, app.outbox.relay) and the operators' queries (app.outbox.admin).

Each function takes the session of a transaction its caller opened: the relay and the admin
commands decide what runs together, this module only what runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ScalarResult, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.outbox import OutboxEvent, Status, updated

from .events import Event, Failed
from .failures import FailureKind


def add_events(session: AsyncSession, events: list[OutboxEvent]) -> None:
    """Add new events to the session's transaction (written at its flush)."""
    session.add_all(events)


async def renew_lease(
    session: AsyncSession, event_id: int, held_until: datetime, until: datetime
) -> int:
    """Move the lease of a pending event that still ends at ``held_until`` (no relay has
    claimed it since) to ``until``; 1 when renewed, else 0."""
    return await updated(
        session,
        update(OutboxEvent)
        .where(
            OutboxEvent.id == event_id,
            OutboxEvent.status == Status.PENDING,
            OutboxEvent.available_at == held_until,
        )
        .values(available_at=until),
    )


async def make_waiting_due(session: AsyncSession, kinds: Sequence[str], now: datetime) -> int:
    """Make pending events of ``kinds`` at rest after a transient failure due ``now``."""
    return await updated(
        session,
        update(OutboxEvent)
        .where(
            OutboxEvent.status == Status.PENDING,
            OutboxEvent.kind.in_(kinds),
            OutboxEvent.failure_kind == FailureKind.TRANSIENT,
            OutboxEvent.available_at > now,
        )
        .values(available_at=now),
    )


async def claim_due(
    session: AsyncSession, limit: int, horizon: datetime, leased_until: datetime
) -> list[Event]:
    """Up to ``limit`` pending events due by ``horizon``, oldest first (locked, skipping
    locked ones, on Postgres), leased until ``leased_until``."""
    query = (
        select(
            OutboxEvent.id,
            OutboxEvent.kind,
            OutboxEvent.decision_id,
            OutboxEvent.attempts,
            OutboxEvent.unknown_failures,
        )
        .where(OutboxEvent.status == Status.PENDING, OutboxEvent.available_at <= horizon)
        .order_by(OutboxEvent.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    rows = [Event.of(*r) for r in (await session.execute(query)).all()]
    if rows:
        await session.execute(
            update(OutboxEvent)
            .where(OutboxEvent.id.in_([r.id for r in rows]))
            .values(available_at=leased_until, failure_kind=None)
        )
    return rows


async def mark_done(session: AsyncSession, event_ids: list[int], now: datetime) -> None:
    """The pending events ``event_ids`` worked."""
    await session.execute(
        update(OutboxEvent)
        .where(OutboxEvent.id.in_(event_ids), OutboxEvent.status == Status.PENDING)
        .values(
            status=Status.DONE,
            processed_at=now,
            last_error=None,
            failure_kind=None,
        )
    )


async def mark_failed(session: AsyncSession, failed: Failed) -> None:
    """A pending event failed: its next state (pending again, or dead) and why."""
    event, failure, after = failed
    await session.execute(
        update(OutboxEvent)
        .where(OutboxEvent.id == event.id, OutboxEvent.status == Status.PENDING)
        .values(
            attempts=after.attempts,
            unknown_failures=after.unknown_failures,
            last_error=failure.error[:2000],
            failure_kind=failure.kind,
            status=after.status,
            available_at=after.available_at,
        )
    )


async def count_by_status(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(
        select(OutboxEvent.status, func.count()).group_by(OutboxEvent.status)
    )
    return dict(rows.all())


async def count_by_kind_and_status(session: AsyncSession) -> dict[tuple[str, str], int]:
    rows = await session.execute(
        select(OutboxEvent.kind, OutboxEvent.status, func.count()).group_by(
            OutboxEvent.kind, OutboxEvent.status
        )
    )
    return {(kind, status): int(n) for kind, status, n in rows.all()}


async def states_of(session: AsyncSession, decision_ids: Sequence[str]) -> Sequence[Any]:
    """(status, attempts, available_at) of every event of ``decision_ids``."""
    result = await session.execute(
        select(OutboxEvent.status, OutboxEvent.attempts, OutboxEvent.available_at).where(
            OutboxEvent.decision_id.in_(decision_ids)
        )
    )
    return result.all()


async def requeue_dead(session: AsyncSession, now: datetime) -> int:
    """Make every dead event pending again, due ``now``, its counters reset."""
    return await updated(
        session,
        update(OutboxEvent)
        .where(OutboxEvent.status == Status.DEAD)
        .values(
            status=Status.PENDING,
            attempts=0,
            unknown_failures=0,
            failure_kind=None,
            available_at=now,
        ),
    )


async def pending_and_dead(session: AsyncSession, limit: int) -> ScalarResult[OutboxEvent]:
    """Up to ``limit`` pending and dead events, dead ones first, then by id."""
    return await session.scalars(
        select(OutboxEvent)
        .where(OutboxEvent.status.in_([Status.PENDING, Status.DEAD]))
        # dead ones first: they are what needs an operator
        .order_by((OutboxEvent.status == Status.DEAD).desc(), OutboxEvent.id)
        .limit(limit)
    )
