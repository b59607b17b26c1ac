"""Issue 18: an outage, however long, loses nothing; ``dead`` is only for an event that can
never succeed as it is, and then readiness, ``cstp outbox`` and ``cstp export`` say so.

Every wait is bounded (polls with a deadline, no fixed sleeps); the Chroma server is a child
process in its own session, killed by its fixture whatever happens.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from app.asgi import create_app
from app.config import Settings
from app.db.decisions import Decision
from app.db.outbox import EventKind, OutboxEvent
from app.decisions.bulk import export_all
from app.outbox import admin
from app.runtime import Runtime
from app.search.embedder import Embedder
from app.search.index import IndexUnavailable
from support.app import Rpc, serve_app
from support.processes import ChromaServer
from support.waiting import poll_until

# The commands these tests run in this process use the session's model (conftest).
pytestmark = pytest.mark.usefixtures("commands_share_the_model")

CAP = timedelta(seconds=30)  # the documented cap of the outbox's backoff
# Distinct in meaning, so that a search for one finds that one first.
TEXTS = (
    "Move the billing queue from RabbitMQ to Kafka",
    "Retire the legacy SOAP gateway for partners",
    "Shard the user table by tenant id",
    "Adopt feature flags for the mobile release",
    "Encrypt nightly database backups with KMS keys",
    "Replace the hand-written ORM layer with SQLAlchemy",
)


def params(text: str) -> dict[str, Any]:
    return {
        "decision": text,
        "confidence": 0.7,
        "category": "architecture",
        "stakes": "medium",
        "reasons": [{"type": "analysis", "text": f"Because: {text}"}],
    }


async def poll(
    check: Callable[[], Awaitable[tuple[bool, Any]]],
    timeout: float,  # noqa: ASYNC109 - a deadline the failure reports, with the last state seen
    what: str,
) -> Any:
    """``support.waiting.poll_until`` every 0.2 s: the checks here search or read the outbox."""
    return await poll_until(check, timeout, what, interval=0.2)


def yaml_names(directory: Path) -> list[str]:
    """The names of the YAML files under ``directory``, sorted."""
    return sorted(p.name for p in Path(directory).rglob("*.yaml"))


async def events_of(services: Any, ids: list[str], kind: str | None = None) -> list[Any]:
    async with services.db.transaction(write=False) as session:
        query = select(OutboxEvent).where(OutboxEvent.decision_id.in_(ids))
        if kind is not None:
            query = query.where(OutboxEvent.kind == kind)
        return list(await session.scalars(query.order_by(OutboxEvent.id)))


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"k": value}
    return value


# ---------------------------------------------------------------- a long outage, fake clock


async def test_a_long_outage_kills_nothing_and_the_first_success_takes_the_waiting_events(
    settings: Settings, embedder: Embedder
) -> None:
    """The index fails for two hours of (fake) time with CSTP_OUTBOX_MAX_ATTEMPTS=3: the old
    relay buried each event after its third try. Now none is dead, the backoff stays at 30 s,
    and the first index call that works again (a new recordDecision's inline pass) makes
    every waiting event due at once: the next pass carries them, with no clock advance."""
    clock = [datetime(2026, 12, 1, 12, 0, tzinfo=UTC)]
    app = create_app(
        replace(settings, outbox_max_attempts=3, relay_enabled=False),
        runtime=Runtime(now=lambda: clock[0]),
        embedder=embedder,
    )
    services = app.state.services
    index_down = [True]
    upsert = services.index.upsert

    async def flaky_upsert(entries: Any) -> None:
        if index_down[0]:
            raise IndexUnavailable("vector index unavailable")
        await upsert(entries)

    services.index.upsert = flaky_upsert
    async with serve_app(app) as client:
        rpc = Rpc(client)
        answers = [await rpc.ok("cstp.recordDecision", params(t)) for t in TEXTS[:4]]
        assert all(a["success"] is True and a["indexed"] is False for a in answers)
        ids = [a["id"] for a in answers]
        await services.relay.flush()
        for _ in range(12):  # two hours, a pass every 10 minutes
            clock[0] += timedelta(minutes=10)
            stats = await services.relay.run_due()
            assert (stats.done, stats.failed, stats.dead) == (0, len(ids), 0), stats
        waiting = await events_of(services, ids, "index")
        assert {(e.status, e.failure_kind, e.unknown_failures) for e in waiting} == {
            ("pending", "transient", 0)
        }
        assert {e.attempts for e in waiting} == {13}
        assert {e.available_at for e in waiting} == {clock[0] + CAP}
        assert {e.last_error for e in waiting} == {"vector index unavailable"}
        assert (await admin.counts(services))["dead"] == 0

        index_down[0] = False
        fresh = await rpc.ok("cstp.recordDecision", params(TEXTS[4]))
        assert fresh["indexed"] is True
        stats = await services.relay.run_due()  # the clock has not moved: backoff not over
        assert (stats.done, stats.failed) == (len(ids), 0), stats
        assert {e.status for e in await events_of(services, ids)} == {"done"}
        for text, decision_id in zip(TEXTS[:4], ids, strict=True):
            found = await rpc.ok("cstp.queryDecisions", {"query": text, "limit": 3})
            assert found["decisions"][0]["id"] == decision_id


# ---------------------------------------------------------------- a real Chroma outage


@pytest.mark.slow
async def test_decisions_recorded_during_a_chroma_outage_longer_than_the_old_give_up_time_are_found(
    settings: Settings, embedder: Embedder, chroma_server: ChromaServer
) -> None:
    """The Chroma server is killed and stays down until every waiting index event has been
    tried more than CSTP_OUTBOX_MAX_ATTEMPTS (3) times, where the old relay had made them
    dead (after 1 + 2 + 4 s); then it is started again, with no CSTP restart. Every decision
    acknowledged meanwhile is findable by queryDecisions within 60 s, and none is dead."""
    max_attempts = 3
    await asyncio.to_thread(chroma_server.start)
    remote = replace(settings, chroma_url=chroma_server.url, outbox_max_attempts=max_attempts)
    app = create_app(remote, embedder=embedder)
    services = app.state.services
    async with serve_app(app) as client:
        rpc = Rpc(client)
        first = await rpc.ok("cstp.recordDecision", params("Use Chroma as the vector index"))
        assert first["indexed"] is True

        await asyncio.to_thread(chroma_server.stop)
        down_at = time.monotonic()
        answers = [await rpc.ok("cstp.recordDecision", params(t)) for t in TEXTS]
        assert all(a["success"] is True and a["indexed"] is False for a in answers), answers
        ids = [a["id"] for a in answers]

        async def past_the_old_limit() -> tuple[bool, Any]:
            events = await events_of(services, ids, "index")
            dead = [e for e in events if e.status == "dead"]
            assert not dead, [(e.decision_id, e.attempts, e.last_error) for e in dead]
            tries = [e.attempts for e in events]
            return min(tries) > max_attempts, tries

        await poll(past_the_old_limit, 60, "every waiting event tried past the old limit")
        outage = time.monotonic() - down_at
        assert (await admin.counts(services))["dead"] == 0

        await asyncio.to_thread(chroma_server.start)
        back_at = time.monotonic()

        async def all_found() -> tuple[bool, Any]:
            missing = []
            for text, decision_id in zip(TEXTS, ids, strict=True):
                answer = await rpc.call("cstp.queryDecisions", {"query": text, "limit": 3})
                hits = [d["id"] for d in answer.get("result", {}).get("decisions", [])]
                if decision_id not in hits:
                    missing.append(decision_id)
            return not missing, missing

        await poll(all_found, 60, "every decision of the outage found")
        found_after = time.monotonic() - back_at

        async def drained() -> tuple[bool, Any]:
            counts = await admin.counts(services)
            return counts["pending"] == 0, counts

        counts = await poll(drained, 30, "outbox drained")
        assert counts["dead"] == 0
        assert {e.status for e in await events_of(services, ids)} == {"done"}
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    print(
        f"\nchroma outage of {outage:.1f} s: {len(ids)} decisions answered indexed=false, "
        f"all found {found_after:.1f} s after the index came back"
    )


# ---------------------------------------------------------------- a row that cannot be exported


async def test_a_decision_nested_too_deeply_is_dead_with_its_reason_and_the_rest_exports(
    settings: Settings, rpc: Rpc, client: Any, services: Any
) -> None:
    """A row as an older database may hold it (affectedKpis nested 400 levels, written past
    the API): its export event is dead at once with the reason, /ready is 200 "degraded",
    ``cstp outbox`` names it, and ``export_all`` writes every other decision and reports
    that one by id. Once the row is fixed, ``cstp outbox retry`` delivers it."""
    answers = [await rpc.ok("cstp.recordDecision", params(t)) for t in TEXTS[:3]]
    ids = [a["id"] for a in answers]
    bad = ids[1]
    await services.relay.flush()
    async with services.db.transaction(write=True) as session:
        await session.execute(
            update(Decision).where(Decision.id == bad).values(affected_kpis=deep(400))
        )
        services.relay.enqueue(session, bad, "default", [EventKind.EXPORT], leased=False)
    services.relay.wakeup.set()

    async def buried() -> tuple[bool, Any]:
        events = await events_of(services, [bad], "export")
        return events[-1].status != "pending", events[-1]

    event = await poll(buried, 15, "the export event settled")
    assert (event.status, event.failure_kind, event.attempts) == ("dead", "permanent", 1)
    assert event.last_error.startswith(
        "the YAML file cannot be built from the row: RecursionError"
    ), event.last_error

    ready = await client.get("/ready")
    body = ready.json()
    assert ready.status_code == 200, ready.text
    assert body["status"] == "degraded" and body["degraded"] == ["outbox"], body
    assert body["checks"]["outbox"]["dead"] == 1 and "failing" not in body

    lines = await admin.describe(services)
    assert lines[0].startswith("pending: 0  dead: 1")
    [line] = [x for x in lines if x.startswith(f"#{event.id} ")]
    assert f"dead    export decision {bad}" in line
    assert "can never succeed as it is: the YAML file cannot be built" in line
    assert "RecursionError" in line
    assert "cstp outbox retry" in lines[-1]
    env = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    shown = await asyncio.to_thread(CliRunner().invoke, _cli(), ["outbox"], env=env)
    assert shown.exit_code == 0, shown.output
    assert line in shown.output.splitlines(), shown.output

    shutil.rmtree(settings.decisions_dir)
    exported = await export_all(services)
    assert exported == 2
    assert [i for i, _reason in exported.failed] == [bad]
    assert "RecursionError" in exported.failed[0][1]
    files = await asyncio.to_thread(yaml_names, settings.decisions_dir)
    assert files == sorted(Path(a["path"]).name for a in answers if a["id"] != bad)
    # The documented rebuild, `cstp export`, goes on past it and names it.
    rebuilt = await asyncio.to_thread(CliRunner().invoke, _cli(), ["export"], env=env)
    assert rebuilt.exit_code == 1, rebuilt.output
    assert "exported 2 decision file(s)" in rebuilt.stdout
    assert [x for x in rebuilt.stderr.splitlines() if x.startswith("could not export")] == [
        f"could not export decision {bad}: {exported.failed[0][1]}"
    ]

    # The remedy OPERATIONS.md gives: fix the row, then re-queue the dead event.
    async with services.db.transaction(write=True) as session:
        await session.execute(
            update(Decision).where(Decision.id == bad).values(affected_kpis={"latency": "ok"})
        )
    assert await admin.retry_dead(services) == 1

    async def delivered() -> tuple[bool, Any]:
        counts = await admin.counts(services)
        return counts["pending"] == 0 and counts["dead"] == 0, counts

    await poll(delivered, 15, "the re-queued event delivered")
    assert (await client.get("/ready")).json()["status"] == "ready"
    assert len(await asyncio.to_thread(yaml_names, settings.decisions_dir)) == 3


def _cli() -> Any:
    from app.cli import main

    return main


async def test_an_event_whose_decision_is_gone_is_dead_at_once(services: Any) -> None:
    async with services.db.transaction(write=True) as session:
        services.relay.enqueue(session, "0badc0de", "default", list(EventKind), leased=False)
    stats = await services.relay.drain()
    assert (stats.failed, stats.dead) == (2, 2)
    events = await events_of(services, ["0badc0de"])
    assert {(e.status, e.failure_kind, e.last_error) for e in events} == {
        ("dead", "permanent", "decision not found")
    }


async def test_a_full_disk_is_retried_and_never_counted(
    settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the YAML file fails (OSError: no space left) for longer than
    CSTP_OUTBOX_MAX_ATTEMPTS tries: the export event waits, and is written once the disk
    has room, at once after the first export that works again."""
    import errno

    import app.decisions.export as export
    import app.outbox.handlers as handlers

    clock = [datetime(2026, 12, 1, 12, 0, tzinfo=UTC)]
    app = create_app(
        replace(settings, outbox_max_attempts=2, relay_enabled=False),
        runtime=Runtime(now=lambda: clock[0]),
        embedder=embedder,
    )
    services = app.state.services
    full = [True]
    write = export.write_atomic

    def write_or_fail(path: Path, content: bytes) -> bool:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, content)

    monkeypatch.setattr(export, "write_atomic", write_or_fail)
    monkeypatch.setattr(handlers, "write_atomic", write_or_fail, raising=False)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        answer = await rpc.ok("cstp.recordDecision", params(TEXTS[0]))
        assert answer["indexed"] is True
        await services.relay.flush()
        for _ in range(10):
            clock[0] += timedelta(minutes=1)
            stats = await services.relay.run_due()
            assert (stats.failed, stats.dead) == (1, 0), stats
        [event] = await events_of(services, [answer["id"]], "export")
        assert (event.status, event.failure_kind, event.attempts) == ("pending", "transient", 11)
        assert event.last_error == "could not write the file: No space left on device"
        full[0] = False
        await rpc.ok("cstp.recordDecision", params(TEXTS[1]))  # its export works
        stats = await services.relay.run_due()
        assert (stats.done, stats.failed) == (1, 0), stats
        assert (settings.decisions_dir / answer["path"].removeprefix("decisions/")).is_file()


async def test_the_relay_loop_stops_when_cancelled_just_as_it_is_poked(
    settings: Settings, embedder: Embedder
) -> None:
    """A server shutting down cancels the relay's loop; a poke (a dependency back, or
    ``cstp outbox retry``) in the same turn of the event loop must not swallow that
    cancellation, or the shutdown waits for the loop for ever (seen as a hung test: the
    relay went on polling with its cancellation lost)."""
    services = create_app(settings, embedder=embedder).state.services
    relay = services.relay
    task = asyncio.create_task(relay.loop())
    try:

        async def waiting() -> tuple[bool, Any]:  # between passes, waiting to be poked
            return bool(relay.wakeup._waiters), task

        await poll_until(waiting, 10, "the relay loop waits for a poke")
        relay.wakeup.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done == {task}, "the relay loop went on after it was cancelled"
        assert task.cancelled()
    finally:
        task.cancel()
        await services.close()
