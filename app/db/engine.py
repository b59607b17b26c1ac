"""Engines and transactions for SQLite and Postgres.

SQLite is set up to behave like Postgres where it matters: foreign keys on, WAL, and explicit
``BEGIN`` statements issued by SQLAlchemy instead of the driver's implicit ones. Its async
engines run on aiosqlite, with a cursor that needs one thread hand-off per statement
(``sqlite_driver``). Write transactions start with ``BEGIN IMMEDIATE`` and are serialised
in-process by an asyncio lock, taken just before a transaction's first statement, so
concurrent writers queue fairly instead of failing with "database is locked" when a deferred
transaction tries to upgrade its lock.
Reads use a second engine with plain ``BEGIN`` so they never wait for a writer (WAL readers
see the last commit); ``Database.read`` runs short Core reads on a third, synchronous engine
on the event loop's thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    AsyncSessionTransaction,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

from app.observability import spans

from . import sqlite_driver

T = TypeVar("T")


def _sqlite_engine(url: str, begin: str) -> AsyncEngine:
    engine = create_async_engine(
        url,
        pool_size=8,
        max_overflow=8,
        connect_args={"timeout": 30},
        pool_pre_ping=False,
        module=sqlite_driver.dbapi(),
    )
    _set_up_sqlite(engine.sync_engine, begin, busy_ms=30_000)
    return engine


def _replace_closed_connections(engine: AsyncEngine) -> None:
    """A pooled Postgres connection that the server closed (a restart, ``pg_terminate_backend``)
    is replaced when it is checked out, instead of failing the call that gets it.

    asyncpg learns of the close from the event loop as soon as the server's goodbye arrives,
    so asking the connection costs nothing; ``pool_pre_ping`` would instead send a BEGIN, a
    ``;`` and a ROLLBACK to the server at every checkout. What neither can see is a close that
    happens after the checkout: that call fails with a storage error, and SQLAlchemy then
    renews the whole pool."""

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = record.driver_connection
        if driver is None or driver.is_closed():
            raise DisconnectionError("the database server closed this connection")  # retried


def _set_up_sqlite(engine: Engine, begin: str, *, busy_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy issues BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")  # first: the next may have to wait
        # WAL is persistent and set by the migrations; this only matters for a file that was
        # never migrated here, and is a no-op otherwise.
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before it returns, as on Postgres, so an answered write
        # survives a power loss too (NORMAL, in WAL mode, may lose the last commits then).
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)


class SerializedWriteSession(AsyncSession):
    """A SQLite write session that takes the process's write lock just before its first
    statement, not when the call starts: the work a handler does before it touches the
    database (embedding, searching the index, evaluating rules) then holds no writer up."""

    write_lock: asyncio.Lock | None = None
    _holds_lock = False

    async def take_write_lock(self) -> None:
        if not self._holds_lock and self.write_lock is not None:
            await self.write_lock.acquire()
            self._holds_lock = True

    def release_write_lock(self) -> None:
        if self._holds_lock and self.write_lock is not None:
            self._holds_lock = False
            self.write_lock.release()

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().execute(*args, **kwargs)

    async def scalar(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().scalar(*args, **kwargs)

    async def scalars(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().scalars(*args, **kwargs)

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().get(*args, **kwargs)

    async def flush(self, *args: Any, **kwargs: Any) -> None:
        await self.take_write_lock()
        await super().flush(*args, **kwargs)

    async def refresh(self, *args: Any, **kwargs: Any) -> None:
        await self.take_write_lock()
        await super().refresh(*args, **kwargs)

    async def connection(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().connection(*args, **kwargs)

    async def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_write_lock()
        return await super().run_sync(*args, **kwargs)

    def begin_nested(self) -> AsyncSessionTransaction:
        return _LockedSavepoint(self, nested=True)


class _LockedSavepoint(AsyncSessionTransaction):
    """A SAVEPOINT is a statement too: take the write lock before emitting it."""

    __slots__ = ()

    async def start(self, is_ctxmanager: bool = False) -> AsyncSessionTransaction:
        session = self.session
        assert isinstance(session, SerializedWriteSession)
        await session.take_write_lock()
        return await super().start(is_ctxmanager)


class Database:
    """Owns the engines; hands out one transaction at a time per caller."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            self.write_engine = _sqlite_engine(url, "BEGIN IMMEDIATE")
            self.read_engine = _sqlite_engine(url, "BEGIN")
            # Short reads on the event loop's own thread (see ``read``). WAL readers never
            # wait for a writer, so the busy timeout is only a bound for the rare recovery.
            # (An in-memory database is private to its connection: no second engine then.)
            self._loop_reads: Engine | None = None
            if ":memory:" not in url:
                self._loop_reads = create_engine(
                    url.replace("sqlite+aiosqlite:", "sqlite:", 1),
                    pool_size=2,
                    max_overflow=8,
                    connect_args={"check_same_thread": False},
                )
                _set_up_sqlite(self._loop_reads, "BEGIN", busy_ms=5_000)
        else:
            # asyncpg prepares every statement and keeps it per connection, and Postgres may
            # then keep a generic plan made with the statistics of that moment. A server that
            # had run its searches at 1,000 decisions ran them 2-3x slower once the tables
            # held 10,000, while a fresh server on the same data did not (docs/PERFORMANCE.md).
            # Custom plans are made per execution, with the statistics of the day.
            self.write_engine = create_async_engine(
                url,
                pool_size=10,
                max_overflow=10,
                connect_args={"server_settings": {"plan_cache_mode": "force_custom_plan"}},
            )
            _replace_closed_connections(self.write_engine)
            self.read_engine = self.write_engine
            self._loop_reads = None
        self._write_sessions = async_sessionmaker(
            self.write_engine,
            expire_on_commit=False,
            class_=SerializedWriteSession if self.is_sqlite else AsyncSession,
        )
        self._read_sessions = async_sessionmaker(self.read_engine, expire_on_commit=False)
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self.is_sqlite else None
        system = db_system(self.write_engine.dialect.name)
        self._read_attributes = {"db.system.name": system, "db.operation.name": "SELECT"}

    @asynccontextmanager
    async def transaction(self, *, write: bool = True) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        if write and self._write_lock is not None:
            session = self._write_sessions()
            assert isinstance(session, SerializedWriteSession)
            session.write_lock = self._write_lock
            try:
                async with session, session.begin():
                    yield session
                    if session.new or session.dirty or session.deleted:
                        await session.take_write_lock()  # the commit will flush them
            finally:
                session.release_write_lock()
        else:
            async with self._session(write=write) as session:
                yield session

    async def read(self, work: Callable[[Connection], T], session: AsyncSession | None = None) -> T:
        """Run ``work`` (Core statements on a plain connection) in one transaction.

        On SQLite ``work`` runs right here, on the event loop's thread, through the standard
        ``sqlite3`` driver: a search's few indexed reads take a fraction of a millisecond
        there, less than a thread hand-off to aiosqlite's worker for each statement. So ``work``
        must be a few short indexed queries; a write session is never used for it, so a
        search never holds the write lock. On Postgres it runs on an asyncpg connection: the
        caller's ``session`` when given (its transaction sees the same committed rows, and a
        second connection would cost a checkout, a BEGIN and a COMMIT), else one of its own.
        """
        with spans.span("SELECT", self._read_attributes):
            if self._loop_reads is not None:
                with self._loop_reads.connect() as conn, conn.begin():
                    return work(conn)
            if session is not None and not self.is_sqlite:
                return await session.run_sync(lambda sync_session: work(sync_session.connection()))
            async with self.read_engine.connect() as aconn, aconn.begin():
                return await aconn.run_sync(work)

    @asynccontextmanager
    async def _session(self, *, write: bool) -> AsyncIterator[AsyncSession]:
        factory = self._write_sessions if write else self._read_sessions
        async with factory() as session, session.begin():
            yield session

    async def ping(self) -> None:
        async with self.read_engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def schema_revision(self) -> str | None:
        """The revision the database records as migrated to (``alembic_version``), read in a
        read transaction of its own."""
        async with self.transaction(write=False) as session:
            revision = await session.scalar(text("SELECT version_num FROM alembic_version"))
            return None if revision is None else str(revision)

    async def analyze(self, *tables: str) -> None:
        """Refresh Postgres' planner statistics of ``tables`` after a bulk load. Without them
        (autovacuum off, or not yet run) the planner takes a freshly filled table for nearly
        empty, and a keyword search joined every decision in a nested loop
        (docs/performance-history.md, "The console"). SQLite's planner keeps no statistics
        unless asked to, and never has been here: nothing to do."""
        if self.is_sqlite:
            return
        async with self.write_engine.begin() as conn:
            for table in tables:
                await conn.execute(text(f'ANALYZE "{table}"'))

    async def dispose(self) -> None:
        if self._loop_reads is not None:
            self._loop_reads.dispose()
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()


