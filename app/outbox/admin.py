"""The outbox for operators: counts for /ready, what ``cstp outbox`` shows and why, how far
the events of ``cstp import`` got, and ``cstp outbox retry``. Never on a call's path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from app.db.outbox import EventKind, OutboxEvent, Status
from app.runtime import iso

from . import repository
from .failures import FailureKind

if TYPE_CHECKING:
    from app.services import Services

_CHUNK = 500  # decision ids per query in progress_of


class Counts(TypedDict):
    """Events by status (``checks.outbox`` of /ready)."""

    pending: int
    dead: int
    done: int


class Progress(NamedTuple):
    """How far the events of some decisions got."""

    done: int
    working: int  # a relay holds their lease: being worked on now
    left: int  # left to a retry (or dead)


async def counts(services: Services) -> Counts:
    async with services.db.transaction(write=False) as session:
        found = await repository.count_by_status(session)
    return Counts(
        pending=found.get(Status.PENDING, 0),
        dead=found.get(Status.DEAD, 0),
        done=found.get(Status.DONE, 0),
    )


async def counts_by_kind(services: Services) -> dict[tuple[str, str], int]:
    """Events by (kind, status), every kind and status this server writes included at 0
    (the metrics' ``cstp_outbox_events``; summed over kinds, ``counts``)."""
    async with services.db.transaction(write=False) as session:
        found = await repository.count_by_kind_and_status(session)
    every = {(kind.value, status.value): 0 for kind in EventKind for status in Status}
    return every | found


def progress(rows: Iterable[tuple[str, int, datetime]], now: datetime) -> Progress:
    """``Progress`` of events given as (status, attempts, available_at): one not done is
    being worked on while a lease on it runs (never attempted, due in the future), else it
    is left to a retry (or dead)."""
    done = working = left = 0
    for status, attempts, available_at in rows:
        if status == Status.DONE:
            done += 1
        elif status == Status.PENDING and attempts == 0 and available_at > now:
            working += 1
        else:
            left += 1
    return Progress(done, working, left)


async def progress_of(services: Services, decision_ids: Sequence[str]) -> Progress:
    """``Progress`` of the events of ``decision_ids``, now."""
    now = services.runtime.now()
    rows: list[tuple[str, int, datetime]] = []
    async with services.db.transaction(write=False) as session:
        for start in range(0, len(decision_ids), _CHUNK):
            rows.extend(await repository.states_of(session, decision_ids[start : start + _CHUNK]))
    return progress(rows, now)


async def retry_dead(services: Services) -> int:
    """Re-queue dead events (``cstp outbox retry``), due now; wakes this process's relay."""
    now = services.runtime.now()
    async with services.db.transaction(write=True) as session:
        revived = await repository.requeue_dead(session, now)
    services.relay.wakeup.set()
    return revived


def why(event: OutboxEvent) -> str:
    """Why an event is dead, or what a pending one is waiting for, in a few words."""
    error = event.last_error or "no error recorded"
    if event.status == Status.DEAD:
        if event.failure_kind == FailureKind.PERMANENT:
            return f"dead: can never succeed as it is: {error}"
        if event.failure_kind == FailureKind.UNKNOWN:
            return (
                f"dead: failed {event.unknown_failures} time(s) in an unforeseen way "
                f"(CSTP_OUTBOX_MAX_ATTEMPTS): {error}"
            )
        return f"dead: {error}"
    if event.failure_kind == FailureKind.TRANSIENT:
        return f"waiting for a dependency, retried until it works: {error}"
    if event.last_error:
        return f"retrying after: {error}"
    return ""


async def describe(services: Services, limit: int = 50) -> list[str]:
    """What ``cstp outbox`` prints: the counts, then pending and dead events with ``why``."""
    total = await counts(services)
    lines = [f"pending: {total['pending']}  dead: {total['dead']}  done: {total['done']}"]
    async with services.db.transaction(write=False) as session:
        for e in await repository.pending_and_dead(session, limit):
            reason = why(e)
            lines.append(
                f"#{e.id} {e.status:<7} {e.kind:<6} decision {e.decision_id} "
                f"attempts {e.attempts} next {iso(e.available_at)}"
                + (f" {reason}" if reason else "")
            )
    if total["dead"]:
        lines.append(
            "dead events are never retried by themselves: fix what the reason names (see "
            'docs/OPERATIONS.md, "Outbox"), then `cstp outbox retry` re-queues them'
        )
    return lines
