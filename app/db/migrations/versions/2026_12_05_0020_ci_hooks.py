"""Outcomes observed by CI (SPEC.md, section 9): ``ci_secrets``, ``ci_deliveries`` and an
index of decisions by pull request.

- ``ci_secrets``: a workspace's CI signing secret (``cstp webhooks ci-secret``), sealed with
  AES-256-GCM under the webhook key (never in the database; ``key_id`` is its fingerprint).
- ``ci_deliveries``: the ``webhook-id`` of each accepted CI report per workspace (the primary
  key, so a replay is refused even by another server process), its signed time (the pruning's
  range), when it came, the pull request, the status and how many decisions it reviewed.
- ``ix_decisions_workspace_pr``: a report reviews the decisions of its workspace with its
  ``pr``, in a write transaction: found by index, not by reading the workspace's decisions.

Neither table is an audit table: the reviews a report makes are ``decision_reviews`` rows,
chained like every review. The downgrade drops both (the secrets with them: set them again
after an upgrade) and the index.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import UtcDateTime

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SECRETS = "ci_secrets"
DELIVERIES = "ci_deliveries"


def upgrade() -> None:
    op.create_table(
        SECRETS,
        sa.Column("workspace", sa.String(63), nullable=False),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("workspace", name=op.f("pk_ci_secrets")),
    )
    op.create_table(
        DELIVERIES,
        sa.Column("workspace", sa.String(63), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("signed_at", UtcDateTime(), nullable=False),
        sa.Column("received_at", UtcDateTime(), nullable=False),
        sa.Column("pr", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("reviewed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("workspace", "message_id", name=op.f("pk_ci_deliveries")),
    )
    op.create_index("ix_ci_deliveries_signed_at", DELIVERIES, ["signed_at"])
    op.create_index("ix_decisions_workspace_pr", "decisions", ["workspace", "pr"])


def downgrade() -> None:
    op.drop_index("ix_decisions_workspace_pr", table_name="decisions")
    # Dropping a table drops its indexes and constraints with it.
    op.drop_table(DELIVERIES)
    op.drop_table(SECRETS)
