"""The database's state, as the commands that use it need it.

``ensure_schema`` brings the database to what a command needs: a database with no tables yet
(a fresh install) is migrated, as ``cstp serve`` does; a database at an older revision is left
to the operator (``cstp db upgrade``), and one at a revision this version does not know
(migrated by a newer cstp) is refused, in one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .failures import Failure, Unavailable, reason, redact

UPGRADE_HINT = "run `cstp db upgrade` first"


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
        raise Unavailable(f"cannot open the database {redact(url)}: {reason(exc)}") from exc
    finally:
        await engine.dispose()


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    from ..db import migrate

    script = ScriptDirectory.from_config(migrate.alembic_config())
    return {s.revision for s in script.walk_revisions()}


def schema_problem(url: str, state: SchemaState) -> str | None:
    """Why no command but ``cstp db upgrade`` could use this database as it is: it holds
    tables but no revision (not a CSTP database), or a revision this version does not know
    (a newer cstp migrated it). None when neither."""
    from ..db import migrate

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


def _echo(text: str) -> None:
    click.echo(text, err=True)


async def ensure_schema(
    url: str,
    *,
    migrate_empty: bool = True,
    upgrade_older: bool = False,
    tell: Callable[[str], None] = _echo,
) -> None:
    """Make sure the database at ``url`` is at the newest revision before a command uses it.

    A database with no tables (or no file yet) is migrated when ``migrate_empty`` (its
    folder created first), and one at an older revision when ``upgrade_older`` (``serve``);
    any other state but the newest revision raises ``Failure`` naming the command that fixes
    it. A database out of reach raises ``Unavailable``. Who created a new database's tables
    is told through ``tell`` (stderr; ``serve`` logs it, for a JSON log)."""
    from ..db import migrate

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
        tell(f"created the tables of a new database in {redact(url)} (revision {head})")
    elif state.empty:  # another process migrated it while this one waited for the lock
        tell(
            f"the tables of the new database in {redact(url)} were created by another process "
            f"(revision {before})"
        )
