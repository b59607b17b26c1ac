"""Workspaces (SPEC.md, section 7): every row belongs to one; the rows stored before belong to
``default``.

Each table gets a ``workspace`` column, NOT NULL with the default ``default``: adding it that
way is a change of the schema alone on both databases (no row is rewritten, so the append-only
triggers are not involved, and the audit chain's digests stay valid: the canonical form has a
``workspace`` member only for another workspace, app.audit.tables format 3).

- A successful announcement's correlation id is unique per workspace and agent (the unique
  index, and on SQLite the trigger that refuses a REPLACE over it, take the workspace).
- A decision's workspace is frozen like its other recorded columns (revision 0010 froze the
  columns of its day).
- PostgreSQL only: row-level security for auditors' SQL sessions. ``audit_readers`` names the
  database roles made by ``cstp db auditor-role`` and each one's workspace; every audit table
  has one policy: a role listed there sees its workspace's rows, any other role (the server's,
  an operator's) what it saw before. The table's owner, which runs the server and these
  migrations, is not subject to row-level security at all. ``cstp_reader_workspace(role)``
  reads the list with its owner's rights, so the readers need no grant on it; the policies
  pass it ``current_user``, since inside the function (SECURITY DEFINER) ``current_user`` is
  its owner. It answers only for a role the session may act as, so that a reader cannot look
  up which workspace another reader reads.

The downgrade refuses to run while a row of another workspace is stored: revision 0011 has no
place for it, and audit rows are not changed or deleted.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "decisions",
    "decision_reasons",
    "decision_tags",
    "decision_reviews",
    "intents",
    "intent_matches",
    "guardrail_evaluations",
    "guardrail_rule_results",
    "outbox_events",
    "audit_chain",
)
# Indexes for reading one workspace's rows in their order of time.
INDEXES = {
    "ix_decisions_workspace_created_at": ("decisions", ("workspace", "created_at")),
    "ix_intents_workspace_received_at": ("intents", ("workspace", "received_at")),
    "ix_guardrail_evaluations_workspace_evaluated_at": (
        "guardrail_evaluations",
        ("workspace", "evaluated_at"),
    ),
}
OLD_UNIQUE = "uq_intents_agent_correlation_ok"
NEW_UNIQUE = "uq_intents_workspace_agent_correlation_ok"
SQLITE_FROZEN = "trg_decisions_workspace_frozen"
PG_FROZEN = "cstp_refuse_workspace_change"
READERS = "audit_readers"
READER_FUNCTION = "cstp_reader_workspace"
POLICY = "workspace_readers"


def _intents_replace(with_workspace: bool) -> list[str]:
    """SQLite: the trigger refusing a REPLACE of a successful announcement (revision 0006)."""
    same = "workspace = NEW.workspace AND " if with_workspace else ""
    also_when = (
        f"NEW.outcome = 'ok' AND EXISTS (SELECT 1 FROM intents WHERE {same}agent = NEW.agent "
        "AND correlation_id = NEW.correlation_id AND outcome = 'ok')"
    )
    return [
        *triggers.remove_refuse_replace("sqlite", "intents"),
        *triggers.refuse_replace("sqlite", "intents", also_when),
    ]


def _unique(name: str, columns: list[str]) -> None:
    op.create_index(
        name,
        "intents",
        columns,
        unique=True,
        sqlite_where=sa.text("outcome = 'ok'"),
        postgresql_where=sa.text("outcome = 'ok'"),
    )


def _row_level_security() -> list[str]:
    # Evaluated once per statement (an init plan), with the querying role as current_user.
    reader = f"(SELECT {READER_FUNCTION}(current_user))"
    statements = [
        f"CREATE TABLE {READERS} (role_name VARCHAR(63) PRIMARY KEY, "
        "workspace VARCHAR(63) NOT NULL)",
        f"CREATE FUNCTION {READER_FUNCTION}(reader text) RETURNS text LANGUAGE sql STABLE "
        "SECURITY DEFINER SET search_path FROM CURRENT AS "
        f"$$ SELECT workspace FROM {READERS} WHERE role_name = reader "
        "AND pg_has_role(session_user, reader, 'MEMBER') $$",
    ]
    for table in TABLES:
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            # Readers are granted SELECT alone; the check keeps them out of writes even so.
            f"CREATE POLICY {POLICY} ON {table} FOR ALL "
            f"USING ({reader} IS NULL OR workspace = {reader}) "
            f"WITH CHECK ({reader} IS NULL)",
        ]
    return statements


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in TABLES:
        op.add_column(
            table,
            sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        )
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, list(columns))
    op.drop_index(OLD_UNIQUE, "intents")
    _unique(NEW_UNIQUE, ["workspace", "agent", "correlation_id"])
    if dialect == "sqlite":
        for statement in _intents_replace(with_workspace=True):
            op.execute(statement)
        op.execute(
            f"CREATE TRIGGER {SQLITE_FROZEN} BEFORE UPDATE OF workspace ON decisions "
            "WHEN OLD.workspace IS NOT NEW.workspace "
            "BEGIN SELECT RAISE(ABORT, 'a decision''s workspace never changes'); END"
        )
        return
    op.execute(
        f"CREATE OR REPLACE FUNCTION {PG_FROZEN}() RETURNS trigger AS $$ BEGIN "
        "RAISE EXCEPTION 'a decision''s workspace never changes'; END $$ LANGUAGE plpgsql"
    )
    op.execute(
        f"CREATE TRIGGER {SQLITE_FROZEN} BEFORE UPDATE OF workspace ON decisions FOR EACH ROW "
        f"WHEN (OLD.workspace IS DISTINCT FROM NEW.workspace) EXECUTE FUNCTION {PG_FROZEN}()"
    )
    for statement in _row_level_security():
        op.execute(statement)


def downgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    others = " + ".join(
        f"(SELECT COUNT(*) FROM {table} WHERE workspace <> 'default')" for table in TABLES
    )
    if bind.execute(sa.text(f"SELECT {others}")).scalar():
        raise RuntimeError(
            "cannot downgrade below revision 0012: rows of workspaces other than 'default' "
            "are stored, and revision 0011 has no place for them; audit rows are never "
            "changed or deleted"
        )
    if dialect == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {SQLITE_FROZEN}")
        for statement in _intents_replace(with_workspace=False):
            op.execute(statement)
    else:
        for table in TABLES:
            op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {table}")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        op.execute(f"DROP FUNCTION IF EXISTS {READER_FUNCTION}(text)")
        op.execute(f"DROP TABLE IF EXISTS {READERS}")
        op.execute(f"DROP TRIGGER IF EXISTS {SQLITE_FROZEN} ON decisions")
        op.execute(f"DROP FUNCTION IF EXISTS {PG_FROZEN}()")
    op.drop_index(NEW_UNIQUE, "intents")
    _unique(OLD_UNIQUE, ["agent", "correlation_id"])
    for name, (table, _columns) in INDEXES.items():
        op.drop_index(name, table)
    for table in TABLES:
        # a plain DROP COLUMN: SQLite's batch mode would rebuild the table, and drop the
        # triggers that make it append-only
        op.execute(f"ALTER TABLE {table} DROP COLUMN workspace")
