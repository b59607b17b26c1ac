"""The ``cstp`` command: one module per command group, all run by one runner.

- ``runner``: where every command runs (``CstpGroup``) and its async work with it
  (``run``, ``with_services``, ``read_snapshot``): an expected failure is one line on stderr
  and exit code 1, a bug is one line too, with its traceback only under ``cstp --debug`` (or
  ``CSTP_LOG_LEVEL=DEBUG``); ``failures``: how a failure reads; ``schema``: the database's
  state (a fresh database is migrated first, one at another revision refused in one line).
- ``serve``, ``db`` (migrations), ``outbox``, ``bulk`` (import, export, reindex), ``audit``
  (the audit chain and ``guardrails replay``), ``mcp`` (MCP on stdio), ``tokens`` (the
  tokens kept in the database), ``webhooks`` (the webhook subscriptions).
- ``client``: the commands that talk to a running server (query, record, review, get, list,
  check, announce, calibration, guardrails).
"""

from __future__ import annotations

from typing import Any

import click

from . import audit, bulk, db, mcp, outbox, serve, tokens, webhooks
from .client import register_client_commands
from .runner import CstpGroup


@click.group(cls=CstpGroup)
@click.option(
    "--debug",
    is_flag=True,
    help="Show the traceback of a failure, and debug logs (as CSTP_LOG_LEVEL=DEBUG).",
)
def main(debug: bool) -> None:
    """CSTP server: decision memory and guardrails for AI agents."""


def _with_subcommands(listing: click.Command, *commands: click.Command) -> click.Group:
    """``listing`` (a client command) as a group that still runs it when no subcommand is
    given: ``cstp guardrails [--scope …]`` lists the rules, ``cstp guardrails replay ID``
    replays an evaluation."""

    @click.pass_context
    def run(ctx: click.Context, /, **options: Any) -> None:
        if ctx.invoked_subcommand is None:
            ctx.invoke(listing, **options)

    group = click.Group(
        listing.name,
        params=listing.params,
        callback=run,
        invoke_without_command=True,
        help=listing.help,
        short_help=listing.short_help,
    )
    for command in commands:
        group.add_command(command)
    return group


main.add_command(serve.serve)
main.add_command(outbox.outbox)
main.add_command(bulk.export_tree)
main.add_command(bulk.import_tree_command)
main.add_command(bulk.reindex_command)
main.add_command(mcp.mcp_command)
register_client_commands(main)
main.add_command(db.db)
main.add_command(audit.audit)
main.add_command(tokens.tokens)
main.add_command(webhooks.webhooks)
main.add_command(_with_subcommands(main.commands["guardrails"], audit.guardrails_replay))

__all__ = ["main"]
