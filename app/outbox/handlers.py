"""What each outbox event does: ``export`` writes the YAML file, ``index`` upserts the
vector index entry. Both are idempotent and both build from app.decisions.document."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from app.db.decisions import Decision
from app.decisions.document import index_entry, load_decisions
from app.decisions.export import export_decision
from app.search.index import IndexUnavailable

if TYPE_CHECKING:
    from .relay import Relay

log = logging.getLogger("cstp.outbox")

Event = tuple[int, str, str, int]  # id, kind, decision id, attempts


def _export_all(root: Path, work: list[tuple[int, Decision]]) -> dict[int, str | None]:
    results: dict[int, str | None] = {}
    for event_id, decision in work:
        try:
            export_decision(root, decision)
            results[event_id] = None
        except OSError as exc:
            log.warning("export of %s failed: %s", decision.id, exc)
            results[event_id] = f"export failed: {exc.strerror or type(exc).__name__}"
        except Exception as exc:
            log.exception("export of %s failed", decision.id)
            results[event_id] = f"export failed: {type(exc).__name__}"
    return results


async def run_events(
    relay: Relay, events: list[Event], known: dict[str, Decision] | None = None
) -> dict[int, str | None]:
    """Run ``events``; the value is None for success, else a short error for the table.

    ``known`` holds rows the caller already has (fully loaded); the rest are read."""
    decisions = dict(known or {})
    missing = sorted({e[2] for e in events} - set(decisions))
    if missing:
        async with relay.db.transaction(write=False) as session:
            decisions.update(await load_decisions(session, missing))
    results: dict[int, str | None] = {}
    exports: list[tuple[int, Decision]] = []
    indexed: list[tuple[int, Decision]] = []
    for event_id, kind, decision_id, _attempts in events:
        decision = decisions.get(decision_id)
        if decision is None:
            results[event_id] = "decision not found"
        elif kind == "export":
            exports.append((event_id, decision))
        elif kind == "index":
            indexed.append((event_id, decision))
        else:
            results[event_id] = f"unknown event kind {kind!r}"
    jobs = []
    if exports:
        jobs.append(asyncio.to_thread(_export_all, relay.decisions_dir, exports))
    if indexed:
        jobs.append(_index_all(relay, indexed))
    for partial in await asyncio.gather(*jobs):
        results.update(partial)
    return results


async def _index_all(relay: Relay, work: list[tuple[int, Decision]]) -> dict[int, str | None]:
    try:
        entries = {d.id: index_entry(d) for _eid, d in work}
        await relay.index.upsert(list(entries.values()))
    except IndexUnavailable:
        return {eid: "vector index unavailable" for eid, _d in work}
    except Exception as exc:
        log.exception("indexing failed")
        return {eid: f"index failed: {type(exc).__name__}" for eid, _d in work}
    return {eid: None for eid, _d in work}
