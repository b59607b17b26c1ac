"""Every statement on the webhook tables: the fan-out of an event to its subscribers (in the
caller's transaction), the deliverer's leases and results, the review.due scan, and the
operators' commands and counts.

Each function takes the session of a transaction its caller opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, Text, bindparam, cast, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import Insert

from app.db.base import UtcDateTime, table_of
from app.db.decisions import Decision
from app.db.outbox import updated
from app.db.webhooks import WebhookDelivery, WebhookSubscription

from .events import REVIEW_DUE, Message

PENDING, DONE, DEAD = "pending", "done", "dead"

_S = table_of(WebhookSubscription)
_D = table_of(WebhookDelivery)
_DELIVERY_COLUMNS = (
    "workspace",
    "subscription_id",
    "event",
    "message_id",
    "body",
    "status",
    "attempts",
    "created_at",
    "available_at",
)


def _insert_ignoring_repeats(dialect: str) -> Insert:
    """An INSERT into webhook_deliveries that skips a (subscription, message id) already
    there: the same event enqueued twice is delivered once."""
    if dialect == "postgresql":
        return postgresql.insert(_D).on_conflict_do_nothing()
    return sqlite.insert(_D).on_conflict_do_nothing()


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def _wants(event: str) -> Any:
    """The subscription asks for ``event``: its JSON list holds the quoted name (event names
    have no character JSON escapes)."""
    return cast(_S.c.events, Text).like(f'%"{event}"%')


# ---- the fan-out ----------------------------------------------------------------------------


def _fan_out_statement(dialect: str) -> Insert:
    """INSERT … SELECT of one message for each active subscription of its workspace that asks
    for its event. Built once per dialect (``_FAN_OUT``), its values bound at each run: a
    statement built per call cost more than running it."""
    chosen = select(
        _S.c.workspace,
        _S.c.id,
        bindparam("event", type_=String()),
        bindparam("message_id", type_=String()),
        bindparam("body", type_=Text()),
        literal(PENDING),
        literal(0),
        bindparam("at", type_=UtcDateTime()),
        bindparam("at", type_=UtcDateTime()),
    ).where(
        _S.c.workspace == bindparam("workspace", type_=String()),
        _S.c.removed_at.is_(None),
        cast(_S.c.events, Text).like(bindparam("pattern", type_=String())),
    )
    return _insert_ignoring_repeats(dialect).from_select(_DELIVERY_COLUMNS, chosen)


_FAN_OUT = {dialect: _fan_out_statement(dialect) for dialect in ("sqlite", "postgresql")}


async def fan_out(session: AsyncSession, m: Message) -> None:
    """One statement: a delivery of ``m`` for each active subscription of its workspace that
    asks for its event (nothing when it has none). The JSON list of the subscription's events
    holds the quoted name (event names have no character JSON escapes)."""
    await session.execute(
        _FAN_OUT[_dialect(session)],
        {
            "event": m.event,
            "message_id": m.message_id,
            "body": m.body,
            "at": m.at,
            "workspace": m.workspace,
            "pattern": f'%"{m.event}"%',
        },
    )


@dataclass(frozen=True)
class Subscriber:
    id: str
    workspace: str
    events: tuple[str, ...]
    created_at: datetime


_SUBSCRIBERS = select(_S.c.id, _S.c.workspace, _S.c.events, _S.c.created_at).where(
    _S.c.workspace.in_(bindparam("workspaces", expanding=True)), _S.c.removed_at.is_(None)
)


async def subscribers(session: AsyncSession, workspaces: Sequence[str]) -> list[Subscriber]:
    """The active subscriptions of ``workspaces`` (one statement, built once)."""
    rows = await session.execute(_SUBSCRIBERS, {"workspaces": list(workspaces)})
    return [Subscriber(r.id, r.workspace, tuple(r.events), r.created_at) for r in rows]


async def add_deliveries(
    session: AsyncSession, rows: Sequence[tuple[str, Message]], *, due: datetime | None = None
) -> None:
    """Deliveries of each (subscription id, message), one statement; repeats skipped."""
    if not rows:
        return
    values = [
        {
            "workspace": m.workspace,
            "subscription_id": sid,
            "event": m.event,
            "message_id": m.message_id,
            "body": m.body,
            "status": PENDING,
            "attempts": 0,
            "created_at": m.at,
            "available_at": due or m.at,
        }
        for sid, m in rows
    ]
    await session.execute(_insert_ignoring_repeats(_dialect(session)), values)


# ---- review.due -----------------------------------------------------------------------------


async def reviews_due(
    session: AsyncSession, subscriber: Subscriber, now: datetime, limit: int
) -> Sequence[Any]:
    """Decisions of the subscriber's workspace whose review was due by ``now`` (and not
    before it subscribed), unreviewed, with no review.due message for it yet."""
    sent = (
        select(_D.c.id)
        .where(
            _D.c.subscription_id == subscriber.id,
            _D.c.message_id == literal("msg_review_due_") + Decision.id,
        )
        .exists()
    )
    return (
        await session.execute(
            select(
                Decision.id,
                Decision.recorded_by,
                Decision.summary,
                Decision.category,
                Decision.confidence,
                Decision.stakes,
                Decision.created_at,
                Decision.review_by,
            )
            .where(
                Decision.workspace == subscriber.workspace,
                Decision.review_by <= now,
                Decision.review_by >= subscriber.created_at,
                Decision.reviewed_at.is_(None),
                ~sent,
            )
            .order_by(Decision.review_by, Decision.id)
            .limit(limit)
        )
    ).all()


async def review_due_subscribers(session: AsyncSession) -> list[Subscriber]:
    rows = await session.execute(
        select(_S.c.id, _S.c.workspace, _S.c.events, _S.c.created_at).where(
            _S.c.removed_at.is_(None), _wants(REVIEW_DUE)
        )
    )
    return [Subscriber(r.id, r.workspace, tuple(r.events), r.created_at) for r in rows]


# ---- the deliverer --------------------------------------------------------------------------


@dataclass(frozen=True)
class Leased:
    """A subscription whose messages this process delivers, until ``lease_until``."""

    id: str
    workspace: str
    url: str
    secret_sealed: str
    key_id: str
    lease_until: datetime


@dataclass(frozen=True)
class Head:
    """A subscription's oldest pending delivery: the only one tried."""

    id: int
    event: str
    message_id: str
    body: str
    attempts: int
    available_at: datetime


