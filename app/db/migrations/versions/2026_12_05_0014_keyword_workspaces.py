"""The keyword index keeps to a workspace inside itself (SPEC.md, section 7: "the keyword
index [is] filtered by workspace inside the search"): each decision's entry holds its
workspace as a token no text can make (``app/db/fulltext.py``, "workspaces"), so a search
intersects it with the words, and a word's count is its count in the caller's workspace.

SQLite: the FTS5 table cannot gain a column, so it is built again (with its key table and
triggers) from the rows, as revision 0008 built it. Postgres: the trigger that writes a
decision's document adds the lexeme, and the documents already stored get it. The downgrade
goes back to the index of revision 0008. Only derived data changes: no audit row is touched.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

from app.db import fulltext

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    statements = fulltext.add_workspaces(dialect, tokenizer="porter unicode61", config="english")
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    statements = fulltext.drop_workspaces(dialect, tokenizer="porter unicode61", config="english")
    for statement in statements:
        op.execute(statement)
