"""Decisions are audit rows too (SPEC.md, section 4): the database refuses to delete or
replace a decision, its reasons or its tags, and to change a decision's row but for its review
columns, which every review updates (each review is kept whole in ``decision_reviews``).

The columns that may change are the ones the audit chain leaves out of a decision's canonical
form (app.audit.tables, format 1): ``status``, ``outcome``, ``reviewed_at``, ``reviewed_by``,
``actual_result``, ``lessons``, ``review_notes``, ``affected_kpis``. Every other column is
listed here, as it was at this revision: a column added later is not frozen by this trigger.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

from app.db import triggers

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FROZEN = (
    "id",
    "summary",
    "decision",
    "category",
    "confidence",
    "stakes",
    "created_at",
    "recorded_by",
    "context",
    "mental_state",
    "review_in",
    "review_by",
    "kpi_indicators",
    "pre_query_run",
    "pre_similar_found",
    "pre_guardrails_checked",
    "pre_guardrails_passed",
    "project",
    "feature",
    "pr",
    "file",
    "line",
    "commit",
    "intent_id",
    "correlation_id",
    "guardrail_evaluation_id",
)
JSON_COLUMNS = ("kpi_indicators",)
CHANGED = "decisions is append-only but for its review columns"
PG_FUNCTION = "cstp_refuse_decision_change"


def _sqlite() -> list[str]:
    changed = " OR ".join(f'OLD."{c}" IS NOT NEW."{c}"' for c in FROZEN)
    return [
        f"CREATE TRIGGER trg_decisions_no_update BEFORE UPDATE ON decisions WHEN {changed} "
        f"BEGIN SELECT RAISE(ABORT, '{CHANGED}'); END",
        "CREATE TRIGGER trg_decisions_no_delete BEFORE DELETE ON decisions "
        "BEGIN SELECT RAISE(ABORT, 'decisions is append-only'); END",
        *triggers.refuse_replace("sqlite", "decisions"),
        *triggers.install("sqlite", "decision_reasons"),
        *triggers.refuse_replace("sqlite", "decision_reasons"),
        *triggers.install("sqlite", "decision_tags"),
        # its key is (decision_id, tag): the same tag again would replace the row
        "CREATE TRIGGER trg_decision_tags_no_replace BEFORE INSERT ON decision_tags WHEN "
        "EXISTS (SELECT 1 FROM decision_tags WHERE decision_id = NEW.decision_id "
        "AND tag = NEW.tag) BEGIN SELECT RAISE(ABORT, 'decision_tags is append-only'); END",
    ]


def _postgres() -> list[str]:
    # json has no equality operator: its text is compared
    old = ", ".join(f'OLD."{c}"' + ("::text" if c in JSON_COLUMNS else "") for c in FROZEN)
    new = ", ".join(f'NEW."{c}"' + ("::text" if c in JSON_COLUMNS else "") for c in FROZEN)
    return [
        f"CREATE OR REPLACE FUNCTION {PG_FUNCTION}() RETURNS trigger AS $$ BEGIN "
        "IF TG_OP = 'DELETE' THEN RAISE EXCEPTION 'decisions is append-only'; END IF; "
        f"IF ROW({old}) IS DISTINCT FROM ROW({new}) THEN RAISE EXCEPTION '{CHANGED}'; END IF; "
        "RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER trg_decisions_append_only BEFORE UPDATE OR DELETE ON decisions "
        f"FOR EACH ROW EXECUTE FUNCTION {PG_FUNCTION}()",
        *triggers.install("postgresql", "decision_reasons"),
        *triggers.install("postgresql", "decision_tags"),
    ]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in _sqlite() if dialect == "sqlite" else _postgres():
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in ("decisions", "decision_reasons", "decision_tags"):
        for statement in (
            *triggers.remove(dialect, table),
            *triggers.remove_refuse_replace(dialect, table),
        ):
            op.execute(statement)
    if dialect != "sqlite":
        op.execute(f"DROP FUNCTION IF EXISTS {PG_FUNCTION}()")