def _free(now: datetime) -> Any:
    return or_(_S.c.lease_until.is_(None), _S.c.lease_until <= now)


async def due_subscriptions(
    session: AsyncSession, now: datetime, limit: int, skip: Sequence[str]
) -> list[str]:
    """Active subscriptions, under no lease, whose oldest pending delivery is due."""
    heads = (
        select(_D.c.subscription_id, func.min(_D.c.id).label("head"))
        .where(_D.c.status == PENDING)
        .group_by(_D.c.subscription_id)
        .subquery()
    )
    query = (
        select(_S.c.id)
        .join(heads, heads.c.subscription_id == _S.c.id)
        .join(_D, _D.c.id == heads.c.head)
        .where(_D.c.available_at <= now, _S.c.removed_at.is_(None), _free(now))
        .order_by(heads.c.head)
        .limit(limit)
    )
    if skip:
        query = query.where(_S.c.id.not_in(list(skip)))
    return list((await session.scalars(query)).all())


async def lease(
    session: AsyncSession, ids: Sequence[str], owner: str, now: datetime, until: datetime
) -> list[Leased]:
    """Take the lease of each of ``ids`` still free (a conditional UPDATE: two processes
    never both get one); the subscriptions this process got."""
    rows = await session.execute(
        update(_S)
        .where(_S.c.id.in_(list(ids)), _S.c.removed_at.is_(None), _free(now))
        .values(leased_by=owner, lease_until=until)
        .returning(_S.c.id, _S.c.workspace, _S.c.url, _S.c.secret_sealed, _S.c.key_id)
    )
    return [Leased(r.id, r.workspace, r.url, r.secret_sealed, r.key_id, until) for r in rows]


async def renew(
    session: AsyncSession, subscription_id: str, owner: str, now: datetime, until: datetime
) -> bool:
    """Extend a lease this process still holds (unexpired); False when it lost it."""
    return (
        await updated(
            session,
            update(_S)
            .where(
                _S.c.id == subscription_id,
                _S.c.leased_by == owner,
                _S.c.lease_until > now,
                _S.c.removed_at.is_(None),
            )
            .values(lease_until=until),
        )
        == 1
    )


