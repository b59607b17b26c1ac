"""Session briefs (SPEC.md, section 9): every cstp.getSessionContext answer as it was sent,
append-only (UPDATE, DELETE and, on SQLite, REPLACE refused) and covered by the audit chain;
on PostgreSQL under the auditors' row-level security policy of revision 0012.

The downgrade refuses to run while a brief is stored: briefs are audit rows, covered by the
chain.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "session_briefs"
READER_FUNCTION = "cstp_reader_workspace"  # revision 0012
POLICY = "workspace_readers"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        TABLE,
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("task", sa.Text(), nullable=True),
        sa.Column("format", sa.String(8), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_briefs")),
    )
    op.create_index(
        "ix_session_briefs_workspace_agent_created_at",
        TABLE,
        ["workspace", "agent", "created_at"],
    )
    statements = [*triggers.install(dialect, TABLE), *triggers.refuse_replace(dialect, TABLE)]
    if dialect == "postgresql":
        reader = f"(SELECT {READER_FUNCTION}(current_user))"
        statements += [
            f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY {POLICY} ON {TABLE} FOR ALL "
            f"USING ({reader} IS NULL OR workspace = {reader}) WITH CHECK ({reader} IS NULL)",
        ]
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().execute(sa.text(f"SELECT COUNT(*) FROM {TABLE}")).scalar():
        raise RuntimeError(
            "cannot downgrade below revision 0021: session briefs are stored; they are audit "
            "rows, covered by the audit chain"
        )
    op.drop_table(TABLE)
