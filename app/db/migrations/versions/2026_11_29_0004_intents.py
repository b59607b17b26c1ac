"""Announced intents and their matches (append-only); decisions link to their intent and to
the guardrail evaluation made when they were recorded.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("intents", "intent_matches")


def upgrade() -> None:
    op.create_table(
        "intents",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("received_at", UtcDateTime(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error_code", sa.Integer(), nullable=True),
        sa.Column("intent", sa.Text(), nullable=True),
        sa.Column("context", sa.Text(), nullable=True),
        sa.Column("category", sa.String(64), nullable=True),
        sa.Column("stakes", sa.String(16), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("claimed_agent", sa.JSON(), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=True),
        sa.Column("allowed", sa.Boolean(), nullable=True),
        sa.Column("evaluation_id", sa.String(36), nullable=True),
        sa.Column("similar_found", sa.Integer(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["evaluation_id"],
            ["guardrail_evaluations.id"],
            name=op.f("fk_intents_evaluation_id_guardrail_evaluations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intents")),
    )
    for column in ("agent", "received_at", "outcome", "evaluation_id"):
        op.create_index(op.f(f"ix_intents_{column}"), "intents", [column])
    op.create_index(
        "uq_intents_agent_correlation_ok",
        "intents",
        ["agent", "correlation_id"],
        unique=True,
        sqlite_where=sa.text("outcome = 'ok'"),
        postgresql_where=sa.text("outcome = 'ok'"),
    )
    op.create_table(
        "intent_matches",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("intent_id", sa.String(36), nullable=False),
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("distance", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.ForeignKeyConstraint(
            ["intent_id"],
            ["intents.id"],
            name=op.f("fk_intent_matches_intent_id_intents"),
        ),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_intent_matches_decision_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intent_matches")),
    )
    op.create_index(op.f("ix_intent_matches_intent_id"), "intent_matches", ["intent_id"])
    op.create_index(op.f("ix_intent_matches_decision_id"), "intent_matches", ["decision_id"])
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("intent_id", sa.String(36), nullable=True))
        batch.add_column(sa.Column("guardrail_evaluation_id", sa.String(36), nullable=True))
        batch.create_index(batch.f("ix_decisions_intent_id"), ["intent_id"])
        batch.create_foreign_key(
            batch.f("fk_decisions_intent_id_intents"), "intents", ["intent_id"], ["id"]
        )
        batch.create_foreign_key(
            batch.f("fk_decisions_guardrail_evaluation_id_guardrail_evaluations"),
            "guardrail_evaluations",
            ["guardrail_evaluation_id"],
            ["id"],
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
    with op.batch_alter_table("decisions") as batch:
        batch.drop_constraint(
            batch.f("fk_decisions_guardrail_evaluation_id_guardrail_evaluations"),
            type_="foreignkey",
        )
        batch.drop_constraint(batch.f("fk_decisions_intent_id_intents"), type_="foreignkey")
        batch.drop_index(batch.f("ix_decisions_intent_id"))
        batch.drop_column("guardrail_evaluation_id")
        batch.drop_column("intent_id")
    op.drop_table("intent_matches")
    op.drop_table("intents")