async def release(session: AsyncSession, subscription_id: str, owner: str) -> None:
    await session.execute(
        update(_S)
        .where(_S.c.id == subscription_id, _S.c.leased_by == owner)
        .values(leased_by=None, lease_until=None)
    )


async def head(session: AsyncSession, subscription_id: str) -> Head | None:
    row = (
        await session.execute(
            select(
                _D.c.id,
                _D.c.event,
                _D.c.message_id,
                _D.c.body,
                _D.c.attempts,
                _D.c.available_at,
            )
            .where(_D.c.status == PENDING, _D.c.subscription_id == subscription_id)
            .order_by(_D.c.id)
            .limit(1)
        )
    ).first()
    return None if row is None else Head(*row)


async def record(session: AsyncSession, delivery_id: int, **values: Any) -> None:
    """A pending delivery's outcome: its new status, attempts, backoff, last answer."""
    await session.execute(
        update(_D).where(_D.c.id == delivery_id, _D.c.status == PENDING).values(**values)
    )


# ---- the operators' ---------------------------------------------------------------------------


def add_subscription(session: AsyncSession, row: WebhookSubscription) -> None:
    session.add(row)


async def list_subscriptions(
    session: AsyncSession, workspace: str | None
) -> Sequence[WebhookSubscription]:
    query = select(WebhookSubscription).order_by(
        WebhookSubscription.created_at, WebhookSubscription.id
    )
    if workspace is not None:
        query = query.where(WebhookSubscription.workspace == workspace)
    return (await session.scalars(query)).all()


async def get_subscription(session: AsyncSession, sid: str) -> WebhookSubscription | None:
    return await session.get(WebhookSubscription, sid)


async def remove_subscription(session: AsyncSession, sid: str, now: datetime) -> int:
    return await updated(
        session,
        update(_S).where(_S.c.id == sid, _S.c.removed_at.is_(None)).values(removed_at=now),
    )


def _active_deliveries() -> Any:
    return _D.c.subscription_id.in_(select(_S.c.id).where(_S.c.removed_at.is_(None)))


async def counts_by_status(session: AsyncSession) -> dict[str, int]:
    """Deliveries of active subscriptions by status (pending and dead only)."""
    rows = await session.execute(
        select(_D.c.status, func.count())
        .where(_D.c.status.in_([PENDING, DEAD]), _active_deliveries())
        .group_by(_D.c.status)
    )
    return {status: int(n) for status, n in rows.all()}


async def per_subscription(session: AsyncSession) -> Sequence[Any]:
    """For each subscription with pending or dead deliveries: (id, workspace, url, removed,
    status, count)."""
    return (
        await session.execute(
            select(
                _S.c.id,
                _S.c.workspace,
                _S.c.url,
                _S.c.removed_at,
                _D.c.status,
                func.count(),
            )
            .join(_D, _D.c.subscription_id == _S.c.id)
            .where(_D.c.status.in_([PENDING, DEAD]))
            .group_by(_S.c.id, _S.c.workspace, _S.c.url, _S.c.removed_at, _D.c.status)
            .order_by(_S.c.id)
        )
    ).all()


async def troubled(session: AsyncSession, limit: int) -> Sequence[Any]:
    """Deliveries of active subscriptions that are dead, or pending after a failure (the
    head that holds its subscription's queue up): dead ones first, then by id."""
    return (
        await session.execute(
            select(
                _D.c.id,
                _D.c.subscription_id,
                _D.c.event,
                _D.c.message_id,
                _D.c.status,
                _D.c.attempts,
                _D.c.available_at,
                _D.c.last_status,
                _D.c.last_error,
            )
            .where(
                _active_deliveries(),
                or_(_D.c.status == DEAD, (_D.c.status == PENDING) & _D.c.last_error.is_not(None)),
            )
            .order_by((_D.c.status == DEAD).desc(), _D.c.id)
            .limit(limit)
        )
    ).all()


async def requeue_dead(session: AsyncSession, now: datetime) -> int:
    """Every dead delivery of an active subscription pending again, due now."""
    return await updated(
        session,
        update(_D)
        .where(_D.c.status == DEAD, _active_deliveries())
        .values(status=PENDING, attempts=0, available_at=now),
    )
