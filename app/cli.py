"""The ``cstp`` command: serve, outbox and decision-tree operations (database migrations:
app.cli_db; the auditor's commands: app.cli_audit; client commands: app.client).

Every command runs through ``CstpGroup`` (app.cli_support): an expected failure is one line on
stderr and exit code 1, a bug is one line too, with its traceback only under ``cstp --debug``
(or ``CSTP_LOG_LEVEL=DEBUG``). The commands that use the database first bring it to the
newest revision when it has no tables yet, and refuse one at another revision in one line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .cli_audit import audit, guardrails_replay
from .cli_db import db
from .cli_support import (
    CstpGroup,
    Failure,
    debugging,
    ensure_schema,
    load_settings,
    redact,
    run_async,
)
from .client import register_client_commands
from .client.render import echo
from .config import ConfigError, Settings

T = TypeVar("T")


def _setup_logging(level: str) -> None:
    """The server's logging (replacing the one-line logging of the other commands)."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if level != "DEBUG":  # one line per Alembic plugin at every start says nothing to an operator
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


@click.group(cls=CstpGroup)
@click.option(
    "--debug",
    is_flag=True,
    help="Show the traceback of a failure, and debug logs (as CSTP_LOG_LEVEL=DEBUG).",
)
def main(debug: bool) -> None:
    """CSTP server: decision memory and guardrails for AI agents."""


