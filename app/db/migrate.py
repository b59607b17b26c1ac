"""Alembic, driven from Python: upgrade, downgrade, current revision and drift check.

Alembic is the only way the schema changes. These helpers share one connection with Alembic
(the documented "connection sharing" pattern) so they work from async code and the CLI alike.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from . import fulltext, readers
from .models import Base

T = TypeVar("T")

#: The migration scripts ship inside the package (package data), so an installed server can
#: migrate its database. The repository's alembic.ini points here too, for developers.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    """Alembic's settings, built in code: an installed package has no alembic.ini."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))  # ini syntax
    return cfg


@functools.cache
def head_revision() -> str:
    """The newest migration (read from disk once: /ready asks on every probe)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def ensure_sqlite_dir(url: str) -> None:
    """Create the folder of a SQLite file, so a fresh data dir just works."""
    prefix = "sqlite+aiosqlite:///"
    if url.startswith(prefix) and ":memory:" not in url:
        Path(url[len(prefix) :]).parent.mkdir(parents=True, exist_ok=True)


# Migrations run under a database-wide lock, so that any number of processes and hosts may
# start (and upgrade) together: the first migrates, the others then find the schema at head.
# Postgres: a transaction-level advisory lock under this key (the bytes of "cstp").
MIGRATION_LOCK_KEY = 0x63737470
# SQLite: the write lock (BEGIN IMMEDIATE), waited for up to this long, as long as a big
# migration by another process may take.
SQLITE_LOCK_WAIT_SECONDS = 600.0


async def _with_connection(url: str, work: Callable[[Connection], T], *, locked: bool = False) -> T:
    ensure_sqlite_dir(url)
    sqlite = url.startswith("sqlite")
    # SQLite waits for another process's lock instead of failing after 5 s; with ``locked``
    # the driver leaves transactions to us (isolation_level None), so that BEGIN IMMEDIATE
    # takes the write lock before Alembic reads the revision.
    options: dict[str, Any] = {}
    if sqlite:
        options["timeout"] = SQLITE_LOCK_WAIT_SECONDS
        if locked:
            options["isolation_level"] = None
    engine = create_async_engine(url, connect_args=options)
    try:
        async with engine.connect() as conn:
            if locked:
                await conn.exec_driver_sql(
                    "BEGIN IMMEDIATE"
                    if sqlite
                    else f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
                )
            result = await conn.run_sync(work)
            await conn.commit()
            return result
    finally:
        await engine.dispose()


def _run(action: Callable[[Config], None]) -> Callable[[Connection], None]:
    def work(connection: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        action(cfg)

    return work


async def upgrade(url: str, revision: str = "head") -> str | None:
    """Upgrade to ``revision``; returns the revision the database was at, read under the
    migration lock: None only in the one process that created the tables, even when several
    found none before they waited for the lock."""
    apply = _run(lambda cfg: command.upgrade(cfg, revision))

    def work(connection: Connection) -> str | None:
        before = _current(connection)
        apply(connection)
        return before

    before = await _with_connection(url, work, locked=True)
    if url.startswith("sqlite"):
        await _with_connection(url, _use_wal)
    return before


def _use_wal(connection: Connection) -> None:
    """Put the SQLite file in WAL mode here, before the server's connections open it: the mode
    is kept in the file, and switching it later needs an exclusive lock that a busy server's
    connections would fight over (their own ``journal_mode=WAL`` is then a no-op).

    The switch fails at once, without waiting, while another process holds a lock (as when
    several start together): it is tried again, briefly, until one of them has made it."""
    deadline = time.monotonic() + SQLITE_LOCK_WAIT_SECONDS
    while str(connection.exec_driver_sql("PRAGMA journal_mode").scalar()).lower() != "wal":
        try:
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")
        except OperationalError as exc:
            if "locked" not in str(exc.orig) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def downgrade(url: str, revision: str) -> None:
    await _with_connection(url, _run(lambda cfg: command.downgrade(cfg, revision)), locked=True)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current(url: str) -> str | None:
    return await _with_connection(url, _current)


def include_name(name: str | None, type_: str, _parent_names: Any) -> bool:
    """What the drift check and autogenerate compare: everything but the keyword index's
    tables and index, which each database builds its own way and no model describes
    (``app/db/fulltext.py``), and the list of auditors' roles that only Postgres has
    (``app/db/readers.py``)."""
    if type_ == "table" and name == readers.TABLE:
        return False
    return not (type_ in ("table", "index") and fulltext.owned(name))


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "include_name": include_name}
    )
    return list(compare_metadata(context, Base.metadata))


async def drift(url: str) -> list[Any]:
    """Differences between the models and the database's schema (empty when in sync)."""
    return await _with_connection(url, _drift)
