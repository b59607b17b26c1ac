"""announceIntent answers while the vector index is down, from keyword search alone: its row
says so (``intents.search_degraded``, TRUE then and NULL otherwise), and the decisions it was
shown have no distance (``intent_matches.distance`` may be NULL).

The audit chain covers ``search_degraded`` from format 2 on (app.audit.tables), as a member
of an intent's canonical form only when it is not NULL: every row stored before keeps its
digest. On SQLite a column's NOT NULL can only change by building the table again, which
drops its triggers: they are installed again, as revisions 0004 and 0006 made them.

The downgrade refuses to run while a degraded announcement is stored: revision 0010 has no
place for it, and audit rows are not changed or deleted.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _distance(nullable: bool) -> None:
    dialect = op.get_bind().dialect.name
    if dialect != "sqlite":
        op.alter_column("intent_matches", "distance", existing_type=sa.Float(), nullable=nullable)
        return
    for statement in (
        *triggers.remove(dialect, "intent_matches"),
        *triggers.remove_refuse_replace(dialect, "intent_matches"),
    ):
        op.execute(statement)
    with op.batch_alter_table("intent_matches", recreate="always") as batch:
        batch.alter_column("distance", existing_type=sa.Float(), nullable=nullable)
    for statement in (
        *triggers.install(dialect, "intent_matches"),
        *triggers.refuse_replace(dialect, "intent_matches"),
    ):
        op.execute(statement)


def upgrade() -> None:
    op.add_column("intents", sa.Column("search_degraded", sa.Boolean(), nullable=True))
    _distance(nullable=True)


def downgrade() -> None:
    degraded = op.get_bind().execute(
        sa.text(
            "SELECT (SELECT COUNT(*) FROM intents WHERE search_degraded IS NOT NULL) "
            "+ (SELECT COUNT(*) FROM intent_matches WHERE distance IS NULL)"
        )
    )
    if degraded.scalar():
        raise RuntimeError(
            "cannot downgrade below revision 0011: announcements answered while the vector "
            "index was down (intents.search_degraded) are stored, and revision 0010 cannot "
            "hold them; audit rows are never changed or deleted"
        )
    _distance(nullable=False)
    op.execute("ALTER TABLE intents DROP COLUMN search_degraded")
