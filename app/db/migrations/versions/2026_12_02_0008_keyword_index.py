"""The keyword index of decisions, in each database's own full-text search, kept by triggers.

SQLite: an FTS5 table ``decision_search`` and its key table ``decision_search_keys``;
Postgres: a table ``decision_search`` with a ``tsvector`` and a GIN index. Both are filled
from the decisions already stored (text, context, reasons, tags) and kept in the same
transaction as every later insert by triggers (``app/db/fulltext.py``). The downgrade drops
them; no other table changes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

from app.db import fulltext

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in fulltext.install(dialect, tokenizer="porter unicode61", config="english"):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in fulltext.remove(dialect):
        op.execute(statement)
