"""Rebuild the YAML tree from the database (``cstp export``).

The tree is derived data: every file can be written again from its row. This walks the
``decisions`` table in id order, one batch at a time (keyset pagination, one short read
transaction per batch, so neither the table nor a long-lived transaction is ever held), and
writes each file with the very functions the outbox's ``export`` handler uses, so the output
is byte-identical to what the outbox wrote.

Every file is made its row's, whatever it held (``repair``: a file that diverged from its row,
edited by hand or left behind by an older server, is written again). A review committed while
a batch is written could leave a file with the row as the batch read it, written after the
review's own pass wrote the newer one; so after each batch its rows are read again and those a
review changed are written again, as the outbox does (app.outbox.handlers).

A decision that cannot be written as YAML (a value nested too deeply for the emitter, say: the
API refuses such input now, but an older database may hold it) is reported by id with the
reason and the export goes on; what fails writing (a full disk) stops it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.db.decisions import Decision
from app.outbox.failures import FailureKind, classify
from app.records.repository import load_decisions

from . import repository
from .export import render, write_decision

if TYPE_CHECKING:
    from app.db.engine import Database
    from app.services import Services

Progress = Callable[[int, int], None]
DEFAULT_BATCH = 500


class Exported(int):
    """The number of files written (an int, as ``export_all`` always returned), and in
    ``failed`` the decisions that cannot be written as YAML: ``(id, reason)`` in id order."""

    failed: tuple[tuple[str, str], ...]

    def __new__(cls, written: int, failed: Sequence[tuple[str, str]] = ()) -> Exported:
        value = super().__new__(cls, written)
        value.failed = tuple(failed)
        return value


def _write_batch(root: Path, decisions: Sequence[Decision]) -> list[tuple[str, str]]:
    """Write each file; returns (id, reason) of those that cannot be rendered."""
    failed: list[tuple[str, str]] = []
    for decision in decisions:
        try:
            content = render(decision)
        except Exception as exc:
            failure = classify(exc, building="the YAML file")
            if failure.kind != FailureKind.PERMANENT:
                raise
            failed.append((decision.id, failure.error))
            continue
        write_decision(root, decision, content, repair=True)
    return failed


# Rounds of reading a batch's rows again; each one after the first means yet another review
# was committed while the last was written.
MAX_ROUNDS = 8


async def _write_current(
    db: Database, root: Path, decisions: Sequence[Decision]
) -> list[tuple[str, str]]:
    """Write the files of ``decisions``, then again those whose row a review changed while
    they were written, until none has; returns ``_write_batch``'s failures."""
    failed: list[tuple[str, str]] = []
    todo = list(decisions)
    for _ in range(MAX_ROUNDS):
        newly = await asyncio.to_thread(_write_batch, root, todo)
        failed += newly
        bad = {decision_id for decision_id, _ in newly}
        todo = [d for d in todo if d.id not in bad]
        changed = await db.read(functools.partial(repository.changed_rows, decisions=todo))
        if not changed:
            return failed
        async with db.transaction(write=False) as session:
            todo = list((await load_decisions(session, changed)).values())
    raise RuntimeError("decisions kept changing while they were exported; run the export again")


async def export_all(
    services: Services,
    progress: Progress | None = None,
    batch: int = DEFAULT_BATCH,
    *,
    workspace: str | None = None,
) -> Exported:
    """Write the YAML file of every decision of ``workspace`` (of every workspace, None) under
    ``settings.decisions_dir``, each in its workspace's folder; returns the count
    of files written, with ``.failed`` naming each decision that cannot be written as YAML.

    ``progress(done, total)`` is called after each batch. ``total`` is counted up front; rows
    added while the export runs are exported too when their id sorts after the cursor, and
    ``total`` then grows so that ``done`` never exceeds it; the last report is ``(n, n)``.
    ``done`` counts the decisions handled, written or failed.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    db = services.db
    root = services.settings.decisions_dir
    async with db.transaction(write=False) as session:
        total = await repository.count_all(session, workspace)
    done = 0
    failed: list[tuple[str, str]] = []
    last_id: str | None = None
    while True:
        async with db.transaction(write=False) as session:
            ids = await repository.ids_after(session, last_id, batch, workspace)
            if not ids:
                break
            loaded = await load_decisions(session, ids)
        decisions = [loaded[i] for i in ids if i in loaded]  # a row deleted meanwhile is skipped
        failed += await _write_current(db, root, decisions)
        done += len(decisions)
        last_id = ids[-1]
        total = max(total, done)
        if progress is not None:
            progress(done, total)
        if len(ids) < batch:
            break
    if progress is not None and (done == 0 or total != done):
        progress(done, done)  # the last report always reads (n, n), even if rows went away
    return Exported(done - len(failed), failed)
