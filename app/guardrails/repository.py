"""The SQL of the guardrails context: the writes of a stored evaluation (its
``guardrail_evaluations`` and ``guardrail_rule_results`` rows, and its rule set's
``guardrail_rule_sets`` row), and the reads a replay makes of them.

Functions take the session (or, for a replay, the connection) they run in; the callers own
the transactions. Plain Core statements: nothing reads these rows back as ORM objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleResult, GuardrailRuleSet

#: The columns of a rule's stored result a replay compares.
RESULT_FIELDS = (
    "severity",
    "mode",
    "fired",
    "would_block",
    "would_warn",
    "would_escalate",
    "message",
    "error",
)

_EVALUATIONS = table_of(GuardrailEvaluation)
_RESULTS = table_of(GuardrailRuleResult)
_RULE_SETS = table_of(GuardrailRuleSet)

# --- the writes ------------------------------------------------------------------------------


async def insert_evaluations(
    session: AsyncSession, rows: Sequence[dict[str, Any]], rule_rows: Sequence[dict[str, Any]]
) -> None:
    """One insert for the evaluation rows, then one for all their per-rule rows."""
    await session.execute(insert(_EVALUATIONS), rows)
    if rule_rows:
        await session.execute(insert(_RESULTS), rule_rows)


async def insert_rule_set(session: AsyncSession, row: dict[str, Any], *, postgres: bool) -> None:
    """Store a rule set unless its hash is stored (append-only: a stored one is never
    rewritten). Postgres: INSERT … ON CONFLICT DO NOTHING (two processes may store the same
    set at once). SQLite: a look-up, then the insert; write transactions there are
    serialized, and an ``INSERT OR IGNORE`` would meet the append-only trigger that refuses
    collisions."""
    if postgres:
        await session.execute(
            postgresql.insert(_RULE_SETS)
            .values(row)
            .on_conflict_do_nothing(index_elements=["hash"])
        )
    elif (
        await session.execute(select(_RULE_SETS.c.hash).where(_RULE_SETS.c.hash == row["hash"]))
    ).first() is None:
        await session.execute(insert(_RULE_SETS).values(row))


# --- a replay's reads --------------------------------------------------------------------------


def evaluation(conn: Connection, evaluation_id: str) -> dict[str, Any] | None:
    """The stored ``guardrail_evaluations`` row, by column."""
    row = conn.execute(select(_EVALUATIONS).where(_EVALUATIONS.c.id == evaluation_id))
    found = row.mappings().first()
    return None if found is None else dict(found)


def rule_results(conn: Connection, evaluation_id: str) -> dict[str, dict[str, Any]]:
    """The evaluation's stored rule results: ``RESULT_FIELDS`` by rule id."""
    columns = [_RESULTS.c.guardrail_id, *(_RESULTS.c[f] for f in RESULT_FIELDS)]
    rows = conn.execute(select(*columns).where(_RESULTS.c.evaluation_id == evaluation_id))
    return {str(r.guardrail_id): {f: r._mapping[f] for f in RESULT_FIELDS} for r in rows}


def rule_set_content(conn: Connection, rule_set_hash: str) -> str | None:
    """The stored content of the rule set with this hash, if stored."""
    row = conn.execute(select(_RULE_SETS.c.content).where(_RULE_SETS.c.hash == rule_set_hash))
    found = row.first()
    return None if found is None else str(found[0])
