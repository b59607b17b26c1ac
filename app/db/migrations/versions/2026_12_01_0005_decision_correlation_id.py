"""Decisions carry the correlationId of the intent they followed (the id the client chose),
filled in for decisions already linked to an intent.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("correlation_id", sa.String(128), nullable=True))
        batch.create_index(batch.f("ix_decisions_correlation_id"), ["correlation_id"])
    op.execute(
        "UPDATE decisions SET correlation_id = (SELECT intents.correlation_id FROM intents "
        "WHERE intents.id = decisions.intent_id) WHERE intent_id IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_index(batch.f("ix_decisions_correlation_id"))
        batch.drop_column("correlation_id")
