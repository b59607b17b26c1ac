"""Rebuild the vector index from the database (``cstp reindex``).

The index is derived data. Each workspace's collection is rebuilt in turn: the rebuild writes
into a NEW collection while the live one keeps answering queries, then switches the name
over. Decisions recorded or reviewed while it ran went to the old collection, so a catch-up
pass re-indexes everything touched since the start.
Documents are built by app.records.entries, the same function every write path uses.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement

from app.db.base import DEFAULT_WORKSPACE
from app.records.entries import index_entry
from app.records.repository import load_decisions

from .index import collection_name
from .repository import reindex as repository

if TYPE_CHECKING:
    from app.services import Services

    from .index import VectorIndex

log = logging.getLogger("cstp.reindex")

Progress = Callable[[int, int], None]
LIVE_COLLECTION = "decisions"
REBUILD_PREFIX = f"{LIVE_COLLECTION}-rebuild-"
LEFTOVER_PREFIXES = (REBUILD_PREFIX, f"{LIVE_COLLECTION}-retired-")
BATCH = 256


async def _copy(
    services: Services,
    target: VectorIndex,
    query_ids: ColumnElement[bool],
    progress: Progress | None,
    total: int,
    before: int = 0,
) -> int:
    """Upsert the decisions ``query_ids`` selects (of one workspace) into ``target``'s own
    collection; returns how many. ``before``: how many earlier workspaces had, for progress."""
    done = 0
    last_id: str | None = None
    while True:
        async with services.db.transaction(write=False) as session:
            ids = await repository.ids_after(session, last_id, query_ids, BATCH)
            if not ids:
                return done
            rows = await load_decisions(session, ids)
        # the rebuilt collection is the target's own, whichever workspace it is for
        entries = [index_entry(rows[i]) for i in ids if i in rows]
        await target.upsert([replace(e, workspace=DEFAULT_WORKSPACE) for e in entries])
        done += len(ids)
        last_id = ids[-1]
        if progress is not None:
            progress(before + done, max(total, before + done))


async def reindex(services: Services, progress: Progress | None = None) -> int:
    """Rebuild each workspace's collection: into a fresh collection, switched live, caught
    up; returns the count indexed."""
    started = services.runtime.now() - timedelta(seconds=5)
    async with services.db.transaction(write=False) as session:
        total = await repository.count_decisions(session)
        workspaces = sorted({DEFAULT_WORKSPACE, *await repository.workspaces(session)})
    # What an earlier run that failed or was killed left behind: a partial copy, or an old
    # collection renamed aside. Both are derived data that this run rebuilds anyway.
    # (a workspace's own collection may start like another's leftover: "q-retired-1" is an id)
    live = [collection_name(LIVE_COLLECTION, w) for w in workspaces]
    retired = [f"{name}-retired-" for name in live]
    left = await services.index.drop_collections([*LEFTOVER_PREFIXES, *retired], keep=live)
    if left:
        log.warning(
            "dropped %d collection(s) left by an earlier reindex: %s", len(left), ", ".join(left)
        )
    count = 0
    for workspace in workspaces:
        count += await _rebuild(services, workspace, started, progress, total, count)
    if progress is not None:
        progress(count, count)
    return count


async def _rebuild(
    services: Services,
    workspace: str,
    started: datetime,
    progress: Progress | None,
    total: int,
    before: int,
) -> int:
    """Rebuild one workspace's collection; returns how many it holds."""
    target = services.index.sibling(f"{REBUILD_PREFIX}{uuid.uuid4().hex[:8]}")
    promoted = False
    mine = repository.of_workspace(workspace)
    try:
        count = await _copy(services, target, mine, progress, total, before)
        await target.promote(collection_name(LIVE_COLLECTION, workspace))
        promoted = True
        touched = repository.touched_since(workspace, started)
        await _copy(services, target, touched, None, 0)
    except BaseException:
        if not promoted:  # a partial copy, useless: best effort, the next run drops it too
            try:
                await services.index.drop_collections([target.name])
            except Exception:  # the failure that matters is being raised
                log.warning("could not drop the partial collection %s", target.name)
        raise
    finally:
        await target.aclose()
    return count
