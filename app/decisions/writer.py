"""Batched commits for recordDecision.

Concurrent recordDecision calls are written together (app.batches: why batches, and what a
lone call costs): one transaction (one INSERT per table, one COMMIT), then one outbox pass
(one batch of YAML files, one index upsert) for the decisions committed while the previous
pass ran.

Each call keeps its own outcome. When a batch's transaction fails (a drawn id collides with
a stored one, say), every call in it is written again alone, in a transaction of its own that
redraws a colliding id, so one call's failure never fails another's. A failure raised after
the database committed (the connection lost as COMMIT was answered) is told apart by reading
the batch's rows back: then the batch counts as committed, and no decision is written twice.

The rows and their outbox events commit together, as everywhere (DESIGN: every outside
effect goes through the outbox); the pass after the commit is what makes ``indexed: true``
and the YAML file the normal case, and the outbox finishes whatever it could not do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.batches import Batcher
from app.db.decisions import Decision
from app.db.engine import Database
from app.db.outbox import EventKind, OutboxEvent
from app.errors import STORAGE_ERROR, CstpError
from app.guardrails.service import Staged, store
from app.outbox.relay import Relay
from app.runtime import Runtime

from . import repository

log = logging.getLogger("cstp.decisions")

MAX_ID_DRAWS = 20


@dataclass
class _Unit:
    build: Callable[[], Decision]  # a fresh, unsaved row (with reasons and tags) per call
    evaluation: Staged | None
    prepared: Awaitable[None]  # the embedding, computed while the rows are written
    decision: Decision | None = None  # the row added in the unit's latest transaction
    events: list[OutboxEvent] = field(default_factory=list)  # its outbox events
    indexed: asyncio.Future[bool] | None = None  # its outbox pass, queued once committed


class RecordWriter:
    def __init__(self, db: Database, relay: Relay, runtime: Runtime) -> None:
        self.db = db
        self.relay = relay
        self.runtime = runtime
        self._commits: Batcher[_Unit, _Unit] = Batcher(
            "decisions", self._commit_group, recover=self._after_failed_group
        )
        # Committed rows' outbox passes; one the server stops before its pass is not in the
        # index yet, and the outbox loop finishes it.
        self._passes: Batcher[_Unit, bool] = Batcher(
            "outbox passes", self._deliver, stopped=_not_indexed
        )

    async def write(
        self, build: Callable[[], Decision], evaluation: Staged | None, prepared: Awaitable[None]
    ) -> tuple[Decision, bool]:
        """Write one decision (and its guardrail evaluation); returns the committed row and
        whether it is in the vector index. Raises what its transaction raised."""
        unit = await self._commits.submit(_Unit(build, evaluation, prepared))
        assert unit.decision is not None and unit.indexed is not None  # set once committed
        return unit.decision, await asyncio.shield(unit.indexed)

    async def drain(self) -> None:
        """Wait until everything queued now is written and delivered (shutdown, tests).
        Cancelling the wait leaves the work alone: its callers still get their answers."""
        await self._commits.drain()
        await self._passes.drain()  # a committed unit's pass is queued before its commit ends

    def _committed(self, units: list[_Unit]) -> list[_Unit]:
        for unit in units:
            unit.indexed = self._passes.enqueue(unit)
        return units

    async def _after_failed_group(
        self, group: list[_Unit], exc: Exception
    ) -> list[_Unit | BaseException]:
        """What a failed batch's calls become. A failure can come after the database has
        committed (the connection lost while COMMIT was answered): when every row of the
        batch is there, the batch is committed, and writing it again would record each
        decision twice. Otherwise each call is written alone (a colliding id, say)."""
        built = [u.decision for u in group if u.decision is not None]
        if len(built) == len(group) and not isinstance(exc, IntegrityError):
            try:
                stored = await self._all_stored(built)
            except Exception as check:  # unknown: never risk a second copy
                log.warning(
                    "could not tell whether a failed batch of %d decisions was committed",
                    len(group),
                    exc_info=True,
                )
                return [check] * len(group)
            if stored:
                log.warning(
                    "a batch of %d decisions was committed although its commit raised %s",
                    len(group),
                    type(exc).__name__,
                )
                return list(self._committed(group))
        outcomes: list[_Unit | BaseException] = []
        for unit in group:
            try:
                outcomes.append(await self._commit_alone(unit))
            except Exception as failure:  # it is that call's outcome
                outcomes.append(failure)
        return outcomes

    async def _all_stored(self, decisions: list[Decision]) -> bool:
        """Whether every one of ``decisions`` is in the database: same id and same creation
        time (a colliding id is another decision, recorded at another moment)."""
        wanted = {d.id: d.created_at for d in decisions}
        async with self.db.transaction(write=False) as session:
            found = await repository.created_at_of(session, list(wanted))
        return all(found.get(i) == when for i, when in wanted.items())

    async def _commit_group(self, group: list[_Unit]) -> list[_Unit]:
        """One transaction for the batch; it also records the outbox results of earlier
        passes, which would otherwise need a write transaction of their own. Each unit gets
        its row and events as they are added, for a recovery whose commit raised."""
        undo_settle: Callable[[], None] = _nothing
        for unit in group:
            unit.decision = None
        try:
            async with self.db.transaction(write=True) as session:
                await store(session, [u.evaluation for u in group if u.evaluation is not None])
                for unit in group:
                    # A colliding id fails the batch, which is then written call by call.
                    decision = unit.build()
                    decision.id = self.runtime.decision_id()
                    repository.add_decision(session, decision)
                    unit.decision = decision
                    unit.events = self.relay.enqueue(session, decision.id)
                await session.flush()
                undo_settle = await self.relay.settle_in(session)
        except BaseException:
            undo_settle()
            raise
        return self._committed(group)

    async def _commit_alone(self, unit: _Unit) -> _Unit:
        async with self.db.transaction(write=True) as session:
            if unit.evaluation is not None:
                await store(session, [unit.evaluation])
            decision = unit.build()
            await self._insert_with_fresh_id(session, decision)
            unit.decision = decision
            unit.events = self.relay.enqueue(session, decision.id)
            await session.flush()
        (committed,) = self._committed([unit])
        return committed

    async def _insert_with_fresh_id(self, session: AsyncSession, decision: Decision) -> None:
        """Draw ids until one is free; a collision is detected by the primary key, never an
        overwrite, even when two transactions draw the same id at once."""
        for _ in range(MAX_ID_DRAWS):
            decision.id = self.runtime.decision_id()
            if await repository.try_insert(session, decision):
                return
        raise CstpError(STORAGE_ERROR, "Storage error: no free decision id could be drawn")

    async def _deliver(self, units: list[_Unit]) -> list[bool]:
        """The outbox pass for committed decisions: whether each is in the index now."""
        await asyncio.gather(*(unit.prepared for unit in units), return_exceptions=True)
        events = [event for unit in units for event in unit.events]
        decisions = [unit.decision for unit in units if unit.decision is not None]
        try:
            stats = await self.relay.process(events, decisions)
            done = set(stats.done_ids)
        except Exception:
            # The rows and their events are committed; the outbox finishes what failed here.
            log.exception("outbox pass after recordDecision failed")
            done = set()
        return [
            next(e.id for e in unit.events if e.kind == EventKind.INDEX) in done for unit in units
        ]


def _nothing() -> None:
    """What there is to undo before anything was settled."""


def _not_indexed(_unit: _Unit) -> bool:
    return False
