"""Review history of decisions (append-only).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decision_reviews",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("actual_result", sa.Text(), nullable=True),
        sa.Column("lessons", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("affected_kpis", sa.JSON(), nullable=True),
        sa.Column("reviewed_by", sa.String(128), nullable=False),
        sa.Column("reviewed_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_decision_reviews_decision_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decision_reviews")),
    )
    for column in ("decision_id", "reviewed_by", "reviewed_at"):
        op.create_index(op.f(f"ix_decision_reviews_{column}"), "decision_reviews", [column])
    for statement in triggers.install(op.get_bind().dialect.name, "decision_reviews"):
        op.execute(statement)


def downgrade() -> None:
    for statement in triggers.remove(op.get_bind().dialect.name, "decision_reviews"):
        op.execute(statement)
    op.drop_table("decision_reviews")