@main.command()
@click.option("--host", default=None, help="Bind address (default CSTP_HOST or 127.0.0.1).")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Port (default CSTP_PORT or 9991).",
)
@click.option(
    "--workers", default=1, type=click.IntRange(min=1), show_default=True, help="Server processes."
)
def serve(host: str | None, port: int | None, workers: int) -> None:
    """Apply pending migrations, then serve JSON-RPC on /cstp."""
    import uvicorn

    from .auth import LOCAL_AGENT, ensure_local_token, load_tokens
    from .guardrails.rules import RuleFileError

    settings = load_settings()
    _setup_logging("DEBUG" if debugging() else settings.log_level)
    host = host or settings.host
    port = port or settings.port
    try:
        tokens = load_tokens(settings)
        _preflight(settings)
    except (ConfigError, RuleFileError) as exc:
        raise click.ClickException(str(exc)) from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    run_async(lambda: ensure_schema(settings.database_url, upgrade_older=True))
    if not tokens:
        _token, created = ensure_local_token(settings.data_dir)
        path = (settings.data_dir / "local-token").absolute()
        click.echo(
            f"No CSTP_AUTH_TOKENS set: {'created' if created else 'using'} a token for agent "
            f"'{LOCAL_AGENT}' in {path}\n"
            f"  export CSTP_TOKEN=$(cat {path})\n"
            f'  curl -H "Authorization: Bearer $CSTP_TOKEN" http://{host}:{port}/cstp ...',
            err=True,
        )
    click.echo(
        f"database: {redact(settings.database_url)}\n"
        f"decisions: {settings.decisions_dir.absolute()}\n"
        f"vector index: {settings.chroma_url or (settings.data_dir / 'chroma').absolute()}\n"
        f"listening on http://{host}:{port}",
        err=True,
    )
    if workers > 1 and not settings.chroma_url:
        raise click.ClickException(
            "several workers need a Chroma server (CSTP_CHROMA_URL): the embedded index is "
            "not safe across processes"
        )
    uvicorn.run(
        "app.asgi:serving_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


def _preflight(settings: Settings) -> None:
    """What the server process checks when it starts, checked here before it is started, so a
    mistake is one line on stderr instead of a traceback after "listening on"."""
    from .asgi import build_registry, check_rate_limits
    from .guardrails.rule_files import load_rules, rule_dirs

    check_rate_limits(settings, build_registry())
    load_rules(rule_dirs(settings.guardrails_dir))


def _with_services(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``work(services)`` against the configured database and index, then close."""
    from .services import build_services

    settings = load_settings()

    async def go() -> T:
        await ensure_schema(settings.database_url)
        services = build_services(settings)
        try:
            return await work(services)
        finally:
            await services.close()

    return run_async(go)


@main.group(invoke_without_command=True)
@click.pass_context
def outbox(ctx: click.Context) -> None:
    """Show pending and dead outbox events."""
    if ctx.invoked_subcommand is not None:
        return

    async def show(services: Any) -> None:
        from .outbox.admin import describe

        for line in await describe(services):
            echo(line)  # an event's error may quote stored text: no control character raw

    _with_services(show)


@outbox.command("retry")
def outbox_retry() -> None:
    """Re-queue dead events."""
    from .outbox.admin import retry_dead

    count = _with_services(retry_dead)
    click.echo(f"re-queued {count} dead event(s)")


@outbox.command("drain")
@click.option(
    "--include-leased",
    is_flag=True,
    help="Also take events leased to a server process; only when no server is running.",
)
def outbox_drain(include_leased: bool) -> None:
    """Process every due pending event now."""
    stats = _with_services(lambda s: s.relay.drain(include_leased=include_leased))
    click.echo(f"done {stats.done}, failed {stats.failed}, dead {stats.dead}")
    if stats.failed:
        sys.exit(1)


@main.command("export")
def export_tree() -> None:
    """Rebuild the YAML tree (CSTP_DECISIONS_DIR) from the database, with progress."""
    from .decisions.bulk import export_all

    async def work(services: Any) -> Any:
        with click.progressbar(length=0, label="exporting", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos)

            return await export_all(services, progress=progress)

    exported = _with_services(work)
    click.echo(f"exported {exported} decision file(s)")
    for decision_id, reason in exported.failed:
        echo(f"could not export decision {decision_id}: {reason}", err=True)
    if exported.failed:
        sys.exit(1)


@main.command("import")
@click.argument("directory", type=click.Path(path_type=Path))
def import_tree_command(directory: Path) -> None:
    """Load a tree of decision YAML files into the database (idempotent), then index them.

    Exits 1 when a file could not be imported or an event is left to retry."""
    from .decisions.importer import import_tree
    from .outbox.admin import progress_of
    from .outbox.loop import LEASE

    if not directory.is_dir():
        raise Failure(f"{directory}: {'not a' if directory.exists() else 'no such'} directory")
    os.scandir(directory).close()  # an unreadable directory fails here, in one line

    async def work(services: Any) -> Any:
        with click.progressbar(length=1, label="importing", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos)

            report = await import_tree(services, directory, progress=progress)
        await services.relay.drain()  # the imported decisions' events are due now
        # A running server's relay may have claimed some of them: wait for it, at most as
        # long as its lease, then report the events' state as the database has it.
        done, working, left = await progress_of(services, report.new_ids)
        deadline = time.monotonic() + LEASE.total_seconds() + 5
        if working:
            click.echo(f"waiting for {working} event(s) another relay is working on", err=True)
        while working and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            done, working, left = await progress_of(services, report.new_ids)
        return report, done, working + left

    report, done, left = _with_services(work)
    for name, reason in report.failed:
        echo(f"could not import {name}: {reason}", err=True)  # a file name is anyone's text
    click.echo(
        f"files {report.files}, new {report.new}, already present {report.existing}, "
        f"failed {len(report.failed)}; indexed and exported: {done} event(s), "
        f"{left} to retry"
    )
    if left:
        click.echo(
            f"{left} event(s) left to retry: `cstp outbox` shows why, "
            "`cstp outbox drain` retries them",
            err=True,
        )
    if report.failed or left:
        sys.exit(1)


@main.command("reindex")
def reindex_command() -> None:
    """Rebuild the vector index from the database into a new collection, then switch over.

    With the embedded index, stop the server first (one process per index directory)."""
    from .search.reindex import reindex

    async def work(services: Any) -> int:
        with click.progressbar(length=1, label="indexing", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = max(total, 1)
                bar.update(done - bar.pos)

            return await reindex(services, progress=progress)

    count = _with_services(work)
    click.echo(f"indexed {count} decision(s)")


@main.command("mcp")
@click.option(
    "--url",
    envvar="CSTP_URL",
    show_envvar=True,
    default="http://127.0.0.1:9991",
    help="The running CSTP server to forward to.",
)
@click.option(
    "--token",
    envvar="CSTP_TOKEN",
    show_envvar=True,
    default=None,
    help="A bearer token of that server: every call is this token's agent's.",
)
def mcp_command(url: str, token: str | None) -> None:
    """Speak MCP on stdin/stdout (for clients that spawn a command), forwarding every tool
    call to a running server. Nothing but the protocol is written to stdout."""
    from .client.transport import Caller, ClientError, endpoint
    from .mcp import stdio

    token = (token or "").strip()
    if not token:
        raise click.ClickException("no token: set CSTP_TOKEN to a token the server knows")
    target = endpoint(url)
    try:
        Caller(url, token, as_json=True).call("rpc.discover", {})
    except ClientError as exc:
        if "refused the token" in exc.message:
            raise
        # The server may start after its client: calls fail (-32006) until it answers.
        click.echo(f"warning: {exc.message}; tool calls fail until it answers", err=True)
    stdio.run(target, token)


register_client_commands(main)


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


main.add_command(db)
main.add_command(audit)
main.add_command(_with_subcommands(main.commands["guardrails"], guardrails_replay))


if __name__ == "__main__":  # pragma: no cover
    main()
