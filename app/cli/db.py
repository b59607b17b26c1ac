"""``cstp db``: the schema's migrations (Alembic), each refusing in one line a database this
version cannot migrate. Registered on ``cstp`` by app.cli."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from .failures import Failure, redact
from .runner import load_settings, run
from .schema import SchemaState, ensure_schema, known_revisions, schema_problem, schema_state


@click.group()
def db() -> None:
    """Schema migrations (Alembic)."""


async def _migrate(
    url: str, state: SchemaState, action: Callable[[], Awaitable[object]]
) -> str | None:
    """Run ``action`` (an upgrade or a downgrade) unless the database, in ``state``, is not
    one this version can migrate (``schema_problem``); returns its revision after."""
    from ..db import migrate

    problem = schema_problem(url, state)
    if problem:
        raise Failure(problem)
    await action()
    return await migrate.current(url)


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Upgrade the database to REVISION (default: head); creates a new one."""
    from ..db import migrate

    url = load_settings().database_url

    async def go() -> str | None:
        return await _migrate(url, await schema_state(url), lambda: migrate.upgrade(url, revision))

    click.echo(f"at {run(go) or 'base (no revision)'}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Downgrade the database to REVISION ('base' removes every table)."""
    from ..db import migrate

    url = load_settings().database_url

    async def go() -> str | None:
        state = await schema_state(url)
        if state.empty:  # nothing to remove (and no database file is created for nothing)
            if revision != "base":
                raise Failure(f"the database {redact(url)} has no tables: nothing to downgrade")
            return None
        return await _migrate(url, state, lambda: migrate.downgrade(url, revision))

    click.echo(f"at {run(go) or 'base (no revision)'}")


@db.command("current")
def db_current() -> None:
    """Show the database's revision and the newest one (creates nothing)."""
    from ..db import migrate

    state = run(lambda: schema_state(load_settings().database_url))
    current = state.revision or "none"
    if state.revision is not None and state.revision not in known_revisions():
        current += " (unknown to this version: a newer cstp migrated the database)"
    click.echo(f"current: {current}\nhead: {migrate.head_revision()}")


@db.command("check")
def db_check() -> None:
    """Fail when the models and the migrated schema differ."""
    from ..db import migrate

    url = load_settings().database_url

    async def check() -> list[Any]:
        await ensure_schema(url, migrate_empty=False)
        return await migrate.drift(url)

    diffs = run(check)
    if diffs:
        for diff in diffs:
            click.echo(f"drift: {diff}", err=True)
        raise Failure(f"{len(diffs)} difference(s) between models and schema")
    click.echo("models and schema agree")
