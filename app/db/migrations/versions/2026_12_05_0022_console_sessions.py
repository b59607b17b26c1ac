"""Console sessions (SPEC.md, section 10): one row per sign-in, ended by signing out.

Not an audit table: a session is a way in, like a token, and what a signed-in person does is
audited as the calls it makes. The downgrade drops the table, which signs everybody out.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.base import UtcDateTime

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "console_sessions"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("token_digest", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    op.create_index(op.f("ix_console_sessions_expires_at"), TABLE, ["expires_at"])


def downgrade() -> None:
    op.drop_table(TABLE)
