"""Read-only views of the outbox for operators (``cstp outbox``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db.outbox import OutboxEvent, Status
from app.runtime import iso

from .failures import FailureKind


def why(event: OutboxEvent) -> str:
    """Why an event is dead, or what a pending one is waiting for, in a few words."""
    error = event.last_error or "no error recorded"
    if event.status == Status.DEAD:
        if event.failure_kind == FailureKind.PERMANENT:
            return f"dead: can never succeed as it is: {error}"
        if event.failure_kind == FailureKind.UNKNOWN:
            return (
                f"dead: failed {event.unknown_failures} time(s) in an unforeseen way "
                f"(CSTP_OUTBOX_MAX_ATTEMPTS): {error}"
            )
        return f"dead: {error}"
    if event.failure_kind == FailureKind.TRANSIENT:
        return f"waiting for a dependency, retried until it works: {error}"
    if event.last_error:
        return f"retrying after: {error}"
    return ""


async def describe(services: Any, limit: int = 50) -> list[str]:
    counts = await services.relay.counts()
    lines = [f"pending: {counts['pending']}  dead: {counts['dead']}  done: {counts['done']}"]
    async with services.db.transaction(write=False) as session:
        rows = await session.scalars(
            select(OutboxEvent)
            .where(OutboxEvent.status.in_([Status.PENDING, Status.DEAD]))
            # dead ones first: they are what needs an operator
            .order_by((OutboxEvent.status == Status.DEAD).desc(), OutboxEvent.id)
            .limit(limit)
        )
        for e in rows:
            reason = why(e)
            lines.append(
                f"#{e.id} {e.status:<7} {e.kind:<6} decision {e.decision_id} "
                f"attempts {e.attempts} next {iso(e.available_at)}"
                + (f" {reason}" if reason else "")
            )
    if counts["dead"]:
        lines.append(
            "dead events are never retried by themselves: fix what the reason names (see "
            'docs/OPERATIONS.md, "Outbox"), then `cstp outbox retry` re-queues them'
        )
    return lines
