"""Rebuild the vector index from the database (``cstp reindex``).

The index is derived data. The rebuild writes into a NEW collection while the live one keeps
answering queries, then switches the name over. Decisions recorded or reviewed while it ran
went to the old collection, so a catch-up pass re-indexes everything touched since the start.
Documents are built by app.records.entries, the same function every write path uses.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement

from app.records.entries import index_entry
from app.records.repository import load_decisions

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
    query_ids: ColumnElement[bool] | None,
    progress: Progress | None,
    total: int,
) -> int:
    done = 0
    last_id: str | None = None
    while True:
        async with services.db.transaction(write=False) as session:
            ids = await repository.ids_after(session, last_id, query_ids, BATCH)
            if not ids:
                return done
            rows = await load_decisions(session, ids)
        await target.upsert([index_entry(rows[i]) for i in ids if i in rows])
        done += len(ids)
        last_id = ids[-1]
        if progress is not None:
            progress(done, max(total, done))


async def reindex(services: Services, progress: Progress | None = None) -> int:
    """Rebuild into a fresh collection, switch it live, catch up; returns the count indexed."""
    started = services.runtime.now() - timedelta(seconds=5)
    async with services.db.transaction(write=False) as session:
        total = await repository.count_decisions(session)
    # What an earlier run that failed or was killed left behind: a partial copy, or the old
    # collection renamed aside. Both are derived data that this run rebuilds anyway.
    left = await services.index.drop_collections(LEFTOVER_PREFIXES)
    if left:
        log.warning(
            "dropped %d collection(s) left by an earlier reindex: %s", len(left), ", ".join(left)
        )
    target = services.index.sibling(f"{REBUILD_PREFIX}{uuid.uuid4().hex[:8]}")
    promoted = False
    try:
        count = await _copy(services, target, None, progress, total)
        await target.promote(LIVE_COLLECTION)
        promoted = True
        touched = repository.touched_since(started)
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
    if progress is not None:
        progress(count, count)
    return count
