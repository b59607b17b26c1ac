"""The outbox relay: carries committed decisions to the YAML tree and the vector index.

Events are written in the same transaction as the rows they describe. The writer leases its
own events (``available_at`` in the future) and processes them right after commit: the inline
pass, held here (``enqueue``, ``process``). If that fails, or the process dies, the lease runs
out and the background loop (app.outbox.loop, or ``cstp outbox drain``) takes them. Claims
are leases taken in a write transaction — with ``FOR UPDATE SKIP LOCKED`` on Postgres — so
two relays never work on one event at once. Handlers are idempotent (atomic file replace,
upsert by id), so a repeat is harmless.

A failed event is retried with backoff; what a failure means (retried forever, dead at once,
or dead after CSTP_OUTBOX_MAX_ATTEMPTS) is decided in app.outbox.failures, and what a pass's
results make of its events in app.outbox.events (``settle``). The relay notices a dependency
coming back (the first success of a kind after a transient failure) and makes the events
waiting on it due at once (``_note``, ``_revive``, in app.outbox.loop). The inline pass's
results are recorded off the caller's path (``_settle_later``, ``settle_in``). The operators'
queries (counts, progress, ``cstp outbox retry``) are in app.outbox.admin.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.decisions import Decision
from app.db.outbox import EventKind, OutboxEvent, Status
from app.observability import spans

from . import repository
from .events import Event, RelayStats, Results
from .handlers import Exports, run_events
from .loop import LEASE, BackgroundRelay

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.runtime import Runtime
    from app.search.index import VectorIndex

log = logging.getLogger("cstp.outbox")

SETTLE_LINGER = 0.05  # seconds inline results wait for a write transaction to carry them


class Relay(BackgroundRelay):
    """The relay of a process: the inline pass, on top of the background loop."""

    def __init__(
        self,
        db: Database,
        index: VectorIndex,
        settings: Settings,
        runtime: Runtime,
        *,
        exports: Exports,
    ) -> None:
        super().__init__(db, index, settings, runtime, exports=exports)
        self._unsettled: list[tuple[list[Event], Results]] = []
        self._settler: asyncio.Task[None] | None = None

    def enqueue(
        self,
        session: AsyncSession,
        decision_id: str,
        workspace: str,
        kinds: Sequence[EventKind] = tuple(EventKind),
        *,
        leased: bool = True,
    ) -> list[OutboxEvent]:
        """Add events for the decision ``decision_id`` of ``workspace``, leased to this
        process for the inline pass, or due at once (``leased=False``) for whichever relay
        claims them first."""
        now = self.runtime.now()
        events = [
            OutboxEvent(
                kind=kind,
                decision_id=decision_id,
                workspace=workspace,
                status=Status.PENDING,
                attempts=0,
                unknown_failures=0,
                created_at=now,
                available_at=now + LEASE if leased else now,
            )
            for kind in kinds
        ]
        repository.add_events(session, events)
        return events

    async def process(
        self, events: Sequence[OutboxEvent], decisions: Sequence[Decision] = ()
    ) -> RelayStats:
        """Process events this process holds the lease of (the inline pass after commit).

        ``decisions`` are the just-committed rows, when the caller has them, so they are not
        read back; they are exactly what was committed. An event whose lease has run out, or
        nearly (a pass held up by a stalled index or a busy machine), is taken back first
        (``_retake``) and left alone when another relay claimed it meanwhile."""
        with spans.span("outbox process", {"cstp.outbox.events": len(events)}):
            events = await self._retake(events)
            work = [
                Event.of(e.id, e.kind, e.decision_id, e.attempts, e.unknown_failures)
                for e in events
            ]
            results = await run_events(self, work, {d.id: d for d in decisions})
            self._note(work, results)
            self._settle_later(work, results)
            return self._settlement(work, results, self.runtime.now()).stats()

    async def _retake(self, events: Sequence[OutboxEvent]) -> list[OutboxEvent]:
        """The events still ours: those with at least half their lease left as they are, the
        others only when a conditional update renews the lease this process took (the row
        still holds that lease's end: no relay has claimed the event since)."""
        now = self.runtime.now()
        late = [e for e in events if e.available_at - now < LEASE / 2]
        if not late:
            return list(events)
        lost: set[int] = set()
        async with self.db.transaction(write=True) as session:
            for event in late:
                renewed = await repository.renew_lease(
                    session, event.id, event.available_at, now + LEASE
                )
                if renewed != 1:
                    lost.add(event.id)
        for event in late:
            if event.id not in lost:
                event.available_at = now + LEASE
        if lost:
            log.warning(
                "%d outbox event(s) left to the relay that claimed them when their lease ran out",
                len(lost),
            )
        return [e for e in events if e.id not in lost]

    def _settle_later(self, events: list[Event], results: Results) -> None:
        """Record the inline pass's results off the caller's path, batched with others.

        The caller's answer depends only on what was done, not on the bookkeeping; should
        the process die first, the lease runs out and the (idempotent) work is done again.
        The next write transaction that comes along records them (``settle_in``); what none
        takes within SETTLE_LINGER gets a transaction of its own."""
        self._unsettled.append((events, results))
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle_loop())

    async def _settle_loop(self) -> None:
        while self._unsettled:
            await asyncio.sleep(SETTLE_LINGER)
            batch = self._take_unsettled()
            if not batch:
                continue
            try:
                await self._settle(*batch)
            except Exception:
                log.exception("could not record outbox results; leases will expire and retry")

    def _take_unsettled(self) -> tuple[list[Event], Results] | None:
        batch, self._unsettled = self._unsettled, []
        if not batch:
            return None
        events = [e for work, _ in batch for e in work]
        results = {k: v for _, res in batch for k, v in res.items()}
        return events, results

    async def settle_in(self, session: AsyncSession) -> Callable[[], None]:
        """Record pending inline results in ``session`` (a write transaction that is about to
        commit anyway). Returns an undo to call if that transaction fails: the results are
        then queued again."""
        batch = self._take_unsettled()
        if batch is None:
            return lambda: None
        await self._record_results(session, *batch)

        def undo() -> None:
            self._settle_later(*batch)

        return undo

    async def flush(self) -> None:
        """Wait until the results of inline passes are recorded (shutdown, tests)."""
        while self._settler is not None and not self._settler.done():
            await asyncio.shield(self._settler)
