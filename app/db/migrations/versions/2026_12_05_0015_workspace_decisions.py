"""How many decisions each workspace holds, kept by the database (``workspace_decisions``): the
keyword side weighs a word by its rarity among the caller's workspace's decisions, never the
whole database's (``app/search/keyword.py``), and counting a workspace's rows on every search
would read them all.

A row per workspace, filled from the decisions stored, and one more decision counted by a
trigger in the transaction of every decision inserted (decisions are never deleted, nor moved
to another workspace: revisions 0010 and 0012 refuse it). Derived data: the downgrade drops it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "workspace_decisions"
COUNT = (
    f"INSERT INTO {TABLE} (workspace, decisions) VALUES (NEW.workspace, 1) "
    f"ON CONFLICT (workspace) DO UPDATE SET decisions = {TABLE}.decisions + 1"
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("workspace", sa.String(63), primary_key=True),
        sa.Column("decisions", sa.Integer(), nullable=False),
    )
    op.execute(
        f"INSERT INTO {TABLE} (workspace, decisions) "
        "SELECT workspace, COUNT(*) FROM decisions GROUP BY workspace"
    )
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"CREATE TRIGGER trg_decisions_count AFTER INSERT ON decisions BEGIN {COUNT}; END"
        )
        return
    op.execute(
        "CREATE FUNCTION cstp_count_decision() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN {COUNT}; RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER trg_decisions_count AFTER INSERT ON decisions FOR EACH ROW "
        "EXECUTE FUNCTION cstp_count_decision()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS trg_decisions_count")
    else:
        op.execute("DROP TRIGGER IF EXISTS trg_decisions_count ON decisions")
        op.execute("DROP FUNCTION IF EXISTS cstp_count_decision()")
    op.drop_table(TABLE)
