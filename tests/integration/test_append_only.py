"""Audit rows are append-only in the database itself: every statement that could rewrite or
remove one is refused, on SQLite whatever the connection's pragmas, and on Postgres."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from sqlalchemy import JSON, Boolean, Float, Integer, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.audit.tables import DECISIONS
from app.db.base import UtcDateTime
from support.app import Rpc
from support.databases import run_sql

# Each audit table and one column an attacker would like to change, with a value to set.
FORGED = {
    "intents": ("agent", "'mallory'"),
    "intent_matches": ("distance", "0.999"),
    "guardrail_evaluations": ("allowed", "NOT allowed"),
    "guardrail_rule_results": ("message", "'edited'"),
    "decisions": ("decision", "'edited'"),
    "decision_reasons": ("text", "'edited'"),
    "decision_tags": ("position", "99"),
    "decision_reviews": ("outcome", "'success'"),
    "audit_chain": ("hash", "'forged'"),
    "guardrail_rule_sets": ("content", "'{}'"),
}
# The primary key of the tables whose key is not ``id``.
KEYS = {"audit_chain": "seq", "guardrail_rule_sets": "hash", "decision_tags": "decision_id"}
# The conflict target of an upsert, where it is not the key above.
CONFLICT = {"decision_tags": "decision_id, tag"}


async def columns(url: str, table: str) -> list[str]:
    row = (await run_sql(url, f"SELECT * FROM {table} ORDER BY {KEYS.get(table, 'id')} LIMIT 1"))[0]
    return list(row)


async def snapshot(url: str) -> dict[str, list[dict[str, Any]]]:
    return {
        t: await run_sql(url, f"SELECT * FROM {t} ORDER BY {KEYS.get(t, 'id')}") for t in FORGED
    }


async def seed(rpc: Rpc) -> None:
    """At least one row in every audit table, through the API."""
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Cache search results for an hour",
            "confidence": 0.7,
            "category": "architecture",
            "reasons": [{"type": "analysis", "text": "the same searches repeat", "strength": 0.8}],
            "tags": ["cache"],
        },
    )
    await rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure"})
    await rpc.ok(
        "cstp.announceIntent",
        {
            "intent": "Cache search results for a day",
            "correlationId": "cache-1",
            "stakes": "high",
            "confidence": 0.3,
        },
    )
    await rpc.ok("cstp.checkGuardrails", {"action": {"description": "Deploy on Friday"}})


def statements(database_url: str, table: str, cols: list[str]) -> list[str]:
    column, value = FORGED[table]
    key = KEYS.get(table, "id")
    forged = ", ".join(value if c == column else f'"{c}"' for c in cols)  # "commit" is a keyword
    names = ", ".join(f'"{c}"' for c in cols)
    copy = f"SELECT {forged} FROM {table} WHERE {key} = (SELECT MIN({key}) FROM {table})"
    upsert = (
        f"INSERT INTO {table} ({names}) {copy} "
        f"ON CONFLICT ({CONFLICT.get(table, key)}) DO UPDATE SET {column} = excluded.{column}"
    )
    out = [
        f"UPDATE {table} SET {column} = {value}",
        f"DELETE FROM {table}",
        f"DELETE FROM {table} WHERE {key} = (SELECT MIN({key}) FROM {table})",
        upsert,
    ]
    if database_url.startswith("sqlite"):
        out += [
            f"REPLACE INTO {table} ({names}) {copy}",
            f"INSERT OR REPLACE INTO {table} ({names}) {copy}",
            f"UPDATE OR REPLACE {table} SET {column} = {value}",
        ]
    return out


@pytest.mark.parametrize("recursive_triggers", ["OFF", "ON"])
async def test_no_statement_rewrites_or_removes_an_audit_row(
    rpc: Rpc, database_url: str, recursive_triggers: str
) -> None:
    sqlite = database_url.startswith("sqlite")
    if not sqlite and recursive_triggers == "ON":
        pytest.skip("a SQLite pragma")
    await seed(rpc)
    before = await snapshot(database_url)
    assert all(before.values()), {t: len(rows) for t, rows in before.items()}
    for table in FORGED:
        for statement in statements(database_url, table, await columns(database_url, table)):
            if sqlite:
                pragma = f"PRAGMA recursive_triggers = {recursive_triggers}"
                with pytest.raises(DBAPIError, match="append-only"):
                    await run_sql_with_pragma(database_url, pragma, statement)
            else:
                with pytest.raises(DBAPIError, match="append-only"):
                    await run_sql(database_url, statement)
    assert await snapshot(database_url) == before


async def test_replace_on_the_intents_correlation_key_cannot_swap_an_announcement(
    rpc: Rpc, database_url: str
) -> None:
    """REPLACE with a new id but the same (agent, correlationId) would delete the original
    through the unique index, not the primary key."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's REPLACE")
    await seed(rpc)
    before = await snapshot(database_url)
    cols = await columns(database_url, "intents")
    forged = ", ".join(
        "'forged-id'" if c == "id" else "'forged intent'" if c == "intent" else c for c in cols
    )
    with pytest.raises(DBAPIError, match="append-only"):
        await run_sql(
            database_url,
            f"REPLACE INTO intents ({', '.join(cols)}) SELECT {forged} "
            "FROM intents WHERE correlation_id = 'cache-1'",
        )
    assert await snapshot(database_url) == before


