"""``cstp db``: the schema's migrations (Alembic), each refusing in one line a database this
version cannot migrate, and auditors' database roles on PostgreSQL (app.db.readers).
Registered on ``cstp`` by app.cli."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from .failures import Failure, reason, redact
from .runner import load_settings, run
from .schema import SchemaState, ensure_schema, known_revisions, schema_problem, schema_state


@click.group()
def db() -> None:
    """Schema migrations (Alembic) and auditors' database roles."""


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


@db.command("auditor-role")
@click.argument("role")
@click.option(
    "--workspace",
    metavar="W",
    help="The workspace whose audit rows the role reads (required unless --revoke).",
)
@click.option(
    "--password-env",
    metavar="VAR",
    help="Set the role's password from the environment variable VAR (not from the command "
    "line, which other users and the shell's history can read). Without it a new role has "
    "no password and an existing one keeps its own.",
)
@click.option(
    "--revoke",
    is_flag=True,
    help="Take the role's privileges and LOGIN away and unlist it (the role itself remains).",
)
def db_auditor_role(
    role: str, workspace: str | None, password_env: str | None, revoke: bool
) -> None:
    """PostgreSQL: make ROLE a database role that can SELECT the audit tables and, by
    row-level security, sees only workspace W's rows (docs/AUDIT.md)."""
    import os

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import create_async_engine

    from ..db import readers
    from ..db.scram import scram_verifier

    url = load_settings().database_url
    backend = make_url(url).get_backend_name()
    if backend != "postgresql":
        raise Failure(
            "`cstp db auditor-role` needs PostgreSQL (database roles and row-level security); "
            f"this database is {'SQLite' if backend == 'sqlite' else backend}"
        )
    if revoke and (workspace is not None or password_env is not None):
        raise Failure("--revoke takes neither --workspace nor --password-env")
    if not revoke and workspace is None:
        raise Failure("--workspace W is required: the workspace whose audit rows ROLE reads")
    verifier = None
    try:
        readers.check_role_name(role)
        if workspace is not None:
            readers.check_workspace(workspace)
        if password_env is not None:
            password = os.environ.get(password_env)
            if not password:
                raise Failure(f"the environment variable {password_env} is not set or empty")
            readers.check_password(password)
            verifier = scram_verifier(password)
    except readers.ReaderRefused as exc:
        raise Failure(str(exc)) from None

    async def go() -> readers.Granted | readers.Revoked:
        await ensure_schema(url, migrate_empty=False)
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                if revoke:
                    return await readers.revoke_reader(conn, role)
                assert workspace is not None  # checked above
                return await readers.grant_reader(conn, role, workspace, verifier=verifier)
        except readers.ReaderRefused as exc:
            raise Failure(str(exc)) from None
        except DBAPIError as exc:
            # Not enough rights (CREATE ROLE, ALTER ROLE, GRANT): the operator's to fix.
            if getattr(exc.orig, "sqlstate", None) != "42501":
                raise
            raise Failure(
                f"the database refused: {reason(exc)}; run the command with a "
                "CSTP_DATABASE_URL whose role owns the tables and has CREATEROLE, or as a superuser"
            ) from None
        finally:
            await engine.dispose()

    done = run(go)
    if isinstance(done, readers.Revoked):
        click.echo(
            f"role {done.role} no longer reads workspace {done.workspace}: its privileges on "
            f"schema {done.schema} are revoked and it cannot log in (DROP ROLE removes it)"
        )
        return
    if done.created:
        what = ["LOGIN NOINHERIT"]
    else:
        what = list(done.changed) or ["its attributes were already right"]
    if done.password:
        what.append("password set")
    click.echo(f"role {done.role} {'created' if done.created else 'updated'} ({', '.join(what)})")
    was = f" (was {done.previous})" if done.previous not in (None, done.workspace) else ""
    click.echo(
        f"it reads workspace {done.workspace}{was}: SELECT on {len(done.tables)} audit "
        f"tables of schema {done.schema}, no other privilege there"
    )
