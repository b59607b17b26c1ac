"""aiosqlite with one thread hand-off per statement instead of three or four.

SQLAlchemy's aiosqlite adapter sends each step of a statement to aiosqlite's worker thread
on its own: make a cursor, execute, fetch the rows, close the cursor. Each hand-off is a
queue put, a wake-up of the worker and a wake-up of the event loop, paid with the write lock
held. The cursor here runs all the steps of a statement in one function on the worker thread
and keeps what SQLAlchemy asks afterwards (description, rows, rowcount, lastrowid): a
transaction of three statements takes 6 hand-offs instead of 15 (BEGIN, the statements,
COMMIT, the pool's reset). Everything else is SQLAlchemy's adapter unchanged: the same
worker thread owns the ``sqlite3`` connection, and its errors reach SQLAlchemy the same way.

Used for the server's SQLite engines through ``create_async_engine(url, module=dbapi())``.
Server-side cursors (streamed results) keep the stock adapter's cursor.
"""

from __future__ import annotations

import collections
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiosqlite
from sqlalchemy.connectors.asyncio import AsyncAdapt_dbapi_connection
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.util import EMPTY_DICT
from sqlalchemy.util.concurrency import await_

# (description, rows or None, rowcount, lastrowid) of one statement
_Outcome = tuple[Any, list[Any] | None, int, int | None]


def _run(conn: sqlite3.Connection, operation: str, parameters: Any, many: bool) -> _Outcome:
    """One statement from start to end, on aiosqlite's worker thread."""
    cursor = conn.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else None
        return description, rows, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneHopCursor(AsyncAdapt_aiosqlite_cursor):
    __slots__ = ("_arraysize", "_description", "_lastrowid", "_rowcount")

    def __init__(self, adapt_connection: AsyncAdapt_dbapi_connection) -> None:
        # No cursor on the worker thread until a statement runs (the stock one makes it here).
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = None  # type: ignore[assignment]  # no worker-side cursor: nothing reads it
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None
        self._arraysize = 1

    @property
    def description(self) -> Any:
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> int:
        return self._lastrowid  # type: ignore[return-value]  # sqlite3's may be None; the base says int

    @property
    def arraysize(self) -> int:
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value

    async def _statement(self, operation: Any, parameters: Any, many: bool) -> None:
        # SQLAlchemy types the connection as any async DBAPI's; this dialect's is aiosqlite's,
        # whose _execute (run a function on its worker thread) carries no annotations.
        connection = cast(aiosqlite.Connection, self._connection)
        execute = cast(Callable[..., Awaitable[_Outcome]], connection._execute)
        async with self._adapt_connection._execute_mutex:
            outcome = await execute(_run, connection._conn, operation, parameters, many)
        self._description, rows, self._rowcount, self._lastrowid = outcome
        self._rows = collections.deque(rows) if rows is not None else collections.deque()

    async def _execute_async(self, operation: Any, parameters: Any) -> Any:
        await self._statement(operation, parameters, False)

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> Any:
        await self._statement(operation, seq_of_parameters, True)

    async def _async_soft_close(self) -> None:
        return None  # nothing is open on the worker thread

    def close(self) -> None:
        self._rows.clear()

    def nextset(self) -> None:
        raise NotImplementedError("sqlite3 has no nextset")

    def setinputsizes(self, *inputsizes: Any) -> None:
        return None


def _work_then_commit(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], None]) -> None:
    work(conn)
    conn.commit()


class OneHopConnection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ("_before_commit",)
    _cursor_cls = OneHopCursor

    def __init__(self, dbapi: Any, connection: Any) -> None:
        super().__init__(dbapi, connection)
        self._before_commit: Callable[[sqlite3.Connection], None] | None = None

    def run_before_commit(self, work: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``work`` on the worker thread right before this transaction's COMMIT, in the
        COMMIT's own hand-off (a statement saved, with the write lock held). An exception from
        ``work`` is the commit's, and nothing is committed; a rollback drops ``work``."""
        self._before_commit = work

    def commit(self) -> None:
        work, self._before_commit = self._before_commit, None
        if work is None:
            super().commit()
            return
        connection = cast(aiosqlite.Connection, self._connection)
        execute = cast(Callable[..., Awaitable[None]], connection._execute)
        try:
            await_(execute(_work_then_commit, connection._conn, work))
        except Exception as error:
            self._handle_exception(error)

    def rollback(self) -> None:
        self._before_commit = None
        super().rollback()


class OneHopDBAPI(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> OneHopConnection:
        stock = super().connect(*arg, **kw)  # connects (and marks the thread daemon) as ever
        return OneHopConnection(self, stock._connection)


def dbapi() -> OneHopDBAPI:
    return OneHopDBAPI(aiosqlite, sqlite3)
