"""What every ``cstp`` command shares: failures as one line, logging, and the database's state.

- ``CstpGroup`` runs each command. An expected failure (a setting, a file, the database or
  the vector index out of reach, a migration target that does not exist) is one line on
  stderr and exit code 1; any other exception is a bug: one line that names its type, and
  the traceback only with ``cstp --debug`` or ``CSTP_LOG_LEVEL=DEBUG``.
- Log records are one line each on stderr too (no traceback), except in debug mode.
- ``ensure_schema`` brings the database to what a command needs: a database with no tables
  yet (a fresh install) is migrated, as ``cstp serve`` does; a database at an older
  revision is left to the operator (``cstp db upgrade``), and one at a revision this version
  does not know (migrated by a newer cstp) is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from .config import ConfigError, Settings

UPGRADE_HINT = "run `cstp db upgrade` first"


class Unavailable(Exception):
    """Something the command needs is out of reach; the message says what and why, in one
    line, and the cause is chained (shown with --debug)."""


class Failure(click.ClickException):
    """An expected failure: one line on stderr ("Error: ..."), exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """The first non-empty line of ``text``, stripped."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def redact(url: str) -> str:
    """``scheme://user:password@host/db`` -> ``scheme://***@host/db``."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def debugging(ctx: click.Context | None = None) -> bool:
    """``cstp --debug`` or ``CSTP_LOG_LEVEL=DEBUG``: tracebacks and debug logs wanted."""
    if (os.environ.get("CSTP_LOG_LEVEL") or "").strip().upper() == "DEBUG":
        return True
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


# ---- failures -------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """The most telling one-line reason of ``exc``: the driver's own error for a SQLAlchemy
    one (without the SQL), the OS's words for an OSError."""
    from sqlalchemy.exc import DBAPIError

    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if isinstance(exc, OSError) and exc.strerror:
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        return f"{exc.strerror}: {exc.filename}" if exc.filename is not None else exc.strerror
    return one_line(str(exc)) or type(exc).__name__


def describe(exc: BaseException) -> str | None:
    """One line for an expected failure, None for a bug."""
    from alembic.util import CommandError
    from sqlalchemy.exc import (
        DisconnectionError,
        InterfaceError,
        OperationalError,
    )
    from sqlalchemy.exc import (
        TimeoutError as PoolTimeout,
    )

    from .guardrails.rules import RuleFileError
    from .search.embedder import EmbedderError
    from .search.types import IndexUnavailable

    if isinstance(exc, Unavailable | ConfigError | RuleFileError | EmbedderError):
        return one_line(str(exc))
    if isinstance(exc, CommandError):  # e.g. a migration target that does not exist
        return f"migration: {one_line(str(exc))}"
    if isinstance(exc, IndexUnavailable):
        where = os.environ.get("CSTP_CHROMA_URL")
        cause = _reason(exc.__cause__) if exc.__cause__ is not None else "closed"
        if where:
            return (
                f"the vector index (Chroma at {redact(where)}) is unavailable: {cause}; "
                "check that the server runs and CSTP_CHROMA_URL"
            )
        return f"the vector index is unavailable: {cause}"
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout):
        return f"database error: {_reason(exc)}"
    if isinstance(exc, OSError):
        return _reason(exc)
    return None


class CstpGroup(click.Group):
    """The ``cstp`` group: every command runs here, so failures are handled in one place."""

    def invoke(self, ctx: click.Context) -> Any:
        handler = _install_logging(debugging(ctx))
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if debugging(ctx):
                raise
            line = describe(exc)
            if line is None:
                line = f"internal error ({type(exc).__name__}); run with --debug for the traceback"
            raise Failure(line) from None
        finally:
            logging.getLogger().removeHandler(handler)


