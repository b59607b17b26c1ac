"""Servers that start together on a fresh database: migrations run under a database-wide lock
(a Postgres advisory lock, SQLite's write lock), so every process comes up at head."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.db import migrate
from support import databases
from support.databases import run_sql

# Slow: six processes migrating one database together:
# the fast loop (-m "not slow") leaves it out.
pytestmark = pytest.mark.slow

PROCESSES = 6
# Each process waits for the same moment, then upgrades: no process has a head start.
UPGRADE_AT = """
import asyncio, sys, time
from app.db import migrate
start = float(sys.argv[2])
while time.time() < start:  # a start at one agreed moment (a barrier across processes),
    time.sleep(0.001)  # not a wait for a condition: the processes share nothing else
asyncio.run(migrate.upgrade(sys.argv[1]))
"""


@pytest.fixture
async def empty_database(tmp_path: Path) -> AsyncIterator[str]:
    """A database with no tables at all: a new Postgres database, or a SQLite file to be."""
    async with databases.empty_database(tmp_path, "cstp_race") as url:
        yield url


async def test_processes_upgrading_a_fresh_database_together_all_succeed(
    empty_database: str,
) -> None:
    start = time.time() + 4  # after every interpreter has imported the app
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            UPGRADE_AT,
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
    assert await migrate.current(empty_database) == migrate.head_revision()
    assert await migrate.drift(empty_database) == []
    versions = await run_sql(empty_database, "SELECT version_num FROM alembic_version")
    assert versions == [{"version_num": migrate.head_revision()}]


async def test_cstp_db_upgrade_commands_started_together_all_succeed(
    empty_database: str, tmp_path: Path
) -> None:
    """The command as an operator (or each replica's `migrate` step) runs it: each reads the
    schema's state before it takes the lock, and that read must not trip on a schema another
    process is creating."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    env.update(CSTP_DATABASE_URL=empty_database, CSTP_DATA_DIR=str(tmp_path / "data"))
    procs = [
        await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("cstp")),
            "db",
            "upgrade",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    async with asyncio.timeout(120):
        finished = await asyncio.gather(*(p.communicate() for p in procs))
    report = "\n".join(f"{out.decode()}{err.decode()}" for out, err in finished)
    assert [p.returncode for p in procs] == [0] * 4, report
    assert "Traceback" not in report, report
    assert await migrate.current(empty_database) == migrate.head_revision()
    assert await migrate.drift(empty_database) == []
