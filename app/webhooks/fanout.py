"""Enqueueing events: the rows a subscriber's messages are sent from, written in the
caller's transaction, so an event is delivered exactly when what it tells of is committed.

Nothing here waits for a receiver: the delivery loop (app.webhooks.delivery) sends them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from .events import Message, message
from .repository import add_deliveries, fan_out, subscribers


async def enqueue(
    session: AsyncSession,
    *,
    workspace: str,
    event: str,
    data: Mapping[str, Any],
    at: datetime,
    message_id: str | None = None,
) -> None:
    """Enqueue ``event`` (one of EVENTS) of ``workspace`` for each of its subscribers, in
    ``session``'s transaction: one INSERT … SELECT, which inserts nothing when the workspace
    has no subscriber for it. ``data`` becomes the body's ``data`` (datetimes as wire
    timestamps); ``at`` its ``timestamp``. ``message_id`` (the ``webhook-id``) None is a
    fresh one; the same id enqueued again for a subscription is delivered once. Raises
    UnknownEvent or ValueError (a bad message id) before any statement."""
    m = message(workspace=workspace, event=event, data=data, at=at, message_id=message_id)
    await fan_out(session, m)


async def enqueue_many(session: AsyncSession, messages: Sequence[Message]) -> None:
    """Enqueue several messages (app.webhooks.events.message) in ``session``'s transaction:
    one SELECT of their workspaces' subscribers, then, only when some want them, one INSERT
    for all their deliveries. For a batch of events (recordDecision's)."""
    if not messages:
        return
    workspaces = sorted({m.workspace for m in messages})
    found = await subscribers(session, workspaces)
    if not found:
        return
    rows = [
        (s.id, m)
        for m in messages
        for s in found
        if s.workspace == m.workspace and m.event in s.events
    ]
    await add_deliveries(session, rows)
