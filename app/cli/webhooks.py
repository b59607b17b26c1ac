"""``cstp webhooks add|list|remove``: the webhook subscriptions (SPEC.md, section 8;
docs/OPERATIONS.md, "Webhooks"). Administration is local, like ``cstp tokens``: these
commands use the configured database directly (``CSTP_DATABASE_URL``), and the webhook key
(``CSTP_WEBHOOK_KEY``, else the key file in ``CSTP_DATA_DIR``) to seal a new secret.

The signing secret is printed once, by ``add``; the database holds it sealed under the
webhook key, and no list, error or log line ever shows it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from .client.render import echo, echo_table, print_json
from .failures import Failure
from .runner import load_settings, run
from .schema import ensure_schema
from .tokens import operator

T = TypeVar("T")


def _with_admin(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(admin)`` (app.webhooks.admin.Admin) on the configured database, at the
    newest revision (a new database is created, as by ``cstp serve``)."""
    from ..webhooks.admin import Admin

    return _with_database(lambda db, settings: work(Admin(db, settings)))


def _with_database(work: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run ``work(db, settings)`` on the configured database (app.db.engine.Database), at the
    newest revision; a webhook key that cannot be had is a one-line failure."""
    from ..db import models as _all_models  # noqa: F401 - every table known before any flush
    from ..db.engine import Database
    from ..webhooks.secrets import KeyUnavailable

    settings = load_settings()

    async def go() -> T:
        await ensure_schema(settings.database_url)
        db = Database(settings.database_url)
        try:
            return await work(db, settings)
        except KeyUnavailable as exc:
            raise Failure(str(exc)) from None
        finally:
            await db.dispose()

    return run(go)


def _checked(check: Callable[[str], T], value: str) -> T:
    from ..webhooks.admin import BadRequest

    try:
        return check(value)
    except BadRequest as exc:
        raise Failure(str(exc)) from None


@click.group()
def webhooks() -> None:
    """Webhook subscriptions: add (the signing secret shown once), list, remove. Events are
    signed as the Standard Webhooks specification says and delivered from the outbox
    (`cstp outbox` shows what waits). ci-secret: the secret CI signs its reports with."""


@webhooks.command("add")
@click.option("--workspace", required=True, help="The workspace whose events are sent.")
@click.option("--url", required=True, help="Where they are posted (http:// or https://).")
@click.option(
    "--events",
    required=True,
    help="Comma-separated: approval.requested, approval.decided, guardrail.blocked, "
    "review.due, decision.recorded.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def webhooks_add(workspace: str, url: str, events: str, as_json: bool) -> None:
    """Subscribe URL to a workspace's events and print the signing secret, once."""
    from ..runtime import utc_now
    from ..webhooks.admin import checked_events, checked_url, checked_workspace, listed

    workspace = _checked(checked_workspace, workspace)
    url = _checked(checked_url, url)
    names = _checked(checked_events, events)
    by = operator()
    added = _with_admin(lambda admin: admin.add(workspace, url, names, by, utc_now()))
    shown = listed(added.subscription)
    if as_json:
        print_json(
            {
                "id": shown["id"],
                "secret": added.secret,
                "workspace": shown["workspace"],
                "url": shown["url"],
                "events": shown["events"],
                "createdAt": shown["createdAt"],
            }
        )
        return
    echo(
        f"added {shown['id']}: workspace {shown['workspace']}, {shown['url']}, events "
        f"{','.join(shown['events'])}"
    )
    click.echo(f"secret: {added.secret}")
    click.echo(
        "This signing secret is shown once: give it to the receiver now (it verifies each "
        "message's webhook-signature with it).",
        err=True,
    )


@webhooks.command("list")
@click.option("--workspace", help="Only this workspace's subscriptions.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def webhooks_list(workspace: str | None, as_json: bool) -> None:
    """The subscriptions (never their secrets), oldest first."""
    from ..webhooks.admin import checked_workspace, listed

    if workspace is not None:
        workspace = _checked(checked_workspace, workspace)
    found = [listed(row) for row in _with_admin(lambda admin: admin.list(workspace))]
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no webhooks" + (f" in workspace {workspace}" if workspace else ""))
        return
    echo_table(
        ("ID", "WORKSPACE", "STATUS", "URL", "EVENTS", "CREATED", "BY"),
        [
            (
                s["id"],
                s["workspace"],
                s["status"],
                s["url"],
                ",".join(s["events"]),
                s["createdAt"],
                s["createdBy"],
            )
            for s in found
        ],
    )


@webhooks.command("remove")
@click.argument("subscription_id")
def webhooks_remove(subscription_id: str) -> None:
    """Remove a subscription by its id (whk_…): its messages are no longer sent."""
    from ..runtime import utc_now
    from ..webhooks.admin import ID, UnknownSubscription
    from ..webhooks.secrets import SECRET_PREFIX

    if subscription_id.startswith(SECRET_PREFIX):  # never echoed: it would land in logs
        raise Failure(
            "that is a signing secret, not a subscription id: remove takes the id (whk_...) "
            "that `cstp webhooks list` shows"
        )
    if not ID.fullmatch(subscription_id):
        raise Failure(
            f"{subscription_id[:40]!r} is not a webhook id (whk_ and 16 hex digits; see "
            "`cstp webhooks list`)"
        )

    async def remove(admin: Any) -> Any:
        try:
            return await admin.remove(subscription_id, utc_now())
        except UnknownSubscription:
            raise Failure(
                f"no webhook has the id {subscription_id} (see `cstp webhooks list`)"
            ) from None

    row, now = _with_admin(remove)
    if now:
        echo(f"removed {row.id} (workspace {row.workspace}, {row.url})")
    else:
        echo(f"{row.id} was already removed: nothing changed")


@webhooks.command("ci-secret")
@click.option("--workspace", required=True, help="The workspace CI reports outcomes to.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def webhooks_ci_secret(workspace: str, as_json: bool) -> None:
    """Make the workspace's CI secret and print it, once: CI signs its reports to
    POST /hooks/ci/<workspace> with it. Running it again rotates the secret: the one before
    stops working at once."""
    from ..ci.admin import set_secret
    from ..runtime import utc_now
    from ..webhooks.admin import checked_workspace

    workspace = _checked(checked_workspace, workspace)
    by = operator()
    secret = _with_database(lambda db, settings: set_secret(db, settings, workspace, by, utc_now()))
    if as_json:
        print_json({"secret": secret})
        return
    click.echo(f"secret: {secret}")
    click.echo(
        f"This CI secret of workspace {workspace} is shown once: store it in your CI as a "
        "masked secret now (it signs the reports to /hooks/ci/"
        f"{workspace}). Running this again replaces it; the old one stops working at once.",
        err=True,
    )
