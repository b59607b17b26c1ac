"""Tokens in the database (SPEC.md, section 7): ``api_tokens`` and the audit rows of their
grants, ``api_token_grants``.

- ``api_tokens``: a token's public id (``tok_…``), workspace, agent, role, scopes, when and by
  whom it was made, when it expires, when it was revoked, and the SHA-256 of its secret
  (unique; the secret itself is never stored). The database refuses to delete a row and to
  update one except to set ``revoked_at`` once: a token is revoked, never deleted or
  widened, so what the table says stays what its grants say.
- ``api_token_grants``: one row per creation and per revocation (what was granted, when, by
  whom, the secret's SHA-256), append-only like every audit table (UPDATE, DELETE and, on
  SQLite, REPLACE refused), and covered by the audit chain.
- PostgreSQL: both tables get the row-level security policy of revision 0012 (a role listed
  in ``audit_readers`` sees its workspace's rows and writes nothing), so ``cstp db
  auditor-role`` grants its readers SELECT on them too.

The downgrade refuses to run while a grant is stored: grants are audit rows, covered by the
chain, and revision 0012 has no place for them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKENS = "api_tokens"
GRANTS = "api_token_grants"
# Every column of api_tokens but revoked_at: what an UPDATE must leave as it is.
FROZEN = (
    "id",
    "workspace",
    "agent",
    "role",
    "scopes",
    "created_at",
    "created_by",
    "expires_at",
    "secret_sha256",
)
PG_REVOKE_ONLY = "cstp_api_tokens_revoke_only"
READER_FUNCTION = "cstp_reader_workspace"  # revision 0012
POLICY = "workspace_readers"
NO_DELETE = "api_tokens rows are never deleted: revoke the token instead"
REVOKE_ONLY = "an api_tokens row changes only to be revoked, once"


def _sqlite_revoke_only() -> list[str]:
    # SQLite compares JSON as its text, which the server never rewrites.
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in FROZEN)
    return [
        f"CREATE TRIGGER trg_{TOKENS}_no_delete BEFORE DELETE ON {TOKENS} "
        f"BEGIN SELECT RAISE(ABORT, '{NO_DELETE}'); END",
        f"CREATE TRIGGER trg_{TOKENS}_no_update BEFORE UPDATE ON {TOKENS} "
        f"WHEN OLD.revoked_at IS NOT NULL OR NEW.revoked_at IS NULL OR {changed} "
        f"BEGIN SELECT RAISE(ABORT, '{REVOKE_ONLY}'); END",
        *triggers.refuse_replace(
            "sqlite",
            TOKENS,
            f"EXISTS (SELECT 1 FROM {TOKENS} WHERE secret_sha256 = NEW.secret_sha256)",
        ),
    ]


def _pg_revoke_only() -> list[str]:
    return [
        f"CREATE FUNCTION {PG_REVOKE_ONLY}() RETURNS trigger AS $$ BEGIN "
        f"IF TG_OP = 'DELETE' THEN RAISE EXCEPTION '{NO_DELETE}'; END IF; "
        "IF OLD.revoked_at IS NOT NULL OR NEW.revoked_at IS NULL "
        "OR (to_jsonb(NEW) - 'revoked_at') IS DISTINCT FROM (to_jsonb(OLD) - 'revoked_at') "
        f"THEN RAISE EXCEPTION '{REVOKE_ONLY}'; END IF; "
        "RETURN NEW; END $$ LANGUAGE plpgsql",
        f"CREATE TRIGGER trg_{TOKENS}_revoke_only BEFORE UPDATE OR DELETE ON {TOKENS} "
        f"FOR EACH ROW EXECUTE FUNCTION {PG_REVOKE_ONLY}()",
    ]


def _row_level_security() -> list[str]:
    # As revision 0012 writes it: evaluated once per statement, for the querying role.
    reader = f"(SELECT {READER_FUNCTION}(current_user))"
    statements = []
    for table in (TOKENS, GRANTS):
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY {POLICY} ON {table} FOR ALL "
            f"USING ({reader} IS NULL OR workspace = {reader}) "
            f"WITH CHECK ({reader} IS NULL)",
        ]
    return statements


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        TOKENS,
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("secret_sha256", name=op.f("uq_api_tokens_secret_sha256")),
    )
    op.create_index(
        "ix_api_tokens_workspace_created_at", TOKENS, ["workspace", "created_at"], unique=False
    )
    op.create_table(
        GRANTS,
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("workspace", sa.String(63), nullable=False, server_default="default"),
        sa.Column("action", sa.String(8), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("acted_at", UtcDateTime(), nullable=False),
        sa.Column("acted_by", sa.String(128), nullable=False),
        sa.CheckConstraint(
            "action IN ('create', 'revoke')", name=op.f("ck_api_token_grants_action")
        ),
        sa.ForeignKeyConstraint(
            ["token_id"], [f"{TOKENS}.id"], name=op.f("fk_api_token_grants_token_id_api_tokens")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token_grants")),
    )
    op.create_index(op.f("ix_api_token_grants_token_id"), GRANTS, ["token_id"])
    op.create_index(op.f("ix_api_token_grants_acted_at"), GRANTS, ["acted_at"])
    statements = [
        *triggers.install(dialect, GRANTS),
        *triggers.refuse_replace(dialect, GRANTS),
    ]
    if dialect == "sqlite":
        statements += _sqlite_revoke_only()
    else:
        statements += _pg_revoke_only() + _row_level_security()
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.execute(sa.text(f"SELECT COUNT(*) FROM {GRANTS}")).scalar():
        raise RuntimeError(
            "cannot downgrade below revision 0013: token grants are stored; they are audit "
            "rows, covered by the audit chain, and revision 0012 has no place for them"
        )
    # Dropping a table drops its triggers, policies and indexes with it.
    op.drop_table(GRANTS)
    op.drop_table(TOKENS)
    if bind.dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {PG_REVOKE_ONLY}()")
