"""Webhooks (SPEC.md, section 8): who is told of what, and each message on its way.

- ``webhook_subscriptions``: one row per ``cstp webhooks add``: the workspace whose events it
  gets, the URL they are posted to, the events it wants, and its signing secret sealed with
  AES-256-GCM under a key kept outside the database (app/webhooks/secrets.py; ``key_id``
  names that key without revealing it). ``removed_at`` is set by ``cstp webhooks remove``:
  the row stays, its messages are no longer sent. ``leased_by``/``lease_until``: the server
  process delivering its messages now (one at a time per subscription, app/webhooks/delivery.py).
- ``webhook_deliveries``: one row per subscription and event: the exact body sent (the
  signature is made over it at each attempt), the Standard Webhooks message id
  (``webhook-id``; unique per subscription, so an event enqueued twice is sent once), where
  it stands (``pending``, ``done``, ``dead``), its attempts and backoff, and the receiver's
  last answer.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class WebhookSubscription(Base):
    __tablename__ = "webhook_subscriptions"
    __table_args__ = (Index("ix_webhook_subscriptions_workspace", "workspace"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # whk_…, public
    workspace: Mapped[str] = workspace_column()
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)  # in app.webhooks.events.EVENTS order
    # base64 of the 12-byte nonce and the AES-GCM ciphertext of the secret's text
    secret_sealed: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str] = mapped_column(String(16))  # the sealing key's fingerprint
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    created_by: Mapped[str] = mapped_column(String(128))  # the account that ran the command
    removed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    leased_by: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("subscription_id", "message_id"),
        # A subscription's oldest pending delivery, and the heads of all subscriptions.
        Index("ix_webhook_deliveries_status_subscription", "status", "subscription_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workspace: Mapped[str] = workspace_column()
    subscription_id: Mapped[str] = mapped_column(ForeignKey("webhook_subscriptions.id"))
    event: Mapped[str] = mapped_column(String(32))
    message_id: Mapped[str] = mapped_column(String(128))  # the webhook-id header
    body: Mapped[str] = mapped_column(Text)  # {"type", "timestamp", "data"}, as sent
    status: Mapped[str] = mapped_column(String(8))  # pending | done | dead
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Not tried before this time: its backoff after a failed attempt.
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_status: Mapped[int | None] = mapped_column(Integer)  # the receiver's last HTTP status
    last_error: Mapped[str | None] = mapped_column(Text)
