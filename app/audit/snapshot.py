"""One consistent read of a database, for the ``cstp audit`` and ``cstp guardrails replay``
commands, which may run against a live server's database.

Postgres: a REPEATABLE READ, READ ONLY transaction, so every statement sees the database as
of the first one. SQLite: an explicit ``BEGIN`` (the driver would otherwise run each SELECT
on its own), which in WAL mode reads one snapshot and never blocks the server's writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

T = TypeVar("T")


def _engine(url: str) -> AsyncEngine:
    if make_url(url).get_backend_name() != "sqlite":
        return create_async_engine(
            url, isolation_level="REPEATABLE READ", execution_options={"postgresql_readonly": True}
        )
    engine = create_async_engine(url, connect_args={"timeout": 60})

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # BEGIN is ours

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


async def read(url: str, work: Callable[[Connection], T]) -> T:
    """``work(connection)`` in one read-only snapshot of the database at ``url``."""
    engine = _engine(url)
    try:
        async with engine.connect() as conn, conn.begin():
            return await conn.run_sync(work)
    finally:
        await engine.dispose()
