"""Where every ``cstp`` command runs: the one place its async work is run and its failures
become one line.

- ``CstpGroup`` runs each command. An expected failure (``Failure``, or an exception
  app.cli.failures.describe words: a setting, a file, the database or the vector index out of
  reach, a migration target that does not exist) is one line on stderr and exit code 1; any
  other exception is a bug: one line that names its type, and the traceback only with
  ``cstp --debug`` or ``CSTP_LOG_LEVEL=DEBUG``.
- Log records are one line each on stderr too (no traceback), except in debug mode.
- ``run`` runs a command's async work; ``with_services`` and ``read_snapshot`` run it against
  the configured database (brought to the newest revision first, app.cli.schema) with the
  services, or in one read-only snapshot. A command never calls ``asyncio.run`` itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import click

from ..config import ConfigError, Settings
from .failures import Failure, describe, one_line
from .schema import ensure_schema

T = TypeVar("T")


def debugging(ctx: click.Context | None = None) -> bool:
    """``cstp --debug`` or ``CSTP_LOG_LEVEL=DEBUG``: tracebacks and debug logs wanted."""
    if (os.environ.get("CSTP_LOG_LEVEL") or "").strip().upper() == "DEBUG":
        return True
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


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
            raise Failure(failure_line(exc)) from None
        finally:
            logging.getLogger().removeHandler(handler)


def failure_line(exc: Exception) -> str:
    """The one line a command's exception becomes: what ``describe`` says an operator can act
    on, else a bug, named by its type."""
    line = describe(exc)
    if line is None:
        line = f"internal error ({type(exc).__name__}); run with --debug for the traceback"
    return line


# ---- running a command's work ---------------------------------------------------------------


def load_settings() -> Settings:
    """The settings from the environment; a bad value is one line, not a traceback."""
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise Failure(str(exc)) from None


def run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's async work to its end; what it raises is CstpGroup's to show."""
    return asyncio.run(work())


def with_services(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(services)`` against the configured database and index, then close."""
    from ..services import build_services

    settings = load_settings()

    async def go() -> T:
        await ensure_schema(settings.database_url)
        services = build_services(settings)
        try:
            return await work(services)
        finally:
            await services.close()

    return run(go)


def read_snapshot(work: Callable[[Any], T]) -> T:
    """``work(connection)`` in one read-only snapshot of the configured database, which must
    be at the newest revision (a live server's database is fine)."""
    from ..audit.snapshot import read

    url = load_settings().database_url

    async def go() -> T:
        await ensure_schema(url, migrate_empty=False)
        return await read(url, work)

    return run(go)


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
