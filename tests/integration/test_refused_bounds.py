"""Issue 36: refused announcements are recorded, but each keeps only a bounded share of what
was sent, so an agent sending 1 MB calls cannot grow the append-only ``intents`` table by a
megabyte a call; the audit chain verifies over the rows that keep markers. On SQLite and
Postgres (``database_url``)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from app.asgi import create_app
from app.cli import main
from app.config import Settings, parse_rate_limits
from app.db.intents import Intent
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.databases import USE_PG, run_sql

# The commands these tests run in this process use the session's model (conftest).
pytestmark = pytest.mark.usefixtures("commands_share_the_model")

ANNOUNCE = "cstp.announceIntent"
MB = 1_000_000
TEXT_BYTES = 1024  # docs/AUDIT.md: what a failed call's row keeps of intent and context
METADATA_BYTES = 1024  # and of its metadata, as stored JSON
ROW_VALUES_BYTES = 3904  # the most a failed call's own values take in its row (docs/AUDIT.md)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


async def intent_rows(db: AsyncEngine, *where: Any) -> list[Intent]:
    async with AsyncSession(db) as session:
        return list(await session.scalars(select(Intent).where(*where).order_by(Intent.id)))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sorted_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def noise(size: int) -> str:
    """Text no database compresses (Postgres compresses large values it stores)."""
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()[:size]


async def verify_chain(url: str) -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["audit", "verify"],
        env={"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None},
    )
    assert result.exit_code == 0, result.output


async def database_bytes(url: str) -> int:
    """What the database takes on disk: on SQLite the file and its WAL once checkpointed."""
    if USE_PG:
        rows = await run_sql(url, "SELECT pg_database_size(current_database()) AS size")
        return int(rows[0]["size"])
    path = Path(url.split("///", 1)[1])

    def measure() -> int:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        wal = path.with_name(path.name + "-wal")
        return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    return await asyncio.to_thread(measure)


def stored_bytes(row: Intent) -> int:
    """The caller's values a failed row keeps, in bytes (JSON as the column writes it)."""
    texts = (row.correlation_id, row.intent, row.context, row.category, row.stakes)
    size = sum(len(t.encode()) for t in texts if t is not None)
    return size + (len(json.dumps(row.metadata_)) if row.metadata_ is not None else 0)


# ---------------------------------------------------------------- what a refused row keeps


async def test_a_refused_call_keeps_each_value_bounded_with_its_size_and_digest(
    settings: Settings, embedder: Embedder, db: AsyncEngine, database_url: str
) -> None:
    intent = "Ship the release " + "é" * 30_000  # over the 20,000 characters: -32602
    context = "why: " + noise(300_000)
    metadata = {"blob": noise(200_000), "affects_production": True}
    async with serve_app(create_app(settings, embedder=embedder)) as client:
        rpc = Rpc(client)
        error = await rpc.error(
            ANNOUNCE,
            {
                "intent": intent,
                "context": context,
                "category": "c" * 5_000,
                "stakes": "s" * 5_000,
                "confidence": 0.5,
                "correlationId": "x" * 100_000,
                "metadata": metadata,
            },
        )
        assert error["code"] == -32602
        # a small one keeps what it sent, whole
        small = {"pr_number": 42, "branch": "feat/auth-v2", "affects_production": True}
        error = await rpc.error(
            ANNOUNCE,
            {
                "intent": "Deploy",
                "stakes": "extreme",
                "correlationId": "small-1",
                "metadata": small,
            },
        )
        assert error["code"] == -32602
    (big,) = await intent_rows(db, Intent.correlation_id == "x" * 128)
    assert (big.outcome, big.error_code, big.confidence) == ("failed", -32602, 0.5)
    assert (big.category, big.stakes) == ("c" * 64, "s" * 16)
    for stored, sent in ((big.intent, intent), (big.context, context)):
        assert stored is not None
        raw = sent.encode()
        marker = f"… [truncated: {len(raw)} bytes, sha256 {sha256(raw)}]"
        assert stored.endswith(marker), stored[-200:]
        assert len(stored.encode()) <= TEXT_BYTES
        head = stored.removesuffix(marker)
        assert len(head.encode()) > TEXT_BYTES * 3 // 4 and sent.startswith(head)
    assert big.metadata_ == {
        "truncated": True,
        "bytes": len(sorted_json(metadata)),
        "sha256": sha256(sorted_json(metadata)),
    }
    assert stored_bytes(big) <= ROW_VALUES_BYTES
    (kept,) = await intent_rows(db, Intent.correlation_id == "small-1")
    assert (kept.intent, kept.stakes, kept.metadata_) == ("Deploy", "extreme", small)
    await verify_chain(database_url)  # the chain covers the rows as stored, markers and all


async def test_a_refused_call_with_a_confidence_past_any_float_is_recorded(
    settings: Settings, embedder: Embedder, db: AsyncEngine
) -> None:
    async with serve_app(create_app(settings, embedder=embedder)) as client:
        params = {"intent": "Deploy", "confidence": 10**400, "correlationId": "huge-1"}
        assert (await Rpc(client).error(ANNOUNCE, params))["code"] == -32602
    (row,) = await intent_rows(db, Intent.correlation_id == "huge-1")
    assert (row.outcome, row.intent, row.confidence) == ("failed", "Deploy", None)


# ---------------------------------------------------------------- 1,000 refused calls of 1 MB


@pytest.mark.slow
async def test_a_thousand_refused_one_megabyte_calls_grow_the_database_by_under_10_mb(
    settings: Settings, embedder: Embedder, db: AsyncEngine, database_url: str
) -> None:
    """The first 500 calls are invalid (metadata over its 64 KiB), the next 500 over the
    agent's budget: each is recorded, with a marker for its metadata."""
    limited = replace(
        settings,
        rate_limits=parse_rate_limits("default=100000/1,cstp.announceIntent=500/100000000"),
    )
    metadata = {"blob": noise(MB)}
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": ANNOUNCE,
            "params": {"intent": "Deploy the payment service", "metadata": metadata},
        }
    ).encode()
    assert MB < len(body) < 1_048_576  # within the server's body cap
    headers = {"Authorization": "Bearer token-alice", "Content-Type": "application/json"}
    async with serve_app(create_app(limited, embedder=embedder)) as client:
        before = await database_bytes(database_url)
        codes: dict[int, int] = {}
        for _ in range(10):
            for _ in range(100):
                answer = (await client.post("/cstp", content=body, headers=headers)).json()
                codes[answer["error"]["code"]] = codes.get(answer["error"]["code"], 0) + 1
            grown = await database_bytes(database_url) - before
            assert grown < 10 * MB, (grown, codes)  # checked as it goes: fails early
    assert codes == {-32602: 500, -32002: 500}
    print(f"\n1,000 refused 1 MB announcements grew the database by {grown:,} bytes")
    rows = await intent_rows(db)
    assert sorted((r.outcome, r.error_code) for r in rows) == sorted(
        [("failed", -32602)] * 500 + [("rate_limited", -32002)] * 500
    )
    marker = {
        "truncated": True,
        "bytes": len(sorted_json(metadata)),
        "sha256": sha256(sorted_json(metadata)),
    }
    assert all(r.metadata_ == marker for r in rows)
    assert max(stored_bytes(r) for r in rows) <= ROW_VALUES_BYTES
    await verify_chain(database_url)
