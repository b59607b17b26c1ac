"""What each outbox event does: ``export`` writes the YAML file, ``index`` upserts the
vector index entry. Both are idempotent. The index entry is app.records.entries'; the YAML
file, and the check of which rows a review changed, are the decisions context's, handed in as
an ``Exports`` when the services are built (app.services), so that the outbox imports nothing
of that context, which imports the outbox to enqueue its events.

Each builds its document from the row first, then delivers it; a failure is classified by
app.outbox.failures (building: permanent, delivering: transient when a dependency was
unreachable), which decides what becomes of the event.

A pass holds the rows as it read them (or as the call that wrote them committed them), and a
review may be committed while it delivers them. A file is never replaced by an older row's
(app.decisions.export compares review times, which grow with the reviews' order), but an index
entry has nothing to compare: a pass with the older row could replace the entry that the
review's own pass upserted. So once the events are delivered, their rows are read again, and
the events of those a review has changed since are delivered again with the newer row
(``_catch_up``): the last upsert is then always of the latest version. The one exception is a
row with no review handed in by its caller, recordDecision's just-committed rows: nobody can
review a decision before the call that records it answers with its id, which it does after
this pass, so that path makes no second read."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Connection

from app.db.decisions import Decision
from app.db.outbox import EventKind
from app.records.entries import IndexEntry, index_entry
from app.records.repository import load_decisions

from .events import Event, Results
from .failures import ROW_GONE, Failure, FailureKind, classify, unknown_kind

if TYPE_CHECKING:
    from .loop import BackgroundRelay

log = logging.getLogger("cstp.outbox")


class ChangedRows(Protocol):
    def __call__(self, conn: Connection, decisions: Sequence[Decision]) -> list[str]: ...


@dataclass(frozen=True)
class Exports:
    """What the relay needs of the decisions context: ``render`` the YAML of a row, ``write``
    it under the decisions directory (atomically; an older row's never replaces a newer's),
    and ``changed_rows``, the ids of the rows given whose stored version a review has changed
    since they were read (in a connection of a read)."""

    render: Callable[[Decision], bytes]
    write: Callable[[Path, Decision, bytes], object]
    changed_rows: ChangedRows


def _logged(failure: Failure, what: str, exc: BaseException) -> Failure:
    """Log a failure: the traceback only for an unforeseen one (a permanent one's reason is
    the whole story, and a RecursionError's traceback is a thousand lines). A transient one
    (a dependency out of reach) only at DEBUG: the relay tells the outage once when it
    starts and once when it ends (``BackgroundRelay._note``), not once per event and try."""
    if failure.kind == FailureKind.UNKNOWN:
        log.error(
            "%s failed: %s", what, failure.error, exc_info=(type(exc), exc, exc.__traceback__)
        )
    elif failure.kind == FailureKind.TRANSIENT:
        log.debug("%s failed (%s): %s", what, failure.kind, failure.error)
    else:
        log.warning("%s failed (%s): %s", what, failure.kind, failure.error)
    return failure


def _export_one(exports: Exports, root: Path, decision: Decision) -> Failure | None:
    """Write the YAML file of ``decision`` under ``root``; None, or why it failed."""
    try:
        content = exports.render(decision)
    except Exception as exc:
        return _logged(classify(exc, building="the YAML file"), f"export of {decision.id}", exc)
    try:
        exports.write(root, decision, content)
    except Exception as exc:
        return _logged(classify(exc), f"export of {decision.id}", exc)
    return None


def _export_all(exports: Exports, root: Path, work: list[tuple[int, Decision]]) -> Results:
    return {event_id: _export_one(exports, root, decision) for event_id, decision in work}


# Rounds of reading the rows again before a pass leaves the rest to a later one: each round
# after the first means that yet another review was committed while the last was delivered.
MAX_CATCH_UP = 8
KEPT_CHANGING = Failure(FailureKind.TRANSIENT, "the decision kept changing while it was delivered")


async def run_events(
    relay: BackgroundRelay, events: list[Event], known: dict[str, Decision] | None = None
) -> Results:
    """Run ``events``; the value is None for success, else the failure for the table.

    ``known`` holds rows the caller already has (fully loaded); the rest are read."""
    decisions = dict(known or {})
    missing = sorted({e.decision_id for e in events} - set(decisions))
    if missing:
        try:
            async with relay.db.transaction(write=False) as session:
                decisions.update(await load_decisions(session, missing))
        except Exception as exc:
            failure = _logged(classify(exc), "reading the events' decisions", exc)
            return {e.id: failure for e in events}
    results = await _deliver(relay, events, decisions)
    await _catch_up(relay, events, decisions, results, set(known or ()))
    return results


async def _deliver(
    relay: BackgroundRelay, events: list[Event], decisions: dict[str, Decision]
) -> Results:
    results: Results = {}
    exports: list[tuple[int, Decision]] = []
    indexed: list[tuple[int, Decision]] = []
    for event in events:
        decision = decisions.get(event.decision_id)
        if decision is None:
            results[event.id] = ROW_GONE
        elif event.kind == EventKind.EXPORT:
            exports.append((event.id, decision))
        elif event.kind == EventKind.INDEX:
            indexed.append((event.id, decision))
        else:
            results[event.id] = unknown_kind(event.kind)
    jobs = []
    if exports:
        jobs.append(asyncio.to_thread(_export_all, relay.exports, relay.decisions_dir, exports))
    if indexed:
        jobs.append(_index_all(relay, indexed))
    for partial in await asyncio.gather(*jobs):
        results.update(partial)
    return results


async def _catch_up(
    relay: BackgroundRelay,
    events: list[Event],
    decisions: dict[str, Decision],
    results: Results,
    known: set[str],
) -> None:
    """Deliver again, with the row as it is now, the delivered events whose row a review
    changed during the delivery (see the module docstring); updates ``results``. ``known``:
    the ids of the rows the caller handed in."""

    def to_check(ran: list[Event]) -> list[Event]:
        return [
            e
            for e in ran
            if results.get(e.id) is None
            and (row := decisions.get(e.decision_id)) is not None
            and (row.outcome is not None or e.decision_id not in known)
        ]

    todo = to_check(events)
    for _ in range(MAX_CATCH_UP):
        if not todo:
            return
        rows = list({e.decision_id: decisions[e.decision_id] for e in todo}.values())
        try:
            changed = set(
                await relay.db.read(functools.partial(relay.exports.changed_rows, decisions=rows))
            )
            newer: dict[str, Decision] = {}
            if changed:
                async with relay.db.transaction(write=False) as session:
                    newer = await load_decisions(session, sorted(changed))
        except Exception as exc:
            failure = _logged(classify(exc), "reading the events' decisions again", exc)
            results.update(dict.fromkeys((e.id for e in todo), failure))
            return
        known -= changed
        for decision_id in changed:  # a row gone meanwhile makes its events ROW_GONE
            if decision_id in newer:
                decisions[decision_id] = newer[decision_id]
            else:
                del decisions[decision_id]
        again = [e for e in todo if e.decision_id in changed]
        results.update(await _deliver(relay, again, decisions))
        todo = to_check(again)
    if todo:
        log.warning(
            "%d outbox event(s) left to a later pass: their decision kept changing", len(todo)
        )
        results.update(dict.fromkeys((e.id for e in todo), KEPT_CHANGING))


async def _index_all(relay: BackgroundRelay, work: list[tuple[int, Decision]]) -> Results:
    results: Results = {}
    entries: dict[int, IndexEntry] = {}
    for event_id, decision in work:
        try:
            entries[event_id] = index_entry(decision)
        except Exception as exc:
            results[event_id] = _logged(
                classify(exc, building="the index entry"), f"indexing of {decision.id}", exc
            )
    if entries:
        try:
            await relay.index.upsert(list(entries.values()))
            failure = None
        except Exception as exc:
            failure = classify(exc)
            if failure.kind != FailureKind.TRANSIENT:  # an unreachable index logs that itself
                _logged(failure, "indexing", exc)
        results.update(dict.fromkeys(entries, failure))
    return results
