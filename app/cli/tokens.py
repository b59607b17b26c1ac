"""``cstp tokens create|list|revoke``: the tokens kept in the database (SPEC.md, section 7;
docs/OPERATIONS.md, "Tokens"). Administration is local: these commands use the configured
database directly (``CSTP_DATABASE_URL``, and ``CSTP_AUDIT_KEY`` for the grants' chain
entries); no method over the network creates or revokes a token.

``created_by`` (and a grant's ``acted_by``) is the account that ran the command, as
``user@host``: the user the operating system reports for this process (``getpass``, which
reads ``LOGNAME``/``USER`` first), or ``uid:N`` when it has no name. It records who acted for
the auditors; it is not a check of any kind (whoever can run this command can write to the
database anyway).

The secret is printed once, by ``create``, and kept nowhere: the database holds its SHA-256,
and no error or log line ever holds it.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from .client.render import echo, echo_table, print_json
from .failures import Failure
from .runner import load_settings, run
from .schema import ensure_schema

T = TypeVar("T")


def operator() -> str:
    """Who runs this command: ``user@host`` (see the module docstring)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    host = socket.gethostname() or "unknown-host"
    return f"{user}@{host}"[:128]


def _with_admin(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(admin)`` (app.access.service.TokenAdmin) on the configured database, at the
    newest revision (a new database is created, as by ``cstp serve``)."""
    from ..access.service import TokenAdmin
    from ..audit.chain import use_key
    from ..db import models as _all_models  # noqa: F401 - every table known before any flush
    from ..db.engine import Database

    settings = load_settings()

    async def go() -> T:
        await ensure_schema(settings.database_url)
        db = Database(settings.database_url)
        use_key(db.write_engine, settings.audit_key)  # the grants' chain entries
        try:
            return await work(TokenAdmin(db))
        finally:
            await db.dispose()

    return run(go)


def _time(value: datetime | None) -> str | None:
    from ..runtime import iso

    return None if value is None else iso(value)


def _listed(token: Any, now: datetime) -> dict[str, Any]:
    from ..access.service import status

    return {
        "id": token.id,
        "workspace": token.workspace,
        "agent": token.agent,
        "role": token.role,
        "scopes": list(token.scopes),
        "status": status(token, now),
        "createdAt": _time(token.created_at),
        "createdBy": token.created_by,
        "expiresAt": _time(token.expires_at),
        "revokedAt": _time(token.revoked_at),
    }


@click.group()
def tokens() -> None:
    """Tokens kept in the database: create (the secret shown once), list, revoke. A
    revocation or expiry takes effect in every server process within 2 seconds."""


@tokens.command("create")
@click.option("--agent", required=True, help="The agent the token speaks for.")
@click.option(
    "--workspace", default="default", show_default=True, help="The workspace it works in."
)
@click.option("--role", default="agent", show_default=True, help="agent, reviewer, approver, …")
@click.option("--scopes", help="Exactly these scopes (comma-separated) instead of the role's.")
@click.option("--expires-in", help="Lifetime: N and a unit, s, h or d (e.g. 12h, 30d).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def tokens_create(
    agent: str,
    workspace: str,
    role: str,
    scopes: str | None,
    expires_in: str | None,
    as_json: bool,
) -> None:
    """Create a token and print its secret, once: only its SHA-256 is stored."""
    from ..access.rules import BadRequest, token_request

    try:
        request = token_request(agent, workspace, role, scopes, expires_in)
    except BadRequest as exc:
        raise Failure(str(exc)) from None
    by = operator()
    created = _with_admin(lambda admin: admin.create(request, by))
    token = created.token
    if as_json:
        print_json(
            {
                "id": token.id,
                "token": created.secret,
                "workspace": token.workspace,
                "agent": token.agent,
                "role": token.role,
                "scopes": list(token.scopes),
                "expiresAt": _time(token.expires_at),
            }
        )
        return
    expires = _time(token.expires_at) or "never"
    echo(
        f"created {token.id}: agent {token.agent}, workspace {token.workspace}, role "
        f"{token.role}, scopes {','.join(token.scopes)}, expires {expires}"
    )
    click.echo(f"token: {created.secret}")
    click.echo("This secret is shown once and stored nowhere: keep it now.", err=True)


@tokens.command("list")
@click.option("--workspace", help="Only this workspace's tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def tokens_list(workspace: str | None, as_json: bool) -> None:
    """The tokens (never their secrets), oldest first, with their status now."""
    from ..access.rules import BadRequest
    from ..access.rules import workspace as checked_workspace
    from ..runtime import utc_now

    if workspace is not None:
        try:
            checked_workspace(workspace)
        except BadRequest as exc:
            raise Failure(str(exc)) from None
    found = _with_admin(lambda admin: admin.list(workspace))
    now = utc_now()
    listed = [_listed(token, now) for token in found]
    if as_json:
        print_json(listed)
        return
    if not listed:
        click.echo("no tokens" + (f" in workspace {workspace}" if workspace else ""))
        return
    echo_table(
        ("ID", "WORKSPACE", "AGENT", "ROLE", "STATUS", "EXPIRES", "CREATED", "BY", "SCOPES"),
        [
            (
                t["id"],
                t["workspace"],
                t["agent"],
                t["role"],
                t["status"],
                t["expiresAt"] or "never",
                t["createdAt"],
                t["createdBy"],
                ",".join(t["scopes"]),
            )
            for t in listed
        ],
    )


@tokens.command("revoke")
@click.argument("token_id")
def tokens_revoke(token_id: str) -> None:
    """Revoke a token by its id (tok_…): every server refuses it within 2 seconds."""
    from ..access.rules import ID, SECRET_PREFIX
    from ..access.service import UnknownToken

    if token_id.startswith(SECRET_PREFIX):  # never echoed: it would land in logs and scrollback
        raise Failure(
            "that is a token's secret, not its id: revoke takes the id (tok_...) that "
            "`cstp tokens list` shows"
        )
    by = operator()

    async def revoke(admin: Any) -> Any:
        try:
            return await admin.revoke(token_id, by)
        except UnknownToken:
            shown = f" {token_id}" if ID.fullmatch(token_id) else ""
            raise Failure(f"no token has the id{shown} (see `cstp tokens list`)") from None

    revoked = _with_admin(revoke)
    token = revoked.token
    if revoked.now:
        echo(f"revoked {token.id} (agent {token.agent}, workspace {token.workspace})")
    else:
        echo(f"{token.id} was already revoked, at {_time(token.revoked_at)}: nothing changed")
