"""The outbox: work that must reach the YAML tree and the vector index after a commit."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime


class OutboxEvent(Base):
    __tablename__ = "outbox_events"
    __table_args__ = (Index("ix_outbox_events_status_available", "status", "available_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # "export" | "index"
    decision_id: Mapped[str] = mapped_column(String(8), index=True)
    status: Mapped[str] = mapped_column(String(8))  # "pending" | "done" | "dead"
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Not before this time may a relay take the event: a lease while one relay works on it,
    # or the backoff after a failure.
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    processed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    # The kind of the last failure (app.outbox.failures): "transient" (a dependency was
    # unreachable: retried until it works), "permanent" (can never succeed as it is: dead at
    # once) or "unknown"; None before any failure, and while a relay holds the event's lease.
    failure_kind: Mapped[str | None] = mapped_column(String(16))
    # Failures of the unknown kind: the event is dead when they reach CSTP_OUTBOX_MAX_ATTEMPTS.
    unknown_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
