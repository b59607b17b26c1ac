"""Batched commits for recordDecision.

Concurrent recordDecision calls are written together (app.batches: why batches, and what a
lone call costs): one transaction (one INSERT per table, one COMMIT), then one outbox pass
(one batch of YAML files, one index upsert) for its decisions, and for those of earlier
batches that were held back while more calls waited to be committed (``_start_pass``).

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

from app import webhooks
from app.batches import MAX_BATCH, Batcher
from app.db.decisions import Decision
from app.db.engine import Database
from app.db.outbox import EventKind, OutboxEvent
from app.errors import STORAGE_ERROR, CstpError
from app.guardrails.service import Staged, store
from app.outbox.relay import Relay
from app.runtime import Runtime
from app.webhooks import DECISION_RECORDED, Message, message

from . import repository

log = logging.getLogger("cstp.decisions")

MAX_ID_DRAWS = 20


@dataclass
class _Unit:
    build: Callable[[], Decision]  # a fresh, unsaved row (with reasons and tags) per call
    evaluation: Staged | None
    prepared: Awaitable[None]  # the embedding, computed while the rows are written
    supersedes: tuple[str, ...] = ()  # the decisions it supersedes (their rows are updated)
    decision: Decision | None = None  # the row added in the unit's latest transaction
    events: list[OutboxEvent] = field(default_factory=list)  # its outbox events
    indexed: asyncio.Future[bool] | None = None  # its outbox pass's outcome, once committed


class RecordWriter:
    def __init__(self, db: Database, relay: Relay, runtime: Runtime) -> None:
        self.db = db
        self.relay = relay
        self.runtime = runtime
        self._commits: Batcher[_Unit, _Unit] = Batcher(
            "decisions", self._commit_group, recover=self._after_failed_group
        )
        self._held: list[_Unit] = []  # committed, their outbox pass not started yet
        self._passes: set[asyncio.Task[None]] = set()

    async def write(
        self,
        build: Callable[[], Decision],
        evaluation: Staged | None,
        prepared: Awaitable[None],
        supersedes: tuple[str, ...] = (),
    ) -> tuple[Decision, bool]:
        """Write one decision (and its guardrail evaluation; the decisions it supersedes,
        ``supersedes``, are the ones its links built by ``build`` name, already checked to be
        of its workspace); returns the committed row and whether it is in the vector index.
        Raises what its transaction raised."""
        unit = await self._commits.submit(_Unit(build, evaluation, prepared, supersedes))
        assert unit.decision is not None and unit.indexed is not None  # set once committed
        return unit.decision, await asyncio.shield(unit.indexed)

    async def drain(self) -> None:
        """Wait until everything queued now is written and delivered (shutdown, tests).
        Cancelling the wait leaves the work alone: its callers still get their answers."""
        await self._commits.drain()  # the last batch started the passes it held
        while self._passes:
            await asyncio.wait(set(self._passes))  # a cancelled wait cancels nothing

    def _committed(self, units: list[_Unit]) -> list[_Unit]:
        loop = asyncio.get_running_loop()
        for unit in units:
            unit.indexed = loop.create_future()
        self._held.extend(units)
        self._start_pass()
        return units

    def _start_pass(self) -> None:
        """Start the outbox pass of the committed decisions held, unless more calls wait to
        be committed: then the pass waits for their commit and both go together (up to a
        batch), since an index upsert has a fixed cost besides its cost per decision and
        holds the interpreter lock, so fewer, larger passes leave more time to the rest."""
        if not self._held or (self._commits.queued and len(self._held) < MAX_BATCH):
            return
        held, self._held = self._held, []
        task = asyncio.get_running_loop().create_task(self._deliver(held))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

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
                self._start_pass()  # for those an earlier batch held
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
        self._start_pass()  # for those an earlier batch held, when none of these committed
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
                await repository.lock_superseded(session, [i for u in group for i in u.supersedes])
                for unit in group:
                    # A colliding id fails the batch, which is then written call by call.
                    decision = unit.build()
                    decision.id = self.runtime.decision_id()
                    repository.add_decision(session, decision)
                    unit.decision = decision
                    unit.events = self.relay.enqueue(session, decision.id, decision.workspace)
                await session.flush()
                await self._supersede(session, group)
                await webhooks.enqueue_many(session, [recorded(u.decision) for u in group])
                undo_settle = await self.relay.settle_in(session)
        except BaseException:
            undo_settle()
            raise
        return self._committed(group)

    async def _commit_alone(self, unit: _Unit) -> _Unit:
        async with self.db.transaction(write=True) as session:
            if unit.evaluation is not None:
                await store(session, [unit.evaluation])
            await repository.lock_superseded(session, unit.supersedes)
            decision = unit.build()
            await self._insert_with_fresh_id(session, decision)
            unit.decision = decision
            unit.events = self.relay.enqueue(session, decision.id, decision.workspace)
            await session.flush()
            await self._supersede(session, [unit])
            await webhooks.enqueue_many(session, [recorded(decision)])
        (committed,) = self._committed([unit])
        return committed

    async def _supersede(self, session: AsyncSession, units: list[_Unit]) -> None:
        """Show the supersede links of ``units``' flushed decisions on the decisions they
        supersede, and re-index those (their index entries get the superseded flag that
        searches leave out) through the outbox, in the same transaction: an index event each,
        carried by the inline pass of the first unit that supersedes it."""
        if not any(u.supersedes for u in units):
            return
        decisions = [u.decision for u in units if u.decision is not None]
        superseded = set(await repository.mark_superseded(session, decisions))
        for unit in units:
            assert unit.decision is not None  # added before the flush
            for old in unit.supersedes:
                if old in superseded:
                    superseded.discard(old)
                    unit.events += self.relay.enqueue(
                        session, old, unit.decision.workspace, (EventKind.INDEX,)
                    )

    async def _insert_with_fresh_id(self, session: AsyncSession, decision: Decision) -> None:
        """Draw ids until one is free; a collision is detected by the primary key, never an
        overwrite, even when two transactions draw the same id at once."""
        for _ in range(MAX_ID_DRAWS):
            decision.id = self.runtime.decision_id()
            if await repository.try_insert(session, decision):
                return
        raise CstpError(STORAGE_ERROR, "Storage error: no free decision id could be drawn")

    async def _deliver(self, units: list[_Unit]) -> None:
        """The outbox pass for committed decisions, then each call's answer: whether its
        decision is in the index now. The rows and their events are committed: whatever this
        pass does not do (it fails, or the server stops first), the outbox loop finishes."""
        done: set[int] = set()
        try:
            await asyncio.gather(*(unit.prepared for unit in units), return_exceptions=True)
            events = [event for unit in units for event in unit.events]
            decisions = [unit.decision for unit in units if unit.decision is not None]
            stats = await self.relay.process(events, decisions)
            done = set(stats.done_ids)
        except Exception:
            log.exception("outbox pass after recordDecision failed")
        finally:
            for unit in units:
                assert unit.decision is not None  # every unit of a pass was committed
                own = unit.decision.id  # (its events also index the decisions it superseded)
                index_event = next(
                    e.id for e in unit.events if e.kind == EventKind.INDEX and e.decision_id == own
                )
                if unit.indexed is not None and not unit.indexed.done():
                    unit.indexed.set_result(index_event in done)


def recorded(decision: Decision | None) -> Message:
    """The decision.recorded webhook message of a decision being committed: its public
    fields (SPEC.md, section 8). One message id per decision, so it is sent once."""
    assert decision is not None  # every unit of a batch has its row once it is added
    return message(
        workspace=decision.workspace,
        event=DECISION_RECORDED,
        data={
            "id": decision.id,
            "agent": decision.recorded_by,
            "workspace": decision.workspace,
            "summary": decision.summary,
            "category": decision.category,
            "confidence": decision.confidence,
            "stakes": decision.stakes,
            "createdAt": decision.created_at,
        },
        at=decision.created_at,
        message_id=f"msg_decision_recorded_{decision.id}",
    )


def _nothing() -> None:
    """What there is to undo before anything was settled."""
