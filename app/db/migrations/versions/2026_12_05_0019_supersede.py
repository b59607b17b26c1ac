"""Supersede links (SPEC.md, section 9).

- ``decision_supersedes``: one row per link, ``decision_id`` (the new decision) supersedes
  ``superseded_id`` (an earlier one of the same workspace), with the link's ``position`` in
  the request. A child table of the superseding decision, covered by its audit chain entry
  (app.audit.tables, format 6: a member of the decision's canonical form only when it has
  rows, so the digests of the decisions stored before stay valid). Append-only like every
  audit table (UPDATE, DELETE and, on SQLite, REPLACE refused); on PostgreSQL it gets the
  auditors' row-level security policy of revision 0012.
- ``decisions.superseded_by``: the decision that superseded this one (the latest link's),
  NULL while none did; copied from the links so that reads need no join. Revision 0010's
  trigger freezes the columns of its day only, so this one changes when a link is made, like
  the review columns (``cstp audit verify`` holds it to the links).

Both added in place on SQLite (a nullable column, a new table).

The downgrade refuses to run while a link is stored: it is an audit row, covered by the
chain, and revision 0018 has no place for it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LINKS = "decision_supersedes"
READER_FUNCTION = "cstp_reader_workspace"  # revision 0012
POLICY = "workspace_readers"


def _row_level_security() -> list[str]:
    # As revision 0012 writes it: evaluated once per statement, for the querying role.
    reader = f"(SELECT {READER_FUNCTION}(current_user))"
    return [
        f"ALTER TABLE {LINKS} ENABLE ROW LEVEL SECURITY",
        f"CREATE POLICY {POLICY} ON {LINKS} FOR ALL "
        f"USING ({reader} IS NULL OR workspace = {reader}) "
        f"WITH CHECK ({reader} IS NULL)",
    ]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.add_column("decisions", sa.Column("superseded_by", sa.String(8), nullable=True))
    op.create_table(
        LINKS,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_id", sa.String(8), nullable=False),
        sa.Column("superseded_id", sa.String(8), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_decision_supersedes_decision_id_decisions"),
        ),
        sa.ForeignKeyConstraint(
            ["superseded_id"],
            ["decisions.id"],
            name=op.f("fk_decision_supersedes_superseded_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decision_supersedes")),
        sa.UniqueConstraint(
            "decision_id",
            "superseded_id",
            name=op.f("uq_decision_supersedes_decision_id_superseded_id"),
        ),
    )
    op.create_index(op.f("ix_decision_supersedes_superseded_id"), LINKS, ["superseded_id"])
    statements = [
        *triggers.install(dialect, LINKS),
        # its other key is (decision_id, superseded_id): the same link again would replace it
        *triggers.refuse_replace(
            dialect,
            LINKS,
            f"EXISTS (SELECT 1 FROM {LINKS} WHERE decision_id = NEW.decision_id "
            "AND superseded_id = NEW.superseded_id)",
        ),
    ]
    if dialect == "postgresql":
        statements += _row_level_security()
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    bind = op.get_bind()
    stored = bind.execute(sa.text(f"SELECT COUNT(*) FROM {LINKS}")).scalar()
    if stored:
        raise RuntimeError(
            "cannot downgrade below revision 0019: supersede links are stored; they are "
            "audit rows, covered by the audit chain, and revision 0018 has no place for them"
        )
    # Dropping a table drops its triggers, policies and indexes with it; the column is
    # dropped in place on both databases (no index or trigger names it).
    op.drop_table(LINKS)
    op.drop_column("decisions", "superseded_by")
