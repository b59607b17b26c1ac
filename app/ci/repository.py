"""Every statement on ``ci_secrets`` and ``ci_deliveries``. Each function takes the session
of a transaction its caller opened."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.ci import CiDelivery, CiSecret

_SECRETS = table_of(CiSecret)
_DELIVERIES = table_of(CiDelivery)


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


async def secret_of(session: AsyncSession, workspace: str) -> CiSecret | None:
    return await session.get(CiSecret, workspace)


async def put_secret(session: AsyncSession, row: CiSecret) -> None:
    """Store ``row`` as its workspace's secret, replacing the one before (one statement, so
    two concurrent rotations leave one of them, whole)."""
    values = {c.name: getattr(row, c.name) for c in _SECRETS.columns}
    changed = {k: v for k, v in values.items() if k != "workspace"}
    if _dialect(session) == "postgresql":
        pg = postgresql.insert(_SECRETS).values(values)
        await session.execute(pg.on_conflict_do_update(index_elements=["workspace"], set_=changed))
    else:
        lite = sqlite.insert(_SECRETS).values(values)
        await session.execute(
            lite.on_conflict_do_update(index_elements=["workspace"], set_=changed)
        )


async def record_delivery(session: AsyncSession, row: CiDelivery) -> bool:
    """INSERT the report's id; False when the workspace has it already (a replay), then
    nothing is written. On Postgres an INSERT of an id another transaction has written and
    not yet committed waits for it: False once that one commits, True if it rolls back."""
    values = {c.name: getattr(row, c.name) for c in _DELIVERIES.columns}
    if _dialect(session) == "postgresql":
        pg = postgresql.insert(_DELIVERIES).values(values).on_conflict_do_nothing()
        inserted = await session.execute(pg.returning(_DELIVERIES.c.message_id))
    else:
        lite = sqlite.insert(_DELIVERIES).values(values).on_conflict_do_nothing()
        inserted = await session.execute(lite.returning(_DELIVERIES.c.message_id))
    return inserted.first() is not None


async def set_reviewed(session: AsyncSession, workspace: str, message_id: str, n: int) -> None:
    """Note how many decisions the report ``message_id`` reviewed."""
    await session.execute(
        update(_DELIVERIES)
        .where(_DELIVERIES.c.workspace == workspace, _DELIVERIES.c.message_id == message_id)
        .values(reviewed=n)
    )


async def prune_deliveries(session: AsyncSession, signed_before: datetime) -> None:
    """Forget the ids of reports signed before ``signed_before`` (every workspace's): their
    timestamps are refused by now, so a replay of one fails without its id."""
    await session.execute(delete(_DELIVERIES).where(_DELIVERIES.c.signed_at < signed_before))
