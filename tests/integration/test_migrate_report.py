"""Servers that start together on a fresh database: each says truthfully what it did. The
one that created the tables says so; the others, which found them made while they waited
for the migration lock, say that instead."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.db import migrate
from support import databases

# Slow: four processes migrating one database together.
pytestmark = pytest.mark.slow

PROCESSES = 4
# What `cstp serve` (and every command that uses the database) runs before it starts, in
# processes that wait for one agreed moment, so that none has a head start.
ENSURE_AT = """
import sys, time
from app.cli.runner import run
from app.cli.schema import ensure_schema
start = float(sys.argv[2])
while time.time() < start:  # a start at one agreed moment (a barrier across processes),
    time.sleep(0.001)  # not a wait for a condition: the processes share nothing else
run(lambda: ensure_schema(sys.argv[1], upgrade_older=True))
"""


@pytest.fixture
async def empty_database(tmp_path: Path) -> AsyncIterator[str]:
    """A database with no tables at all: a new Postgres database, or a SQLite file to be."""
    async with databases.empty_database(tmp_path, "cstp_report") as url:
        yield url


async def test_only_the_process_that_created_the_tables_says_so(empty_database: str) -> None:
    start = time.time() + 4  # after every interpreter has imported the app
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            ENSURE_AT,
            empty_database,
            str(start),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        for _ in range(PROCESSES)
    ]
    async with asyncio.timeout(120):
        finished = await asyncio.gather(*(p.communicate() for p in procs))
    outputs = [out.decode(errors="replace") for out, _ in finished]
    assert [p.returncode for p in procs] == [0] * PROCESSES, "\n".join(outputs)
    head = migrate.head_revision()
    created = [o for o in outputs if "created the tables" in o]
    assert len(created) == 1, outputs
    assert f"(revision {head})" in created[0]
    others = [o for o in outputs if o not in created]
    assert len(others) == PROCESSES - 1
    for other in others:
        # Each either found the tables made (it read the state after they were) and said
        # nothing, or waited for the lock and says another process made them.
        assert other.strip() == "" or "created by another process" in other, other
    assert await migrate.current(empty_database) == head
