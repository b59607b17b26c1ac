"""Read-only views of the outbox for operators (``cstp outbox``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db.outbox import OutboxEvent
from app.runtime import iso


async def describe(services: Any, limit: int = 50) -> list[str]:
    counts = await services.relay.counts()
    lines = [f"pending: {counts['pending']}  dead: {counts['dead']}  done: {counts['done']}"]
    async with services.db.transaction(write=False) as session:
        rows = await session.scalars(
            select(OutboxEvent)
            .where(OutboxEvent.status.in_(["pending", "dead"]))
            .order_by(OutboxEvent.id)
            .limit(limit)
        )
        for e in rows:
            lines.append(
                f"#{e.id} {e.status:<7} {e.kind:<6} decision {e.decision_id} "
                f"attempts {e.attempts} next {iso(e.available_at)}"
                + (f" error: {e.last_error}" if e.last_error else "")
            )
    return lines
