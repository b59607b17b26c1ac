"""Alembic, driven from Python: upgrade, downgrade, current revision and drift check.

Alembic is the only way the schema changes. These helpers share one connection with Alembic
(the documented "connection sharing" pattern) so they work from async code and the CLI alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from .models import Base

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


async def _with_connection(url: str, work: Callable[[Connection], Any]) -> Any:
    ensure_sqlite_dir(url)
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
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


async def upgrade(url: str, revision: str = "head") -> None:
    await _with_connection(url, _run(lambda cfg: command.upgrade(cfg, revision)))
    if url.startswith("sqlite"):
        await _with_connection(url, _use_wal)


def _use_wal(connection: Connection) -> None:
    """Put the SQLite file in WAL mode here, before the server's connections open it: the mode
    is kept in the file, and switching it later needs an exclusive lock that a busy server's
    connections would fight over (their own ``journal_mode=WAL`` is then a no-op)."""
    connection.exec_driver_sql("PRAGMA journal_mode=WAL")


async def downgrade(url: str, revision: str) -> None:
    await _with_connection(url, _run(lambda cfg: command.downgrade(cfg, revision)))


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current(url: str) -> str | None:
    return await _with_connection(url, _current)  # type: ignore[no-any-return]


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def drift(url: str) -> list[Any]:
    """Differences between the models and the database's schema (empty when in sync)."""
    return await _with_connection(url, _drift)  # type: ignore[no-any-return]
