"""``cstp outbox``: show, retry and drain the outbox's events. Registered on ``cstp`` by
app.cli."""

from __future__ import annotations

import sys
from typing import Any

import click

from .client.render import echo
from .runner import with_services


@click.group(invoke_without_command=True)
@click.pass_context
def outbox(ctx: click.Context) -> None:
    """Show pending and dead outbox events, and webhook deliveries waiting or dead."""
    if ctx.invoked_subcommand is not None:
        return

    async def show(services: Any) -> None:
        from ..outbox.admin import describe
        from ..webhooks import admin as webhooks

        for line in await describe(services):
            echo(line)  # an event's error may quote stored text: no control character raw
        for line in await webhooks.describe(services.db):
            echo(line)

    with_services(show)


@outbox.command("retry")
def outbox_retry() -> None:
    """Re-queue dead events and dead webhook deliveries."""
    from ..outbox.admin import retry_dead
    from ..webhooks import admin as webhooks

    async def retry(services: Any) -> tuple[int, int]:
        events = await retry_dead(services)
        deliveries = await webhooks.retry_dead(services.db, services.runtime.now())
        services.webhooks.wakeup.set()
        return events, deliveries

    count, deliveries = with_services(retry)
    click.echo(f"re-queued {count} dead event(s)")
    click.echo(f"re-queued {deliveries} dead webhook delivery(ies)")


@outbox.command("drain")
@click.option(
    "--include-leased",
    is_flag=True,
    help="Also take events leased to a server process; only when no server is running.",
)
def outbox_drain(include_leased: bool) -> None:
    """Process every due pending event now."""
    stats = with_services(lambda s: s.relay.drain(include_leased=include_leased))
    click.echo(f"done {stats.done}, failed {stats.failed}, dead {stats.dead}")
    if stats.failed:
        sys.exit(1)
