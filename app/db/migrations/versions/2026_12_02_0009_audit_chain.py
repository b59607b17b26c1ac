"""The tamper-evident audit trail and replayable guardrail verdicts.

- ``audit_chain``: one hash-linked entry per audited row (intents, guardrail evaluations,
  decisions, decision reviews; app/audit), append-only; on Postgres the function
  ``cstp_audit_head()`` that appenders call to take the chain's lock and read its head.
- ``guardrail_rule_sets``: every rule set an evaluation used, once per content hash, with its
  content (append-only); ``guardrail_evaluations.rule_set_hash`` names it.
- ``guardrail_rule_results.mode``, ``would_block``, ``would_warn``: shadow rules.

The upgrade builds the chain over the rows already stored, in their order of creation (their
timestamps; at the same instant evaluations, then intents, decisions and reviews; then by
key), under ``CSTP_AUDIT_KEY`` / ``CSTP_AUDIT_KEY_FILE`` when one is set, as the server would
have. Evaluations stored before this revision have no rule set to replay with. The downgrade
drops the chain, the rule sets and the new columns.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from app.audit import canonical, stored
from app.audit.chain import CHAIN, GENESIS, HEAD_FUNCTION, LOCK_KEY, link
from app.config import audit_key_from_env
from app.db import triggers

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY = {
    # table: (primary key column, its other unique keys as a collision with NEW)
    "audit_chain": (
        "seq",
        "EXISTS (SELECT 1 FROM audit_chain WHERE table_name = NEW.table_name "
        "AND row_id = NEW.row_id)",
    ),
    "guardrail_rule_sets": ("hash", None),
}
BATCH = 500


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "guardrail_rule_sets",
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("rules", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_guardrail_rule_sets")),
    )
    op.add_column("guardrail_evaluations", sa.Column("rule_set_hash", sa.String(64), nullable=True))
    op.create_index(
        op.f("ix_guardrail_evaluations_rule_set_hash"),
        "guardrail_evaluations",
        ["rule_set_hash"],
    )
    op.add_column(
        "guardrail_rule_results",
        sa.Column("mode", sa.String(8), nullable=False, server_default="enforce"),
    )
    for column in ("would_block", "would_warn"):
        op.add_column(
            "guardrail_rule_results",
            sa.Column(column, sa.Boolean(), nullable=False, server_default=sa.false()),
        )
    op.create_table(
        "audit_chain",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("table_name", sa.String(64), nullable=False),
        sa.Column("row_id", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("keyed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_chain")),
    )
    op.create_index("uq_audit_chain_row", "audit_chain", ["table_name", "row_id"], unique=True)
    for table, (key, also_when) in APPEND_ONLY.items():
        for statement in [
            *triggers.install(dialect, table),
            *triggers.refuse_replace(dialect, table, also_when, key=key),
        ]:
            op.execute(statement)
    if dialect == "postgresql":
        op.execute(
            f"CREATE FUNCTION {HEAD_FUNCTION}() RETURNS TABLE (seq bigint, hash varchar) AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock({LOCK_KEY}); "
            "RETURN QUERY SELECT c.seq, c.hash FROM audit_chain AS c "
            "ORDER BY c.seq DESC LIMIT 1; END $$ LANGUAGE plpgsql VOLATILE"
        )
    _chain_existing_rows(op.get_bind())


def _chain_existing_rows(conn: sa.Connection) -> None:
    """Every stored audited row, oldest first, in batches: digests, links, one INSERT each."""
    secret = audit_key_from_env()
    order = {name: rank for rank, name in enumerate(canonical.AUDITED)}
    keys: list[tuple[Any, int, Any, str]] = []
    for name, audited in canonical.AUDITED.items():
        table = audited.table
        key, time = table.c[audited.key], table.c[audited.time]
        for row_key, when in conn.execute(sa.select(key, time)):
            keys.append((when, order[name], row_key, name))
    keys.sort()
    head = (0, GENESIS)
    for start in range(0, len(keys), BATCH):
        chunk = keys[start : start + BATCH]
        found: dict[tuple[str, str], str] = {}
        for name, audited in canonical.AUDITED.items():
            ids = [str(k[2]) for k in chunk if k[3] == name]
            if ids:
                digests = stored.digests(conn, audited, ids)
                found.update(((name, row_id), d) for row_id, d in digests.items())
        entries = [
            canonical.Covered(name, str(row_key), found[(name, str(row_key))])
            for _, _, row_key, name in chunk
        ]
        rows = link(head, entries, secret)
        conn.execute(sa.insert(CHAIN).values(rows))
        head = (rows[-1]["seq"], rows[-1]["hash"])


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {HEAD_FUNCTION}()")
    for table in APPEND_ONLY:
        for statement in [
            *triggers.remove(dialect, table),
            *triggers.remove_refuse_replace(dialect, table),
        ]:
            op.execute(statement)
    op.drop_index("uq_audit_chain_row", table_name="audit_chain")
    op.drop_table("audit_chain")
    for column in ("would_warn", "would_block", "mode"):
        op.drop_column("guardrail_rule_results", column)
    op.drop_index(
        op.f("ix_guardrail_evaluations_rule_set_hash"), table_name="guardrail_evaluations"
    )
    op.drop_column("guardrail_evaluations", "rule_set_hash")
    op.drop_table("guardrail_rule_sets")
