"""Decisions, their reasons and tags, and the outbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import UtcDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.String(8), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("category", sa.String(64), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("stakes", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("recorded_by", sa.String(128), nullable=False),
        sa.Column("context", sa.Text(), nullable=True),
        sa.Column("mental_state", sa.String(16), nullable=True),
        sa.Column("review_in", sa.String(16), nullable=True),
        sa.Column("review_by", UtcDateTime(), nullable=True),
        sa.Column("kpi_indicators", sa.JSON(), nullable=True),
        sa.Column("pre_query_run", sa.Boolean(), nullable=True),
        sa.Column("pre_similar_found", sa.Integer(), nullable=True),
        sa.Column("pre_guardrails_checked", sa.Boolean(), nullable=True),
        sa.Column("pre_guardrails_passed", sa.Boolean(), nullable=True),
        sa.Column("project", sa.String(256), nullable=True),
        sa.Column("feature", sa.String(256), nullable=True),
        sa.Column("pr", sa.Integer(), nullable=True),
        sa.Column("file", sa.Text(), nullable=True),
        sa.Column("line", sa.Integer(), nullable=True),
        sa.Column("commit", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("reviewed_at", UtcDateTime(), nullable=True),
        sa.Column("reviewed_by", sa.String(128), nullable=True),
        sa.Column("actual_result", sa.Text(), nullable=True),
        sa.Column("lessons", sa.Text(), nullable=True),
        sa.Column("review_notes", sa.Text(), nullable=True),
        sa.Column("affected_kpis", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
    )
    for column in (
        "category",
        "stakes",
        "status",
        "created_at",
        "recorded_by",
        "project",
        "outcome",
    ):
        op.create_index(op.f(f"ix_decisions_{column}"), "decisions", [column])

    op.create_table(
        "decision_reasons",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("strength", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            ondelete="CASCADE",
            name=op.f("fk_decision_reasons_decision_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decision_reasons")),
    )
    op.create_index(op.f("ix_decision_reasons_decision_id"), "decision_reasons", ["decision_id"])

    op.create_table(
        "decision_tags",
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("tag", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            ondelete="CASCADE",
            name=op.f("fk_decision_tags_decision_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("decision_id", "tag", name=op.f("pk_decision_tags")),
    )
    op.create_index("ix_decision_tags_tag", "decision_tags", ["tag"])

    op.create_table(
        "outbox_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("available_at", UtcDateTime(), nullable=False),
        sa.Column("processed_at", UtcDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_events")),
    )
    op.create_index(op.f("ix_outbox_events_decision_id"), "outbox_events", ["decision_id"])
    op.create_index(
        "ix_outbox_events_status_available", "outbox_events", ["status", "available_at"]
    )


def downgrade() -> None:
    op.drop_table("outbox_events")
    op.drop_table("decision_tags")
    op.drop_table("decision_reasons")
    op.drop_table("decisions")
