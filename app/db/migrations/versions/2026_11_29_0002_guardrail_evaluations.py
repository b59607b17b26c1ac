"""Stored guardrail evaluations and their per-rule results (append-only).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("guardrail_evaluations", "guardrail_rule_results")


def upgrade() -> None:
    op.create_table(
        "guardrail_evaluations",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("evaluated_at", UtcDateTime(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("category", sa.String(64), nullable=True),
        sa.Column("stakes", sa.String(16), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("project", sa.String(256), nullable=True),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.Column("evaluated", sa.Integer(), nullable=False),
        sa.Column("violations", sa.Integer(), nullable=False),
        sa.Column("warnings", sa.Integer(), nullable=False),
        sa.Column("rule_set_version", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_guardrail_evaluations")),
    )
    op.create_index(op.f("ix_guardrail_evaluations_agent"), "guardrail_evaluations", ["agent"])
    op.create_index(
        op.f("ix_guardrail_evaluations_evaluated_at"), "guardrail_evaluations", ["evaluated_at"]
    )
    op.create_table(
        "guardrail_rule_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("evaluation_id", sa.String(36), nullable=False),
        sa.Column("guardrail_id", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(8), nullable=False),
        sa.Column("fired", sa.Boolean(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["evaluation_id"],
            ["guardrail_evaluations.id"],
            name=op.f("fk_guardrail_rule_results_evaluation_id_guardrail_evaluations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_guardrail_rule_results")),
    )
    op.create_index(
        op.f("ix_guardrail_rule_results_evaluation_id"),
        "guardrail_rule_results",
        ["evaluation_id"],
    )
    op.create_index(
        op.f("ix_guardrail_rule_results_guardrail_id"),
        "guardrail_rule_results",
        ["guardrail_id"],
    )
    dialect = op.get_bind().dialect.name
    for table in TABLES:
        for statement in triggers.install(dialect, table):
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in TABLES:
        for statement in triggers.remove(dialect, table):
            op.execute(statement)
    op.drop_table("guardrail_rule_results")
    op.drop_table("guardrail_evaluations")
