"""The outbox relay: carries committed decisions to the YAML tree and the vector index.

Events are written in the same transaction as the rows they describe. The writer leases its
own events (``available_at`` in the future) and processes them right after commit; if that
fails, or the process dies, the lease runs out and the background loop (or ``cstp outbox
drain``) takes them. Claims are leases taken in a write transaction — with
``FOR UPDATE SKIP LOCKED`` on Postgres — so two relays never work on one event at once.
Handlers are idempotent (atomic file replace, upsert by id), so a repeat is harmless.

A failed event is retried with backoff; what a failure means (retried forever, dead at once,
or dead after CSTP_OUTBOX_MAX_ATTEMPTS) is decided in app.outbox.failures, and what a pass's
results make of its events in app.outbox.events (``settle``). The relay notices a dependency
coming back (the first success of a kind after a transient failure) and makes the events
waiting on it due at once (``_note``, ``_revive``). The operators' queries (counts, progress,
``cstp outbox retry``) are in app.outbox.admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.decisions import Decision
from app.db.outbox import EventKind, OutboxEvent, Status, updated

from .events import Event, RelayStats, Results, Settlement, settle
from .failures import NOT_RUN, FailureKind
from .handlers import run_events

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.runtime import Runtime
    from app.search.index import VectorIndex

log = logging.getLogger("cstp.outbox")

LEASE = timedelta(seconds=30)
SETTLE_LINGER = 0.05  # seconds inline results wait for a write transaction to carry them


class Relay:
    def __init__(
        self, db: Database, index: VectorIndex, settings: Settings, runtime: Runtime
    ) -> None:
        self.db = db
        self.index = index
        self.settings = settings
        self.runtime = runtime
        self.decisions_dir: Path = settings.decisions_dir
        self.wakeup = asyncio.Event()
        self._unsettled: list[tuple[list[Event], Results]] = []
        self._settler: asyncio.Task[None] | None = None
        # Kinds whose dependency may be down (a transient failure seen, or unknown: events
        # of an earlier process may be waiting), and kinds seen working again since.
        self._down: set[str] = set(EventKind)
        self._back: set[str] = set()

    def enqueue(
        self,
        session: AsyncSession,
        decision_id: str,
        kinds: Sequence[EventKind] = tuple(EventKind),
        *,
        leased: bool = True,
    ) -> list[OutboxEvent]:
        """Add events for ``decision_id``, leased to this process for the inline pass, or
        due at once (``leased=False``) for whichever relay claims them first."""
        now = self.runtime.now()
        events = [
            OutboxEvent(
                kind=kind,
                decision_id=decision_id,
                status=Status.PENDING,
                attempts=0,
                unknown_failures=0,
                created_at=now,
                available_at=now + LEASE if leased else now,
            )
            for kind in kinds
        ]
        session.add_all(events)
        return events

    async def process(
        self, events: Sequence[OutboxEvent], decisions: Sequence[Decision] = ()
    ) -> RelayStats:
        """Process events this process holds the lease of (the inline pass after commit).

        ``decisions`` are the just-committed rows, when the caller has them, so they are not
        read back; they are exactly what was committed. An event whose lease has run out, or
        nearly (a pass held up by a stalled index or a busy machine), is taken back first
        (``_retake``) and left alone when another relay claimed it meanwhile."""
        events = await self._retake(events)
        work = [
            Event.of(e.id, e.kind, e.decision_id, e.attempts, e.unknown_failures) for e in events
        ]
        results = await run_events(self, work, {d.id: d for d in decisions})
        self._note(work, results)
        self._settle_later(work, results)
        return self._settlement(work, results, self.runtime.now()).stats()

    def _note(self, work: Sequence[Event], results: Results) -> None:
        """Notice a dependency coming back: a kind that worked after a transient failure of
        its kind (or for the first time in this process) gets its waiting events made due at
        once by the next pass (``_revive``), which is started now; they need not wait out
        their backoff."""
        failed = {
            w.kind
            for w in work
            if (f := results.get(w.id, NOT_RUN)) is not None and f.kind == FailureKind.TRANSIENT
        }
        worked = {w.kind for w in work if results.get(w.id, NOT_RUN) is None}
        back = (worked - failed) & self._down
        self._down = (self._down - back) | failed
        if back:
            self._back |= back
            self.wakeup.set()

    async def _revive(self) -> None:
        """Make the events waiting on a dependency that came back (``_note``) due now.

        Only events at rest: a relay's claim clears ``failure_kind``, so an event under a
        lease is never made due under the relay working on it."""
        if not self._back:
            return
        kinds, self._back = sorted(self._back), set()
        now = self.runtime.now()
        try:
            async with self.db.transaction(write=True) as session:
                revived = await updated(
                    session,
                    update(OutboxEvent)
                    .where(
                        OutboxEvent.status == Status.PENDING,
                        OutboxEvent.kind.in_(kinds),
                        OutboxEvent.failure_kind == FailureKind.TRANSIENT,
                        OutboxEvent.available_at > now,
                    )
                    .values(available_at=now),
                )
        except BaseException:
            self._back.update(kinds)
            raise
        if revived:
            log.info(
                "%s works again: %d waiting outbox event(s) are due now",
                " and ".join(kinds),
                revived,
            )

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
                renewed = await updated(
                    session,
                    update(OutboxEvent)
                    .where(
                        OutboxEvent.id == event.id,
                        OutboxEvent.status == Status.PENDING,
                        OutboxEvent.available_at == event.available_at,
                    )
                    .values(available_at=now + LEASE),
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

    async def run_due(
        self, limit: int = 200, *, leased_until: datetime | None = None
    ) -> RelayStats:
        """Claim up to ``limit`` due events and process them; ``leased_until`` also takes
        events whose lease runs out by then. Events waiting on a dependency that has just
        come back are made due first."""
        await self._revive()
        claimed = await self._claim(limit, leased_until=leased_until)
        if not claimed:
            return RelayStats()
        return await self._process(claimed)

    async def drain(self, *, include_leased: bool = False) -> RelayStats:
        """Process every due pending event now (``cstp outbox drain``); stops when none is
        left or a pass makes no progress (the failures are then rescheduled with backoff).

        Events under a lease belong to the relay holding it (a server processing them right
        after its commit) and are left alone, so two relays never work on one event at once.
        ``include_leased`` takes them too, every one leased when the drain starts: only for
        when no server is running (a crashed server's leases would otherwise wait out LEASE).
        An event that fails in one pass may then be tried again in the next."""
        leased_until = self.runtime.now() + LEASE if include_leased else None
        total = RelayStats()
        while True:
            stats = await self.run_due(leased_until=leased_until)
            total.done += stats.done
            total.failed += stats.failed
            total.dead += stats.dead
            if stats.done == 0:
                return total

    async def loop(self) -> None:
        """Background retries: wake on a timer (or when poked) and run what is due."""
        while True:
            try:
                stats = await self.run_due()
                if stats.done or stats.failed:
                    log.info(
                        "outbox pass: %d done, %d failed, %d dead",
                        stats.done,
                        stats.failed,
                        stats.dead,
                    )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox pass failed")
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation
            # that comes in the same turn as a poke (it returns the finished wait), and a
            # shutdown would then wait for this loop for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.outbox_poll_seconds):
                    await self.wakeup.wait()
            self.wakeup.clear()

    async def _claim(self, limit: int, *, leased_until: datetime | None) -> list[Event]:
        now = self.runtime.now()
        horizon = max(now, leased_until) if leased_until is not None else now
        async with self.db.transaction(write=True) as session:
            query = (
                select(
                    OutboxEvent.id,
                    OutboxEvent.kind,
                    OutboxEvent.decision_id,
                    OutboxEvent.attempts,
                    OutboxEvent.unknown_failures,
                )
                .where(OutboxEvent.status == Status.PENDING, OutboxEvent.available_at <= horizon)
                .order_by(OutboxEvent.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            rows = [Event.of(*r) for r in (await session.execute(query)).all()]
            if rows:
                await session.execute(
                    update(OutboxEvent)
                    .where(OutboxEvent.id.in_([r.id for r in rows]))
                    .values(available_at=now + LEASE, failure_kind=None)
                )
        return rows

    async def _process(self, events: list[Event]) -> RelayStats:
        results = await run_events(self, events)
        self._note(events, results)
        return await self._settle(events, results)

    def _settlement(self, events: list[Event], results: Results, now: datetime) -> Settlement:
        return settle(events, results, now=now, max_attempts=self.settings.outbox_max_attempts)

    async def _settle(self, events: list[Event], results: Results) -> RelayStats:
        """Mark what worked done and reschedule (or bury) what did not, in one transaction."""
        async with self.db.transaction(write=True) as session:
            settlement = await self._record_results(session, events, results)
        return settlement.stats()

    async def _record_results(
        self, session: AsyncSession, events: list[Event], results: Results
    ) -> Settlement:
        """Write what ``results`` make of ``events`` (``settle``), as of now."""
        now = self.runtime.now()
        settlement = self._settlement(events, results, now)
        if settlement.done:
            await session.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id.in_(settlement.done), OutboxEvent.status == Status.PENDING)
                .values(
                    status=Status.DONE,
                    processed_at=now,
                    last_error=None,
                    failure_kind=None,
                )
            )
        for event, failure, after in settlement.failed:
            if after.status == Status.DEAD:
                log.error(
                    "outbox event #%d (%s of decision %s) is dead: %s",
                    event.id,
                    event.kind,
                    event.decision_id,
                    failure.error,
                )
            await session.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id == event.id, OutboxEvent.status == Status.PENDING)
                .values(
                    attempts=after.attempts,
                    unknown_failures=after.unknown_failures,
                    last_error=failure.error[:2000],
                    failure_kind=failure.kind,
                    status=after.status,
                    available_at=after.available_at,
                )
            )
        return settlement
