"""Escalation and approvals (SPEC.md, section 8).

- ``guardrail_evaluations.escalations``: how many escalate rules fired (NULL before), and
  ``approval_id``: the approval an escalated evaluation asked for or answered with;
  ``guardrail_rule_results.would_escalate``: an escalate rule's "would have asked" (true only
  for a shadow one; NULL for the other actions and before). All nullable, so SQLite adds them
  in place.
- ``intents``: an index on (workspace, agent, correlation_id) of the escalated rows, for an
  escalated announcement's re-announcements.
- ``approvals`` (one row per request for a person's approval) and ``approval_decisions`` (at
  most one per approval: its key is the approval's id). Append-only like every audit table
  (UPDATE, DELETE and, on SQLite, REPLACE refused) and covered by the audit chain.
- PostgreSQL: both tables get the auditors' row-level security policy of revision 0012.

The downgrade refuses to run while an approval, or an evaluation with an escalate rule, is
stored: they are audit rows, covered by the chain, and revision 0015 has no place for them.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPROVALS = "approvals"
DECISIONS = "approval_decisions"
READER_FUNCTION = "cstp_reader_workspace"  # revision 0012
POLICY = "workspace_readers"


def _row_level_security() -> list[str]:
    # As revision 0012 writes it: evaluated once per statement, for the querying role.
    reader = f"(SELECT {READER_FUNCTION}(current_user))"
    statements = []
    for table in (APPROVALS, DECISIONS):
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY {POLICY} ON {table} FOR ALL "
            f"USING ({reader} IS NULL OR workspace = {reader}) "
            f"WITH CHECK ({reader} IS NULL)",
        ]
    return statements


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.add_column("guardrail_evaluations", sa.Column("escalations", sa.Integer(), nullable=True))
    op.add_column("guardrail_evaluations", sa.Column("approval_id", sa.String(36), nullable=True))
    # Both partial: the rows of calls that escalate nothing cost them nothing.
    op.create_index(
        "ix_guardrail_evaluations_approval_id",
        "guardrail_evaluations",
        ["approval_id"],
        sqlite_where=sa.text("approval_id IS NOT NULL"),
        postgresql_where=sa.text("approval_id IS NOT NULL"),
    )
    op.create_index(
        "ix_intents_workspace_agent_correlation_escalated",
        "intents",
        ["workspace", "agent", "correlation_id"],
        sqlite_where=sa.text("outcome = 'escalated'"),
        postgresql_where=sa.text("outcome = 'escalated'"),
    )
    op.add_column(
        "guardrail_rule_results", sa.Column("would_escalate", sa.Boolean(), nullable=True)
    )
    op.create_table(
        APPROVALS,
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("evaluation_id", sa.String(36), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=True),
        sa.Column("action", sa.JSON(), nullable=False),
        sa.Column("action_sha256", sa.String(64), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["evaluation_id"],
            ["guardrail_evaluations.id"],
            name=op.f("fk_approvals_evaluation_id_guardrail_evaluations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
    )
    op.create_index(op.f("ix_approvals_evaluation_id"), APPROVALS, ["evaluation_id"])
    op.create_index(op.f("ix_approvals_expires_at"), APPROVALS, ["expires_at"])
    op.create_index(
        "ix_approvals_workspace_created_at", APPROVALS, ["workspace", "created_at"], unique=False
    )
    op.create_index(
        "uq_approvals_workspace_requested_by_correlation",
        APPROVALS,
        ["workspace", "requested_by", "correlation_id"],
        unique=True,
        sqlite_where=sa.text("correlation_id IS NOT NULL"),
        postgresql_where=sa.text("correlation_id IS NOT NULL"),
    )
    op.create_table(
        DECISIONS,
        sa.Column("approval_id", sa.String(36), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("verdict", sa.String(8), nullable=False),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("decided_at", UtcDateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "verdict IN ('approved', 'denied', 'expired')",
            name=op.f("ck_approval_decisions_verdict"),
        ),
        sa.ForeignKeyConstraint(
            ["approval_id"],
            [f"{APPROVALS}.id"],
            name=op.f("fk_approval_decisions_approval_id_approvals"),
        ),
        sa.PrimaryKeyConstraint("approval_id", name=op.f("pk_approval_decisions")),
    )
    op.create_index(op.f("ix_approval_decisions_decided_at"), DECISIONS, ["decided_at"])
    statements = [
        *triggers.install(dialect, APPROVALS),
        *triggers.refuse_replace(
            dialect,
            APPROVALS,
            f"NEW.correlation_id IS NOT NULL AND EXISTS (SELECT 1 FROM {APPROVALS} WHERE "
            "workspace = NEW.workspace AND requested_by = NEW.requested_by "
            "AND correlation_id = NEW.correlation_id)",
        ),
        *triggers.install(dialect, DECISIONS),
        *triggers.refuse_replace(dialect, DECISIONS, key="approval_id"),
    ]
    if dialect == "postgresql":
        statements += _row_level_security()
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    bind = op.get_bind()
    stored = bind.execute(
        sa.text(
            f"SELECT (SELECT COUNT(*) FROM {APPROVALS}) "
            "+ (SELECT COUNT(*) FROM guardrail_evaluations WHERE escalations IS NOT NULL) "
            "+ (SELECT COUNT(*) FROM guardrail_rule_results WHERE would_escalate IS NOT NULL)"
        )
    ).scalar()
    if stored:
        raise RuntimeError(
            "cannot downgrade below revision 0016: approvals or evaluations of escalate rules "
            "are stored; they are audit rows, covered by the audit chain, and revision 0015 "
            "has no place for them"
        )
    # Dropping a table drops its triggers, policies and indexes with it.
    op.drop_table(DECISIONS)
    op.drop_table(APPROVALS)
    # In place on both databases (SQLite 3.35+ drops a column no index or trigger names),
    # so the evaluation tables keep their append-only triggers.
    op.drop_index("ix_intents_workspace_agent_correlation_escalated", table_name="intents")
    op.drop_index("ix_guardrail_evaluations_approval_id", table_name="guardrail_evaluations")
    op.drop_column("guardrail_rule_results", "would_escalate")
    op.drop_column("guardrail_evaluations", "approval_id")
    op.drop_column("guardrail_evaluations", "escalations")
