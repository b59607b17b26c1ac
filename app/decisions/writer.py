"""Group commit for recordDecision.

Concurrent recordDecision calls are written together: one transaction (one INSERT per table,
one COMMIT) and one outbox pass (one batch of YAML files, one index upsert). On SQLite every
write transaction holds the database's single write lock, and a transaction of one decision
held it for many round trips through the event loop; a group holds it once for all the
calls that queued while the previous group was written (and, after one turn of the event
loop, the calls whose requests arrived with the first). A lone call is a group of one.

While more calls are waiting to be committed, a committed group's outbox pass waits for
the next group's commit and both go together (up to MAX_GROUP decisions): an index upsert
has a fixed cost besides its cost per decision, and holds the interpreter lock, so fewer,
larger ones leave more time to everything else. When nothing waits, the pass starts at once
(docs/ARCHITECTURE.md, "Transactions").

Each call keeps its own outcome. When a group's transaction fails (a drawn id collides with
a stored one, say), every call in it is written again alone, in a transaction of its own that
redraws a colliding id, so one call's failure never fails another's. A failure raised after
the database committed (the connection lost as COMMIT was answered) is told apart by reading
the group's rows back: then the group counts as committed, and no decision is written twice.

The rows and their outbox events commit together, as everywhere (DESIGN: every outside
effect goes through the outbox); the pass after the commit is what makes ``indexed: true``
and the YAML file the normal case, and the outbox finishes whatever it could not do.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.decisions import Decision
from app.db.engine import Database
from app.db.outbox import EventKind, OutboxEvent
from app.errors import STORAGE_ERROR, CstpError
from app.guardrails.service import Staged, store
from app.outbox.relay import Relay
from app.runtime import Runtime

from . import repository

log = logging.getLogger("cstp.decisions")

MAX_GROUP = 64  # calls written in one transaction (and carried in one outbox pass) at most
MAX_ID_DRAWS = 20


@dataclass
class _Unit:
    build: Callable[[], Decision]  # a fresh, unsaved row (with reasons and tags) per call
    evaluation: Staged | None
    prepared: Awaitable[None]  # the embedding, computed while the rows are written
    future: asyncio.Future[tuple[Decision, bool]]


_Committed = list[tuple[_Unit, Decision, list[OutboxEvent]]]


class RecordWriter:
    def __init__(self, db: Database, relay: Relay, runtime: Runtime) -> None:
        self.db = db
        self.relay = relay
        self.runtime = runtime
        self._queue: deque[_Unit] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()

    async def write(
        self, build: Callable[[], Decision], evaluation: Staged | None, prepared: Awaitable[None]
    ) -> tuple[Decision, bool]:
        """Write one decision (and its guardrail evaluation); returns the committed row and
        whether it is in the vector index. Raises what its transaction raised."""
        loop = asyncio.get_running_loop()
        unit = _Unit(build, evaluation, prepared, loop.create_future())
        self._queue.append(unit)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush_loop())
        return await asyncio.shield(unit.future)

    async def drain(self) -> None:
        """Wait until everything queued now is written and delivered (shutdown, tests).
        Cancelling the wait leaves the work alone: its callers still get their answers."""
        while True:
            running = {
                t for t in (self._flusher, *self._deliveries) if t is not None and not t.done()
            }
            if not running:
                return
            await asyncio.wait(running)  # unlike gather, a cancelled wait cancels nothing

    async def _flush_loop(self) -> None:
        held: _Committed = []
        while self._queue:
            group: list[_Unit] = []
            built: _Committed = []
            try:
                # One turn of the loop first: calls whose requests have already arrived reach
                # the queue and join this group, instead of waiting for the commit of a first
                # call that came alone.
                await asyncio.sleep(0)
                group = [self._queue.popleft() for _ in range(min(MAX_GROUP, len(self._queue)))]
                committed = await self._commit_group(group, built)
            except asyncio.CancelledError:
                for unit in group:
                    _fail(unit, CstpError(STORAGE_ERROR, "Storage error: server shutting down"))
                for unit, decision, _events in held:  # committed: the outbox finishes them
                    if not unit.future.done():
                        unit.future.set_result((decision, False))
                raise
            except Exception as exc:  # every call learns its outcome below
                committed = await self._after_failed_group(group, built, exc)
            held.extend(committed)
            if held and (not self._queue or len(held) >= MAX_GROUP):
                task = asyncio.get_running_loop().create_task(self._deliver(held))
                self._deliveries.add(task)
                task.add_done_callback(self._deliveries.discard)
                held = []

    async def _after_failed_group(
        self, group: list[_Unit], built: _Committed, exc: Exception
    ) -> _Committed:
        """What a failed group's calls become. A failure can come after the database has
        committed (the connection lost while COMMIT was answered): when every row of the
        group is there, the group is committed, and writing it again would record each
        decision twice. Otherwise each call is written alone (a colliding id, say)."""
        if len(built) == len(group) and not isinstance(exc, IntegrityError):
            try:
                if await self._all_stored([d for _, d, _ in built]):
                    log.warning(
                        "a group of %d decisions was committed although its commit raised %s",
                        len(group),
                        type(exc).__name__,
                    )
                    return built
            except Exception as check:  # unknown: never risk a second copy
                log.warning(
                    "could not tell whether a failed group of %d decisions was committed",
                    len(group),
                    exc_info=True,
                )
                for unit in group:
                    _fail(unit, check)
                return []
        log.info("a group of %d decisions failed; writing each alone", len(group))
        committed: _Committed = []
        for unit in group:
            try:
                committed.append(await self._commit_alone(unit))
            except Exception as failure:  # it is that call's outcome
                _fail(unit, failure)
        return committed

    async def _all_stored(self, decisions: list[Decision]) -> bool:
        """Whether every one of ``decisions`` is in the database: same id and same creation
        time (a colliding id is another decision, recorded at another moment)."""
        wanted = {d.id: d.created_at for d in decisions}
        async with self.db.transaction(write=False) as session:
            found = await repository.created_at_of(session, list(wanted))
        return all(found.get(i) == when for i, when in wanted.items())

    async def _commit_group(self, group: list[_Unit], built: _Committed) -> _Committed:
        """One transaction for the group; it also records the outbox results of earlier
        groups, which would otherwise need a write transaction of their own. ``built`` gets
        each call's row and events as they are added, for a caller whose commit raised."""
        undo_settle: Callable[[], None] = _nothing
        try:
            async with self.db.transaction(write=True) as session:
                await store(session, [u.evaluation for u in group if u.evaluation is not None])
                committed = built
                for unit in group:
                    # A colliding id fails the group, which is then written call by call.
                    decision = unit.build()
                    decision.id = self.runtime.decision_id()
                    repository.add_decision(session, decision)
                    committed.append((unit, decision, self.relay.enqueue(session, decision.id)))
                await session.flush()
                undo_settle = await self.relay.settle_in(session)
        except BaseException:
            undo_settle()
            raise
        return committed

    async def _commit_alone(self, unit: _Unit) -> tuple[_Unit, Decision, list[OutboxEvent]]:
        async with self.db.transaction(write=True) as session:
            if unit.evaluation is not None:
                await store(session, [unit.evaluation])
            decision = unit.build()
            await self._insert_with_fresh_id(session, decision)
            events = self.relay.enqueue(session, decision.id)
            await session.flush()
        return unit, decision, events

    async def _insert_with_fresh_id(self, session: AsyncSession, decision: Decision) -> None:
        """Draw ids until one is free; a collision is detected by the primary key, never an
        overwrite, even when two transactions draw the same id at once."""
        for _ in range(MAX_ID_DRAWS):
            decision.id = self.runtime.decision_id()
            if await repository.try_insert(session, decision):
                return
        raise CstpError(STORAGE_ERROR, "Storage error: no free decision id could be drawn")

    async def _deliver(self, committed: _Committed) -> None:
        """The outbox pass for a committed group, then each call's answer."""
        await asyncio.gather(*(unit.prepared for unit, _, _ in committed), return_exceptions=True)
        events = [event for _, _, unit_events in committed for event in unit_events]
        try:
            stats = await self.relay.process(events, [decision for _, decision, _ in committed])
            done = set(stats.done_ids)
        except Exception:
            # The rows and their events are committed; the outbox finishes what failed here.
            log.exception("outbox pass after recordDecision failed")
            done = set()
        for unit, decision, unit_events in committed:
            index_event = next(e.id for e in unit_events if e.kind == EventKind.INDEX)
            if not unit.future.done():
                unit.future.set_result((decision, index_event in done))


def _nothing() -> None:
    """What there is to undo before anything was settled."""


def _fail(unit: _Unit, exc: BaseException) -> None:
    if not unit.future.done():
        unit.future.set_exception(exc)
