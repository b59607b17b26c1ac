"""The commands that move every decision at once: ``cstp import`` (a YAML tree into the
database), ``cstp export`` (the database back to the YAML tree) and ``cstp reindex`` (the
database into a new vector index). Registered on ``cstp`` by app.cli."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from .client.render import echo
from .failures import Failure
from .runner import with_services


def _workspace(value: str | None) -> str | None:
    from ..scopes import workspace_problem

    problem = None if value is None else workspace_problem(value)
    if problem is not None:
        raise Failure(f"--workspace: not a workspace id: {problem}")
    return value


@click.command("export")
@click.option(
    "--workspace",
    metavar="W",
    help="Only this workspace's decisions (default: every workspace, each in its folder).",
)
def export_tree(workspace: str | None) -> None:
    """Rebuild the YAML tree (CSTP_DECISIONS_DIR) from the database, with progress.

    Workspace default's files are under decisions/YYYY/MM/, another workspace's under
    decisions/<workspace>/YYYY/MM/."""
    from ..decisions.bulk import export_all

    only = _workspace(workspace)

    async def work(services: Any) -> Any:
        with click.progressbar(length=0, label="exporting", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos)

            return await export_all(services, progress=progress, workspace=only)

    exported = with_services(work)
    click.echo(f"exported {exported} decision file(s)")
    for decision_id, reason in exported.failed:
        echo(f"could not export decision {decision_id}: {reason}", err=True)
    if exported.failed:
        sys.exit(1)


@click.command("import")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--workspace",
    metavar="W",
    default="default",
    show_default=True,
    help="The workspace the decisions are imported into.",
)
def import_tree_command(directory: Path, workspace: str) -> None:
    """Load a tree of decision YAML files into the database (idempotent), then index them.

    A file that names another workspace (``workspace:``) is not imported: import it with
    that --workspace. Exits 1 when a file could not be imported or an event is left to
    retry."""
    from ..decisions.importer import import_tree
    from ..outbox.admin import progress_of
    from ..outbox.loop import LEASE

    into = _workspace(workspace) or "default"
    if not directory.is_dir():
        raise Failure(f"{directory}: {'not a' if directory.exists() else 'no such'} directory")
    os.scandir(directory).close()  # an unreadable directory fails here, in one line

    async def work(services: Any) -> Any:
        with click.progressbar(length=1, label="importing", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos)

            report = await import_tree(services, directory, progress=progress, workspace=into)
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

    report, done, left = with_services(work)
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


@click.command("reindex")
def reindex_command() -> None:
    """Rebuild the vector index from the database into a new collection, then switch over.

    With the embedded index, stop the server first (one process per index directory)."""
    from ..search.reindex import reindex

    async def work(services: Any) -> int:
        with click.progressbar(length=1, label="indexing", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = max(total, 1)
                bar.update(done - bar.pos)

            return await reindex(services, progress=progress)

    count = with_services(work)
    click.echo(f"indexed {count} decision(s)")