async def test_a_review_still_updates_the_review_columns_of_a_decision(
    rpc: Rpc, database_url: str
) -> None:
    """A decision's row is frozen but for what reviews change (each review is kept whole in
    decision_reviews)."""
    await seed(rpc)
    (row,) = await run_sql(database_url, "SELECT id FROM decisions")
    await rpc.ok(
        "cstp.reviewDecision", {"id": row["id"], "outcome": "success", "lessons": "warm it"}
    )
    (after,) = await run_sql(database_url, "SELECT outcome, lessons, status FROM decisions")
    assert (after["outcome"], after["lessons"], after["status"]) == (
        "success",
        "warm it",
        "reviewed",
    )
    await run_sql(database_url, "UPDATE decisions SET review_notes = 'by hand', status = status")
    frozen = importlib.import_module(
        "app.db.migrations.versions.2026_12_03_0010_decisions_append_only"
    ).FROZEN
    assert frozen == DECISIONS.columns  # the columns the audit chain covers, no more, no less
    for column in frozen:
        with pytest.raises(DBAPIError, match="append-only but for its review columns"):
            await run_sql(
                database_url, f'UPDATE decisions SET "{column}" = {_another_value(column)}'
            )


def _another_value(name: str) -> str:
    """SQL for a value of the column's type other than the one it holds (on both databases)."""
    column, quoted = DECISIONS.table.c[name], f'"{name}"'
    if name == "id":
        return "'0f0f0f0f'"
    if isinstance(column.type, Boolean):
        return f"CASE WHEN {quoted} THEN false ELSE true END"
    if isinstance(column.type, Integer | Float):
        return f"coalesce({quoted}, 0) + 1"
    if isinstance(column.type, UtcDateTime):
        return "reviewed_at"  # set by the review, later than the decision's times
    if isinstance(column.type, JSON):
        return "'[\"changed\"]'"
    return f"CASE WHEN {quoted} = 'x' THEN 'y' ELSE 'x' END"  # short: varchar(n) holds it


async def test_new_audit_rows_are_still_written(rpc: Rpc, database_url: str) -> None:
    """The triggers refuse collisions only: the API's own inserts go on, retries included."""
    await seed(rpc)
    again = await rpc.ok(
        "cstp.announceIntent",
        {
            "intent": "Cache search results for a day",
            "correlationId": "cache-1",
            "stakes": "high",
            "confidence": 0.3,
        },
    )
    assert again["correlationId"] == "cache-1"
    await rpc.ok("cstp.announceIntent", {"intent": "Another", "correlationId": "cache-2"})
    counts = await run_sql(
        database_url, "SELECT correlation_id, outcome FROM intents ORDER BY correlation_id"
    )
    assert [(r["correlation_id"], r["outcome"]) for r in counts] == [
        ("cache-1", "ok"),
        ("cache-2", "ok"),
    ]


async def run_sql_with_pragma(url: str, pragma: str, statement: str) -> None:
    """``statement`` on a connection that first set ``pragma``."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(pragma))
            await conn.execute(text(statement))
    finally:
        await engine.dispose()
