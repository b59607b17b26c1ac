"""Two writers on one database keep one chain: each appends after what the other wrote.

On SQLite each engine appends after the head its own last commit left, without reading it
(app.audit.chain); when the other engine appended in between, that append must notice, read
the head and link after it. Two apps on one database file are two such engines, as a
``cstp import`` beside a running server would be. The same test runs on Postgres, where every
append reads the head under the advisory lock.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError
from test_audit_chain import coverage, decision, settings_for, verify

from app.asgi import create_app
from app.audit.canonical import Covered
from app.audit.chain import GENESIS, append, use_key
from app.db.engine import Database
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.databases import run_sql


async def test_two_writers_take_turns_on_one_chain(
    database_url: str, embedder: Embedder, tmp_path: Path
) -> None:
    first = create_app(settings_for(database_url, tmp_path / "a"), embedder=embedder)
    second = create_app(settings_for(database_url, tmp_path / "b"), embedder=embedder)
    async with serve_app(first) as a, serve_app(second) as b:
        writers = {"a": Rpc(a), "b": Rpc(b)}
        # turns that leave each writer's remembered head behind the other's, and some that don't
        turns = "aabababbbaab"
        for n, who in enumerate(turns):
            rpc = writers[who]
            await rpc.ok("cstp.checkGuardrails", {"action": {"description": f"check {n}"}})
            if n % 3 == 0:
                await rpc.ok("cstp.recordDecision", decision(n))
            if n % 4 == 1:
                await rpc.ok("cstp.announceIntent", {"intent": f"announce {n}"})
        # and both at once
        await asyncio.gather(
            *(
                writers["ab"[n % 2]].ok(
                    "cstp.checkGuardrails", {"action": {"description": f"together {n}"}}
                )
                for n in range(20)
            )
        )
    entries, rows = await coverage(database_url)
    assert entries == rows >= len(turns) + 4 + 3 + 20  # every row written has its entry
    chained = await run_sql(
        database_url, "SELECT seq, prev_hash, hash FROM audit_chain ORDER BY seq"
    )
    assert [r["seq"] for r in chained] == list(range(1, entries + 1))
    assert chained[0]["prev_hash"] == GENESIS
    assert all(n["prev_hash"] == p["hash"] for p, n in itertools.pairwise(chained))
    code, found, output = await verify(database_url)
    assert (code, found) == (0, []), output


async def test_a_row_chained_twice_fails_the_commit_and_the_chain_goes_on_after_it(
    database_url: str,
) -> None:
    """A constraint of the chain itself (one entry per row) is not a stale head: the commit
    fails with nothing of the transaction stored, and the next append links after the last
    committed entry, not after the refused ones."""
    db = Database(database_url)
    use_key(db.write_engine, None)
    try:
        async with db.transaction() as session:
            append(session, Covered("intents", "row-1", "1" * 64))
        with pytest.raises(IntegrityError):
            async with db.transaction() as session:
                append(session, Covered("intents", "row-2", "2" * 64))
                append(session, Covered("intents", "row-2", "3" * 64))
        async with db.transaction() as session:
            append(session, Covered("intents", "row-3", "4" * 64))
    finally:
        await db.dispose()
    chained = await run_sql(
        database_url, "SELECT seq, row_id, prev_hash, hash FROM audit_chain ORDER BY seq"
    )
    assert [(r["seq"], r["row_id"]) for r in chained] == [(1, "row-1"), (2, "row-3")]
    assert chained[0]["prev_hash"] == GENESIS and chained[1]["prev_hash"] == chained[0]["hash"]
