"""Append-only means append-only on SQLite too: REPLACE and INSERT OR REPLACE, whose implicit
delete fires no DELETE trigger, are refused on every audit table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

from app.db import triggers

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each audit table's unique keys beyond its primary key ``id``, as a collision with NEW.
OTHER_KEYS = {
    "intents": (
        "NEW.outcome = 'ok' AND EXISTS (SELECT 1 FROM intents WHERE agent = NEW.agent "
        "AND correlation_id = NEW.correlation_id AND outcome = 'ok')"
    ),
    "intent_matches": None,
    "guardrail_evaluations": None,
    "guardrail_rule_results": None,
    "decision_reviews": None,
}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table, also_when in OTHER_KEYS.items():
        for statement in triggers.refuse_replace(dialect, table, also_when):
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in OTHER_KEYS:
        for statement in triggers.remove_refuse_replace(dialect, table):
            op.execute(statement)
