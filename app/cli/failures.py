"""What a ``cstp`` command's failure reads like: one line.

``Failure`` is an expected failure the command raises itself (exit code 1, "Error: ..." on
stderr); ``Unavailable`` is something the command needs out of reach. ``describe`` words any
other exception an operator can act on (a setting, a rule file, the database or the vector
index out of reach, a migration target that does not exist) as one line, and answers None
for a bug. The runner (app.cli.runner) is the one place that applies it."""

from __future__ import annotations

import os

import click

from ..config import ConfigError


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


def reason(exc: BaseException) -> str:
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

    from ..guardrails.rules import RuleFileError
    from ..search.embedder import EmbedderError
    from ..search.types import IndexUnavailable

    if isinstance(exc, Unavailable | ConfigError | RuleFileError | EmbedderError):
        return one_line(str(exc))
    if isinstance(exc, CommandError):  # e.g. a migration target that does not exist
        return f"migration: {one_line(str(exc))}"
    if isinstance(exc, IndexUnavailable):
        where = os.environ.get("CSTP_CHROMA_URL")
        cause = reason(exc.__cause__) if exc.__cause__ is not None else "closed"
        if where:
            return (
                f"the vector index (Chroma at {redact(where)}) is unavailable: {cause}; "
                "check that the server runs and CSTP_CHROMA_URL"
            )
        return f"the vector index is unavailable: {cause}"
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout):
        return f"database error: {reason(exc)}"
    if isinstance(exc, OSError):
        return reason(exc)
    return None