# ---------------------------------------------------------------- tracing

_COMMIT_SPAN = "cstp.trace.commit"  # where a session keeps its commit's span
_tracing_commits = False


def db_system(dialect: str) -> str:
    """The OpenTelemetry conventions' ``db.system.name`` of a SQLAlchemy dialect."""
    return "postgresql" if dialect.startswith("postgres") else dialect


def trace_commits() -> None:
    """From now on, a ``COMMIT`` span around each commit made while a traced call runs (from
    ``before_commit`` to ``after_commit``), in that call's trace. Installed once, when tracing
    first starts (app.asgi); first among the sessions' listeners, so that it holds the audit
    chain's own writes at commit."""
    global _tracing_commits
    if _tracing_commits:
        return
    event.listen(Session, "before_commit", _commit_started, insert=True)
    event.listen(Session, "after_commit", _commit_ended)
    event.listen(Session, "after_rollback", _commit_failed)
    _tracing_commits = True


def _commit_started(session: Session) -> None:
    if session.in_nested_transaction():
        return
    # ``bind``, not ``get_bind()``, which raises without one: nothing here may fail a commit
    dialect = session.bind.dialect.name if session.bind is not None else "other_sql"
    attributes = {"db.system.name": db_system(dialect), "db.operation.name": "COMMIT"}
    made = spans.started("COMMIT", attributes)
    if made is not None:
        session.info[_COMMIT_SPAN] = made


def _commit_ended(session: Session) -> None:
    made = session.info.pop(_COMMIT_SPAN, None)
    if made is not None:
        spans.ended(made)


def _commit_failed(session: Session) -> None:
    made = session.info.pop(_COMMIT_SPAN, None)
    if made is not None:  # rolled back once it had begun to commit
        spans.ended(made, ok=False)
