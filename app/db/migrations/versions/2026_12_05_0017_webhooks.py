"""Webhooks (SPEC.md, section 8): ``webhook_subscriptions`` and ``webhook_deliveries``.

- ``webhook_subscriptions``: a subscription's id (``whk_…``), workspace, URL, events, its
  signing secret sealed with AES-256-GCM (the key is kept outside the database; ``key_id`` is
  its fingerprint), when and by whom it was added, when it was removed, and the lease of the
  server process delivering its messages.
- ``webhook_deliveries``: one row per subscription and event: the message id (unique per
  subscription), the body as sent, status, attempts, backoff, the receiver's last answer.

Neither is an audit table: both change as messages are delivered. The downgrade drops them,
undelivered messages with them.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import UtcDateTime

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUBSCRIPTIONS = "webhook_subscriptions"
DELIVERIES = "webhook_deliveries"


def upgrade() -> None:
    op.create_table(
        SUBSCRIPTIONS,
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("removed_at", UtcDateTime(), nullable=True),
        sa.Column("leased_by", sa.String(64), nullable=True),
        sa.Column("lease_until", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_subscriptions")),
    )
    op.create_index("ix_webhook_subscriptions_workspace", SUBSCRIPTIONS, ["workspace"])
    op.create_table(
        DELIVERIES,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("subscription_id", sa.String(32), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("available_at", UtcDateTime(), nullable=False),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            [f"{SUBSCRIPTIONS}.id"],
            name=op.f("fk_webhook_deliveries_subscription_id_webhook_subscriptions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint(
            "subscription_id",
            "message_id",
            name=op.f("uq_webhook_deliveries_subscription_id_message_id"),
        ),
    )
    op.create_index(
        "ix_webhook_deliveries_status_subscription",
        DELIVERIES,
        ["status", "subscription_id", "id"],
    )


def downgrade() -> None:
    # Dropping a table drops its indexes and constraints with it.
    op.drop_table(DELIVERIES)
    op.drop_table(SUBSCRIPTIONS)
