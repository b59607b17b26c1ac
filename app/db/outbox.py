"""The outbox: work that must reach the YAML tree and the vector index after a commit."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import CursorResult, Index, Integer, String, Text, Update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class EventKind(StrEnum):
    """What an event does (``outbox_events.kind``; app.outbox.handlers)."""

    EXPORT = "export"  # write the decision's YAML file
    INDEX = "index"  # upsert its vector index entry


class Status(StrEnum):
    """Where an event is (``outbox_events.status``)."""

    PENDING = "pending"  # to be done: due at ``available_at`` (a lease, or a backoff)
    DONE = "done"
    DEAD = "dead"  # never retried by itself: ``cstp outbox retry`` re-queues it


class OutboxEvent(Base):
    __tablename__ = "outbox_events"
    __table_args__ = (Index("ix_outbox_events_status_available", "status", "available_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workspace: Mapped[str] = workspace_column()
    # An EventKind's value (a row may hold one this server does not know: dead at once).
    kind: Mapped[str] = mapped_column(String(16))
    decision_id: Mapped[str] = mapped_column(String(8), index=True)
    status: Mapped[str] = mapped_column(String(8))  # a Status's value
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Not before this time may a relay take the event: a lease while one relay works on it,
    # or the backoff after a failure.
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    processed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    # The kind of the last failure (app.outbox.failures.FailureKind's value): "transient" (a
    # dependency was unreachable: retried until it works), "permanent" (can never succeed as
    # it is: dead at once) or "unknown"; None before any failure, and while a relay holds the
    # event's lease.
    failure_kind: Mapped[str | None] = mapped_column(String(16))
    # Failures of the unknown kind: the event is dead when they reach CSTP_OUTBOX_MAX_ATTEMPTS.
    unknown_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


async def updated(session: AsyncSession, statement: Update) -> int:
    """Run an UPDATE; the number of rows it matched."""
    # An UPDATE's result is a CursorResult, which SQLAlchemy's annotations do not say.
    result = cast("CursorResult[Any]", await session.execute(statement))
    return int(result.rowcount or 0)
