"""The SQLite engines' one-hand-off cursor (app.db.sqlite_driver), through ``Database``:
what SQLAlchemy reads off a cursor is right, errors arrive as before, and a statement costs
one trip to aiosqlite's worker thread."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from app.db.engine import Database
from app.db.sqlite_driver import OneHopConnection

meta = MetaData()
items = Table(
    "items",
    meta,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(32), unique=True, nullable=False),
    Column("size", Integer),
)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite+aiosqlite:///{tmp_path / 'driver.sqlite'}")
    async with database.write_engine.begin() as conn:
        await conn.run_sync(meta.create_all)
    yield database
    await database.dispose()


@pytest.fixture
def handoffs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each function sent to aiosqlite's worker thread, by name (observed, still run)."""
    seen: list[str] = []
    original = aiosqlite.Connection._execute

    async def counting(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counting)
    return seen


async def test_rows_ids_and_counts_are_what_sqlite_reports(db: Database) -> None:
    async with db.transaction() as session:
        await session.execute(insert(items), [{"name": f"n{i}", "size": i} for i in range(5)])
        one = await session.execute(insert(items).values(name="single", size=99))
        assert one.inserted_primary_key == (6,)
        changed = await session.execute(update(items).where(items.c.size >= 3).values(size=0))
        assert changed.rowcount == 3  # sizes 3, 4 and 99
        returned = await session.execute(
            insert(items).values(name="back", size=7).returning(items.c.id, items.c.name)
        )
        assert returned.all() == [(7, "back")]
    async with db.transaction(write=False) as session:
        rows = await session.execute(select(items.c.name, items.c.size).order_by(items.c.id))
        assert rows.all() == [
            ("n0", 0),
            ("n1", 1),
            ("n2", 2),
            ("n3", 0),
            ("n4", 0),
            ("single", 0),
            ("back", 7),
        ]
        result = await session.execute(select(items.c.id).where(items.c.name == "nobody"))
        assert result.first() is None
        raw_sql = await session.execute(text("SELECT name FROM items ORDER BY id LIMIT 2"))
        assert [r.name for r in raw_sql] == ["n0", "n1"]


async def test_a_failing_statement_raises_and_rolls_back_the_transaction(db: Database) -> None:
    with pytest.raises(IntegrityError):
        async with db.transaction() as session:
            await session.execute(insert(items).values(name="kept?", size=1))
            await session.execute(insert(items).values(name="kept?", size=2))
    async with db.transaction() as session:  # the pooled connection still works
        await session.execute(insert(items).values(name="after", size=3))
    async with db.transaction(write=False) as session:
        names = (await session.execute(select(items.c.name))).scalars().all()
    assert names == ["after"]


async def test_each_statement_is_one_trip_to_the_worker_thread(
    db: Database, handoffs: list[str]
) -> None:
    async with db.transaction() as session:  # warm the pool: connecting has trips of its own
        await session.execute(select(items.c.id))
    handoffs.clear()
    async with db.transaction() as session:
        await session.execute(insert(items), [{"name": "a", "size": 1}, {"name": "b", "size": 2}])
        await session.execute(insert(items).values(name="c", size=3))
        found = (await session.execute(select(items.c.name).order_by(items.c.id))).scalars()
        assert found.all() == ["a", "b", "c"]
    # BEGIN IMMEDIATE and the three statements (the stock cursor made 3-4 trips each), the
    # COMMIT, and the pool's reset of the connection it gets back
    assert handoffs == ["_run"] * 4 + ["commit", "rollback"]


async def test_every_connection_commits_to_disk_before_it_returns(db: Database) -> None:
    """synchronous=FULL (2) on all three engines: in WAL mode, the default NORMAL lets a power
    loss take back commits that were already answered."""
    async with db.write_engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 2
    async with db.read_engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 2
    assert await db.read(lambda conn: conn.execute(text("PRAGMA synchronous")).scalar()) == 2


async def driver_of(session: Any) -> OneHopConnection:
    raw = await (await session.connection()).get_raw_connection()
    driver = raw.dbapi_connection
    assert isinstance(driver, OneHopConnection)
    return driver


def insert_named(name: str) -> Any:
    def work(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO items (name, size) VALUES (?, 0)", (name,))

    return work


async def names_in(db: Database) -> list[str]:
    async with db.transaction(write=False) as session:
        return list((await session.execute(select(items.c.name).order_by(items.c.id))).scalars())


async def test_work_before_commit_runs_in_the_commits_own_trip(
    db: Database, handoffs: list[str]
) -> None:
    async with db.transaction() as session:  # warm the pool
        await session.execute(select(items.c.id))
    handoffs.clear()
    async with db.transaction() as session:
        await session.execute(insert(items).values(name="statement", size=1))
        (await driver_of(session)).run_before_commit(insert_named("at commit"))
    assert handoffs == ["_run", "_run", "_work_then_commit", "rollback"]
    assert await names_in(db) == ["statement", "at commit"]


async def test_work_that_fails_fails_the_commit_and_nothing_is_committed(db: Database) -> None:
    with pytest.raises(IntegrityError):
        async with db.transaction() as session:
            await session.execute(insert(items).values(name="dup", size=1))
            (await driver_of(session)).run_before_commit(insert_named("dup"))
    assert await names_in(db) == []
    async with db.transaction() as session:  # the pooled connection still works
        await session.execute(insert(items).values(name="after", size=3))
    assert await names_in(db) == ["after"]


async def test_a_rolled_back_transaction_drops_its_work(db: Database) -> None:
    with pytest.raises(RuntimeError):
        async with db.transaction() as session:
            await session.execute(insert(items).values(name="rolled back", size=1))
            (await driver_of(session)).run_before_commit(insert_named("never"))
            raise RuntimeError("the call failed")
    async with db.transaction() as session:  # likely the same pooled connection
        await session.execute(insert(items).values(name="next", size=2))
    assert await names_in(db) == ["next"]