# ---- logging --------------------------------------------------------------------------------


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a record comes (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never fail the command
            self.handleError(record)


class _OneLine(logging.Formatter):
    """``warning: <message>`` on one line; an exception adds its one-line description."""

    def format(self, record: logging.LogRecord) -> str:
        message = one_line(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += f" ({describe(exc) or type(exc).__name__})"
        return f"{record.levelname.lower()}: {message}"


def _install_logging(debug: bool) -> logging.Handler:
    """A stderr handler on the root logger for one command: one line per record at ERROR (or
    CSTP_LOG_LEVEL), full records with tracebacks at DEBUG. ``serve`` replaces it with the
    server's own logging. ERROR by default: what the server logs as a warning (a file not
    imported, an event that failed) a command reports in its own output already."""
    name = "DEBUG" if debug else (os.environ.get("CSTP_LOG_LEVEL") or "ERROR").strip().upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        level = logging.ERROR
    handler = _Stderr(level)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s") if debug else _OneLine()
    )
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or level < root.level:
        root.setLevel(level)
    return handler


# ---- the database's state -------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaState:
    present: bool  # False: a SQLite file that does not exist yet (nothing was opened)
    revision: str | None  # alembic_version's revision
    tables: tuple[str, ...]  # the tables besides alembic_version

    @property
    def empty(self) -> bool:
        return self.revision is None and not self.tables


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


async def schema_state(url: str) -> SchemaState:
    """The revision and tables of the database at ``url``, without creating anything."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import inspect
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import create_async_engine

    path = sqlite_path(url)
    if path is not None and not path.exists():
        return SchemaState(present=False, revision=None, tables=())

    def read(connection: Any) -> SchemaState:
        tables = tuple(
            sorted(t for t in inspect(connection).get_table_names() if t != "alembic_version")
        )
        revision = MigrationContext.configure(connection).get_current_revision()
        return SchemaState(present=True, revision=revision, tables=tables)

    # SQLite: wait for a migration another process is committing, as migrate's own do.
    engine = create_async_engine(url, connect_args={"timeout": 60} if path is not None else {})
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    except (OSError, DBAPIError) as exc:
        raise Unavailable(f"cannot open the database {redact(url)}: {_reason(exc)}") from exc
    finally:
        await engine.dispose()


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    from .db import migrate

    script = ScriptDirectory.from_config(migrate.alembic_config())
    return {s.revision for s in script.walk_revisions()}


def schema_problem(url: str, state: SchemaState) -> str | None:
    """Why no command but ``cstp db upgrade`` could use this database as it is: it holds
    tables but no revision (not a CSTP database), or a revision this version does not know
    (a newer cstp migrated it). None when neither."""
    from .db import migrate

    if state.revision is None and state.tables:
        shown = ", ".join(state.tables[:3]) + (", ..." if len(state.tables) > 3 else "")
        return (
            f"the database {redact(url)} holds tables ({shown}) but no migration revision: "
            "point CSTP_DATABASE_URL at a CSTP database or an empty one"
        )
    if state.revision is not None and state.revision not in known_revisions():
        head = migrate.head_revision()
        return (
            f"the database is at revision {state.revision}, which this version of cstp "
            f"does not know (its newest is {head}): use the newer cstp that migrated it, "
            f"or downgrade with that one first (`cstp db downgrade {head}`)"
        )
    return None


async def ensure_schema(
    url: str, *, migrate_empty: bool = True, upgrade_older: bool = False
) -> None:
    """Make sure the database at ``url`` is at the newest revision before a command uses it.

    A database with no tables (or no file yet) is migrated when ``migrate_empty`` (its
    folder created first), and one at an older revision when ``upgrade_older`` (``serve``);
    any other state but the newest revision raises ``Failure`` naming the command that fixes
    it. A database out of reach raises ``Unavailable``."""
    from .db import migrate

    state = await schema_state(url)
    head = migrate.head_revision()
    if state.revision == head:
        return
    problem = schema_problem(url, state)
    if problem:
        raise Failure(problem)
    if state.empty and not migrate_empty:
        raise Failure(f"the database {redact(url)} has no tables yet: run `cstp db upgrade`")
    if not state.empty and not upgrade_older:
        raise Failure(
            f"the database is at revision {state.revision}, this version needs "
            f"{head}: {UPGRADE_HINT}"
        )
    before = await migrate.upgrade(url)
    if before is None:
        click.echo(
            f"created the tables of a new database in {redact(url)} (revision {head})", err=True
        )
    elif state.empty:  # another process migrated it while this one waited for the lock
        click.echo(
            f"the tables of the new database in {redact(url)} were created by another process "
            f"(revision {before})",
            err=True,
        )


T = TypeVar("T")


def load_settings() -> Settings:
    """The settings from the environment; a bad value is one line, not a traceback."""
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def run_async(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro_fn())
