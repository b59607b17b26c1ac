"""The relay's background loop, and what every pass shares with the inline pass.

What the inline pass (app.outbox.relay) leaves behind — a failure, a lease that ran out, a
process that died — is taken here. ``loop`` wakes on a timer (CSTP_OUTBOX_POLL_SECONDS) or
when poked (``wakeup``) and runs ``run_due``: claim due events (a lease taken in a write
transaction, with ``FOR UPDATE SKIP LOCKED`` on Postgres) and process them. ``drain`` runs
such passes until none makes progress (``cstp outbox drain``).

Every pass, inline or not, tells ``_note`` which kinds worked, so that a dependency coming back
has the events waiting on it made due at once (``_revive``), and writes what its results make
of its events (``_record_results``, by ``settle`` of app.outbox.events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.outbox import EventKind, Status

from . import repository
from .events import Event, RelayStats, Results, Settlement, settle
from .failures import NOT_RUN, FailureKind
from .handlers import Exports, run_events

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.runtime import Runtime
    from app.search.index import VectorIndex

log = logging.getLogger("cstp.outbox")

LEASE = timedelta(seconds=30)


class BackgroundRelay:
    """The background half of a relay: what it works with, its watch on dependencies, its
    passes over due events and the recording of any pass's results. ``Relay``
    (app.outbox.relay) adds the inline pass; a process builds that one."""

    def __init__(
        self,
        db: Database,
        index: VectorIndex,
        settings: Settings,
        runtime: Runtime,
        *,
        exports: Exports,
    ) -> None:
        self.db = db
        self.index = index
        self.exports = exports
        self.settings = settings
        self.runtime = runtime
        self.decisions_dir: Path = settings.decisions_dir
        self.wakeup = asyncio.Event()
        # Kinds whose dependency may be down (a transient failure seen, or unknown: events
        # of an earlier process may be waiting), and kinds seen working again since.
        self._down: set[str] = set(EventKind)
        self._back: set[str] = set()
        # Kinds failing for an unreachable dependency, as the log has told, with their failed
        # attempts since; and those that came back, with theirs, until ``_revive`` tells it.
        self._failing: dict[str, int] = {}
        self._recovered: dict[str, int] = {}

    def _note(self, work: Sequence[Event], results: Results) -> None:
        """Notice a dependency coming back: a kind that worked after a transient failure of
        its kind (or for the first time in this process) gets its waiting events made due at
        once by the next pass (``_revive``), which is started now; they need not wait out
        their backoff."""
        failed: set[str] = set()
        for w in work:
            failure = results.get(w.id, NOT_RUN)
            if failure is not None and failure.kind == FailureKind.TRANSIENT:
                failed.add(w.kind)
                self._count_failure(w.kind, failure.error)
        worked = {w.kind for w in work if results.get(w.id, NOT_RUN) is None}
        back = (worked - failed) & self._down
        self._down = (self._down - back) | failed
        for kind in back & self._failing.keys():
            self._recovered[kind] = self._recovered.get(kind, 0) + self._failing.pop(kind)
        if back:
            self._back |= back
            self.wakeup.set()

    def _count_failure(self, kind: str, error: str) -> None:
        """An outage of a kind's dependency is one line when it starts (here) and one when it
        ends (``_revive``), with the attempts that failed meanwhile: not a line per event."""
        if kind not in self._failing:
            self._failing[kind] = 0
            log.warning(
                "outbox: %s events wait: %s; retried until it works (failures are counted, "
                "not logged, until then)",
                kind,
                error,
            )
        self._failing[kind] += 1

    async def _revive(self) -> None:
        """Make the events waiting on a dependency that came back (``_note``) due now.

        Only events at rest: a relay's claim clears ``failure_kind``, so an event under a
        lease is never made due under the relay working on it."""
        if not self._back:
            return
        kinds, self._back = sorted(self._back), set()
        recovered = {k: self._recovered.pop(k) for k in kinds if k in self._recovered}
        now = self.runtime.now()
        try:
            async with self.db.transaction(write=True) as session:
                revived = await repository.make_waiting_due(session, kinds, now)
        except BaseException:
            self._back.update(kinds)
            self._recovered.update(recovered)
            raise
        if recovered:
            log.warning(
                "outbox: %s works again after %s: %d waiting event(s) are due now",
                " and ".join(recovered),
                " and ".join(f"{n} failed attempt(s)" for n in recovered.values()),
                revived,
            )
        elif revived:
            log.info(
                "%s works again: %d waiting outbox event(s) are due now",
                " and ".join(kinds),
                revived,
            )

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
                # A pass whose events only failed says nothing new: an unreachable
                # dependency is told by ``_note``, any other failure by the handlers.
                if stats.done or stats.dead:
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
            return await repository.claim_due(session, limit, horizon, now + LEASE)

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
            await repository.mark_done(session, settlement.done, now)
        for failed in settlement.failed:
            event, failure, after = failed
            if after.status == Status.DEAD:
                log.error(
                    "outbox event #%d (%s of decision %s) is dead: %s",
                    event.id,
                    event.kind,
                    event.decision_id,
                    failure.error,
                )
            await repository.mark_failed(session, failed)
        return settlement
