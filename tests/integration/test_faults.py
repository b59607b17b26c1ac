"""Faults under load (issue 8): the vector index server dies mid-load, the CSTP server process
dies mid-load, and two relays drain one outbox at once. Nothing is lost, nothing is doubled,
and the system heals by itself (the outbox relay), with no manual step.

Every wait here is bounded, every child process runs in its own session and is killed in a
``finally``, and only loopback addresses are used.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import event, func, select, update

from app.asgi import create_app
from app.config import Settings
from app.db.decisions import Decision
from app.db.outbox import OutboxEvent
from app.outbox import admin
from app.outbox.events import Event
from app.outbox.relay import Relay
from app.runtime import Runtime
from app.search.embedder import Embedder
from app.search.index import IndexUnavailable, VectorIndex
from app.services import Services, build_services
from support import waiting
from support.app import Rpc, serve_app
from support.databases import USE_PG, run_sql
from support.processes import ChromaServer, wait_until_up

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
CSTP = BIN / "cstp"
TOKEN = "token-alice"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CATEGORIES = ("architecture", "process", "integration", "tooling", "security")
# Words combined per call so every decision text is distinct in meaning, not only in a digit.
VERBS = ("Adopt", "Retire", "Replace", "Split", "Cache", "Shard", "Audit", "Rewrite")
THINGS = (
    "the billing queue",
    "the auth service",
    "feature flags",
    "the ORM layer",
    "CI caches",
    "the search cluster",
    "nightly backups",
    "the payments API",
    "the mobile gateway",
    "log retention",
)
PLACES = (
    "in Berlin",
    "for the EU region",
    "before the launch",
    "after the audit",
    "on weekends",
    "for partners",
    "in staging",
    "for the data team",
)


def decision_text(n: int) -> str:
    verb, thing, place = VERBS[n % 8], THINGS[(n // 8) % 10], PLACES[(n // 80) % 8]
    return f"{verb} {thing} {place}, plan number {n}"


def record_params(n: int, prefix: str = "") -> dict[str, Any]:
    return {
        "decision": prefix + decision_text(n),
        "confidence": round((n % 11) / 10, 1),
        "category": CATEGORIES[n % 5],
        "stakes": ("low", "medium", "high", "critical")[n % 4],
        "tags": [f"fault-{n % 7}"],
        "reasons": [{"type": "analysis", "text": f"measured in run {n}"}],
    }


def envelope(n: int, params: dict[str, Any], method: str = "cstp.recordDecision") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params}


async def poll_until(
    check: Callable[[], Awaitable[tuple[bool, Any]]],
    timeout: float,  # noqa: ASYNC109 - a deadline the failure reports, with the last state seen
    what: str,
    interval: float = 0.25,
) -> Any:
    """``support.waiting.poll_until``, where a component still coming back (the index, an
    HTTP server) counts as "not yet"; any other error fails at once."""
    return await waiting.poll_until(
        check, timeout, what, interval=interval, not_yet=(IndexUnavailable, httpx.HTTPError)
    )


def yaml_tree(root: Path) -> tuple[dict[str, Path], list[str]]:
    """id -> file for every decision file under ``root``, and any other file found there.

    Each file must parse and its ``id`` must be the one its name carries; one id, one file."""
    by_id: dict[str, Path] = {}
    others: list[str] = []
    if not root.exists():
        return by_id, others
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        if not (
            path.name.endswith(".yaml")
            and "-decision-" in path.name
            and not path.name.startswith(".")
        ):
            others.append(path.relative_to(root).as_posix())
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict), path
        file_id = path.name.rsplit("-decision-", 1)[1].removesuffix(".yaml")
        assert data["id"] == file_id, (path, data.get("id"))
        assert file_id not in by_id, f"decision {file_id} exported twice: {by_id[file_id]}, {path}"
        assert path.relative_to(root).as_posix().startswith(data["date"][:4] + "/"), path
        by_id[file_id] = path
    return by_id, others


async def sql_state(services: Services) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Every decision id (with repeats, if any) and every outbox event (kind, decision, status)."""
    async with services.db.transaction(write=False) as session:
        ids = list(await session.scalars(select(Decision.id).order_by(Decision.id)))
        events = [
            (k, d, s)
            for k, d, s in (
                await session.execute(
                    select(OutboxEvent.kind, OutboxEvent.decision_id, OutboxEvent.status).order_by(
                        OutboxEvent.id
                    )
                )
            ).all()
        ]
    return ids, events


async def indexed_ids(index: VectorIndex, ids: list[str], chunk: int = 100) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(ids), chunk):
        found |= set(await index.get_metadata(ids[start : start + chunk], workspace="default"))
    return found


def assert_outbox_complete(ids: list[str], events: list[tuple[str, str, str]]) -> None:
    """Exactly one export and one index event per decision, all done."""
    per_decision = sorted((d, k) for k, d, _s in events)
    assert per_decision == sorted(
        itertools.chain.from_iterable(((i, "export"), (i, "index")) for i in ids)
    ), "outbox events are not one pair per decision"
    not_done = [e for e in events if e[2] != "done"]
    assert not not_done, f"{len(not_done)} outbox event(s) not done: {not_done[:5]}"


# ---------------------------------------------------------------- child processes


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # its own session: the process and any children


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)


class CstpServer:
    """``cstp serve`` as a child process on a loopback port, its output kept in a log file."""

    def __init__(self, env: dict[str, str], port: int, log_path: Path, cwd: Path) -> None:
        self.env, self.port, self.log_path, self.cwd = env, port, log_path, cwd
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def start(self, timeout: float = 60.0) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n---- start {self.starts} ----\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(CSTP), "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )
        try:
            wait_until_up(self.proc, f"{self.base}/health", timeout, self.log)
        except RuntimeError:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, in-flight work is simply lost."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _kill_group(proc, signal.SIGKILL)
            _wait_or_kill(proc, 10)

    def stop(self) -> None:
        """A graceful stop (SIGTERM), SIGKILL if it does not end in time."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _kill_group(proc, signal.SIGTERM)
            _wait_or_kill(proc, 20)


# ---------------------------------------------------------------- 1. Chroma killed mid-load


async def test_chroma_server_killed_and_restarted_mid_load_loses_nothing(
    settings: Settings, embedder: Embedder, chroma_server: ChromaServer
) -> None:
    """500 recordDecision calls from 8 concurrent workers against an app on a ``chroma run``
    server; after ~100 calls the server gets SIGKILL and is started again once 50 calls have
    been answered without it (same path, same port). Every call succeeds (``indexed`` may be
    false), and with no manual step the relay's background loop brings SQL, the YAML tree
    and the index to the same 500."""
    total, workers, kill_after = 500, 8, 100
    outage_calls = 50  # answered with indexed=false before the server is started again
    chroma = chroma_server  # killed after the test by its fixture, whatever happens
    await asyncio.to_thread(chroma.start)
    remote = settings.with_overrides(chroma_url=chroma.url, outbox_poll_seconds=0.2)
    app = create_app(remote, embedder=embedder)
    services: Services = app.state.services
    async with serve_app(app) as http:
        results: dict[int, dict[str, Any]] = {}
        numbers = iter(range(total))
        done = asyncio.Event()
        timeline: dict[str, float] = {}

        async def worker() -> None:
            for n in numbers:
                response = await asyncio.wait_for(
                    http.post("/cstp", headers=AUTH, json=envelope(n, record_params(n))), 60
                )
                assert response.status_code == 200, response.text
                results[n] = response.json()
                if len(results) >= kill_after:
                    done.set()

        def unindexed() -> int:
            return sum(1 for a in results.values() if a.get("result", {}).get("indexed") is False)

        async def fault() -> None:
            await asyncio.wait_for(done.wait(), 120)
            timeline["killed_after"] = len(results)
            await asyncio.to_thread(chroma.stop)

            async def outage_seen() -> tuple[bool, Any]:
                # the load has run into the dead index (or ended): then the server comes back
                seen = unindexed()
                return seen >= outage_calls or len(results) == total, (seen, len(results))

            await poll_until(outage_seen, 60, "calls answered while the index was down")
            timeline["restart_after"] = len(results)
            await asyncio.to_thread(chroma.start)
            timeline["up_after"] = len(results)

        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(fault(), *(worker() for _ in range(workers))), 300)
        load_seconds = time.monotonic() - started

        failed = {n: a for n, a in results.items() if "result" not in a}
        assert not failed, list(failed.items())[:5]
        answers = [results[n]["result"] for n in range(total)]
        assert all(a["success"] is True for a in answers)
        ids = [a["id"] for a in answers]
        assert len(set(ids)) == total
        not_indexed = sum(1 for a in answers if a["indexed"] is False)
        # the fault really hit the load: some calls ran while the index was down
        assert timeline["killed_after"] < total and not_indexed > 0, (timeline, not_indexed)

        async def healed() -> tuple[bool, Any]:
            counts = await admin.counts(services)
            count = await services.index.count()
            return counts["pending"] == 0 and counts["dead"] == 0 and count == total, (
                counts,
                count,
            )

        heal_started = time.monotonic()
        await poll_until(healed, 90, "outbox drained and index complete")
        heal_seconds = time.monotonic() - heal_started

        db_ids, events = await sql_state(services)
        assert len(db_ids) == total and set(db_ids) == set(ids)
        assert_outbox_complete(db_ids, events)
        files, others = yaml_tree(remote.decisions_dir)
        assert set(files) == set(ids) and len(files) == total
        assert others == [], others
        for answer in answers:
            assert files[answer["id"]] == remote.decisions_dir / answer["path"].removeprefix(
                "decisions/"
            )
        assert await services.index.count() == total
        assert await indexed_ids(services.index, ids) == set(ids)
        # the restarted server serves searches again, with the real metadata
        params = record_params(123)
        hits = (
            await http.post(
                "/cstp",
                headers=AUTH,
                json=envelope(1, {"query": params["decision"], "limit": 3}, "cstp.queryDecisions"),
            )
        ).json()
        assert hits["result"]["decisions"][0]["id"] == ids[123]
        print(
            f"\nchroma fault: {total} calls in {load_seconds:.1f} s, {not_indexed} answered "
            f"indexed=false, healed {heal_seconds:.1f} s after the load, "
            f"index failures seen {services.index.stats.failures}, timeline {timeline}"
        )


# ---------------------------------------------------------------- 2. server killed mid-load


@dataclass
class Load:
    """recordDecision calls from several HTTP clients; remembers what was acknowledged."""

    base: str
    acked: dict[int, dict[str, Any]] = field(default_factory=dict)  # n -> result
    lost: list[int] = field(default_factory=list)  # sent, no answer (the kill)
    errors: list[Any] = field(default_factory=list)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    killed: asyncio.Event = field(default_factory=asyncio.Event)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    async def client(self, target: int) -> None:
        async with httpx.AsyncClient(
            base_url=self.base, headers=AUTH, timeout=httpx.Timeout(30.0, connect=5.0)
        ) as http:
            while not self.killed.is_set():
                n = next(self.counter)
                try:
                    response = await http.post("/cstp", json=envelope(n, record_params(n)))
                except httpx.TransportError:
                    if self.killed.is_set():
                        self.lost.append(n)
                        return
                    raise
                answer = response.json()
                if response.status_code != 200 or "result" not in answer:
                    self.errors.append((n, response.status_code, answer))
                    continue
                self.acked[n] = answer["result"]
                if len(self.acked) >= target:
                    self.reached.set()


@asynccontextmanager
async def cstp_server(env: dict[str, str], port: int, root: Path) -> AsyncIterator[CstpServer]:
    server = CstpServer(env, port, root / "server.log", root)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


def server_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    env.update(
        {
            "CSTP_DATABASE_URL": settings.database_url,
            "CSTP_DATA_DIR": str(settings.data_dir),
            "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
            "CSTP_AUTH_TOKENS": f"alice:{TOKEN}",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_LOG_LEVEL": "WARNING",
        }
    )
    return env


async def test_server_killed_mid_load_keeps_every_acknowledged_decision(
    settings: Settings, embedder: Embedder, tmp_path: Path, free_port: int
) -> None:
    """SIGKILL ``cstp serve`` after ~100 acknowledged calls, start it again on the same data.

    Events of calls that committed just before the kill are still leased (30 s) to the dead
    process; the restarted server's own background relay takes them once the lease runs out,
    so the test waits for the server itself (up to the lease plus backoff), no manual drain.
    """
    clients, kill_after = 6, 100
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 1)
        mark = now

    async with cstp_server(server_env(settings), free_port, tmp_path) as server:
        await asyncio.to_thread(server.start)
        phase("start")
        load = Load(server.base)
        tasks = [asyncio.create_task(load.client(kill_after)) for _ in range(clients)]
        try:
            await asyncio.wait_for(load.reached.wait(), 120)
            load.killed.set()
            await asyncio.to_thread(server.kill)
            killed_at = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        phase("load+kill")
        assert not load.errors, load.errors[:5]
        acked = dict(load.acked)
        assert len(acked) >= kill_after
        assert len({r["id"] for r in acked.values()}) == len(acked)

        await asyncio.to_thread(server.start)
        phase("restart")
        async with httpx.AsyncClient(base_url=server.base, headers=AUTH, timeout=30.0) as http:

            async def drained() -> tuple[bool, Any]:
                ready = (await http.get("/ready")).json()
                outbox = ready["checks"]["outbox"]
                return outbox["pending"] == 0 and outbox["dead"] == 0, ready

            try:
                ready = await poll_until(
                    drained, 75, "the restarted server drained the outbox", interval=0.5
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nserver log:\n{server.log()}") from None
            healed_after = time.monotonic() - killed_at
            phase("drain")
            assert ready["status"] == "ready", ready

            async def rpc(n: int, method: str, params: dict[str, Any]) -> Any:
                answer = (await http.post("/cstp", json=envelope(n, params, method))).json()
                assert "result" in answer, (method, params, answer)
                return answer["result"]

            listed: list[dict[str, Any]] = []
            while True:
                page = await rpc(
                    0,
                    "cstp.listDecisions",
                    {"limit": 500, "offset": len(listed), "sort": "createdAt", "order": "asc"},
                )
                assert page["decisions"] or len(listed) >= page["total"], page
                listed += page["decisions"]
                if len(listed) >= page["total"]:
                    break
            listed_ids = [d["id"] for d in listed]
            assert len(listed_ids) == len(set(listed_ids))
            for n, result in sorted(acked.items()):
                got = (await rpc(n, "cstp.getDecision", {"id": result["id"]}))["decision"]
                assert got["decision"] == decision_text(n)
                path = settings.decisions_dir / result["path"].removeprefix("decisions/")
                assert yaml.safe_load(path.read_text(encoding="utf-8"))["id"] == result["id"]
                hits = await rpc(n, "cstp.queryDecisions", {"query": decision_text(n), "limit": 3})
                assert result["id"] in [h["id"] for h in hits["decisions"]], (n, hits)
            assert ready["checks"]["outbox"]["done"] == 2 * len(listed_ids)
        phase("verify")
        await asyncio.to_thread(server.stop)
        phase("stop")

    # Both derived stores hold exactly the stored decisions, once each.
    files, others = yaml_tree(settings.decisions_dir)
    assert set(files) == set(listed_ids)
    stray = [o for o in others if not o.rsplit("/", 1)[-1].startswith(".tmp-")]
    assert stray == [], stray
    index = VectorIndex.embedded(settings.data_dir / "chroma", embedder)
    try:
        assert await index.count() == len(listed_ids)
        assert await indexed_ids(index, listed_ids) == set(listed_ids)
    finally:
        await index.aclose()
    # every stored decision came from exactly one call: acknowledged, or cut off by the kill
    sent_texts = {decision_text(n): n for n in [*acked, *load.lost]}
    stored_texts = [d["title"] for d in listed]
    assert len(set(stored_texts)) == len(stored_texts)
    assert set(stored_texts) <= set(sent_texts), set(stored_texts) - set(sent_texts)
    assert {decision_text(n) for n in acked} <= set(stored_texts)
    print(
        f"\nserver kill: {len(acked)} acknowledged, {len(load.lost)} lost in flight, "
        f"{len(listed_ids)} stored, outbox drained {healed_after:.1f} s after the kill, "
        f"temp files left by the kill: {len(others) - len(stray)}, phases (s) {phases}"
    )


# ---------------------------------------------------------------- 3. two relays, one outbox


class ObservedRelay:
    """Records which events a relay processed; the real handlers still run.

    ``hold`` (optional) makes the relay wait after its claim, before its handlers run: a slow
    relay, so that another one provably works while this one holds its lease."""

    def __init__(self, relay: Relay, hold: asyncio.Event | None = None) -> None:
        self.handled: list[int] = []
        self.batches = 0
        self.working = asyncio.Event()
        original = relay._process

        async def observed(events: list[Event]) -> Any:
            self.handled.extend(e.id for e in events)
            self.batches += 1
            self.working.set()
            if hold is not None:
                await asyncio.wait_for(hold.wait(), 60)
            return await original(events)

        relay._process = observed  # type: ignore[method-assign]  # a spy around the real one


async def _insert_due_events(services: Services, count: int) -> list[str]:
    """``count`` decisions with their export+index events, every lease already expired
    (as after a crash: the writer leased them for its inline pass and died)."""
    runtime, relay = services.runtime, services.relay
    now = runtime.now()
    ids: list[str] = []
    async with services.db.transaction(write=True) as session:
        for n in range(count):
            text = decision_text(n)
            decision = Decision(
                id=f"{n:08x}",
                summary=text,
                decision=text,
                category=CATEGORIES[n % 5],
                confidence=0.5,
                stakes="medium",
                status="pending",
                created_at=now,
                recorded_by="alice",
            )
            session.add(decision)
            relay.enqueue(session, decision.id, "default")
            ids.append(decision.id)
        await session.flush()
        await session.execute(update(OutboxEvent).values(available_at=now - timedelta(seconds=1)))
    return ids


async def test_a_late_inline_pass_leaves_events_another_relay_claimed_alone(
    settings: Settings, embedder: Embedder
) -> None:
    """The writer leases its events for its inline pass (LEASE, 30 s). A pass that starts
    late (held up by a stalled index, say) must not work on events that another relay
    claimed when that lease ran out; events nobody claimed it renews and processes."""
    clock = {"now": datetime(2026, 11, 30, 12, 0, tzinfo=UTC)}
    services = build_services(settings, Runtime(now=lambda: clock["now"]), embedder)
    try:
        events: dict[str, list[OutboxEvent]] = {}
        decisions: dict[str, Decision] = {}
        async with services.db.transaction(write=True) as session:
            for n, key in enumerate(("claimed", "unclaimed")):
                text = decision_text(n)
                decisions[key] = Decision(
                    id=f"{n:08x}",
                    summary=text,
                    decision=text,
                    category=CATEGORIES[0],
                    confidence=0.5,
                    stakes="medium",
                    status="pending",
                    created_at=clock["now"],
                    recorded_by="alice",
                    reasons=[],
                    tags=[],
                )
                session.add(decisions[key])
                events[key] = services.relay.enqueue(session, decisions[key].id, "default")
        clock["now"] += timedelta(seconds=31)  # the lease has run out ...
        claimed_until = clock["now"] + timedelta(seconds=30)
        async with services.db.transaction(write=True) as session:  # ... and a relay took it
            await session.execute(
                update(OutboxEvent)
                .where(OutboxEvent.decision_id == decisions["claimed"].id)
                .values(available_at=claimed_until)
            )

        late = await services.relay.process(events["claimed"], [decisions["claimed"]])
        assert (late.done, late.failed) == (0, 0)
        renewed = await services.relay.process(events["unclaimed"], [decisions["unclaimed"]])
        assert renewed.done == 2 and renewed.failed == 0
        await services.relay.flush()

        async with services.db.transaction(write=False) as session:
            rows = (
                await session.execute(
                    select(
                        OutboxEvent.decision_id,
                        OutboxEvent.status,
                        OutboxEvent.attempts,
                        OutboxEvent.available_at,
                    )
                )
            ).all()
        states = {(r[0], r[1], r[2]) for r in rows}
        assert states == {
            (decisions["claimed"].id, "pending", 0),
            (decisions["unclaimed"].id, "done", 0),
        }
        assert {r[3] for r in rows if r[0] == decisions["claimed"].id} == {claimed_until}
        files, _others = yaml_tree(settings.decisions_dir)
        assert set(files) == {decisions["unclaimed"].id}
        assert await indexed_ids(services.index, [d.id for d in decisions.values()]) == {
            decisions["unclaimed"].id
        }
    finally:
        await services.close()


@asynccontextmanager
async def two_relays(
    settings: Settings, embedder: Embedder, chroma: ChromaServer
) -> AsyncIterator[tuple[Services, Services]]:
    """Two service containers as two server processes would have them: each its own engine,
    relay and index client, one database and one Chroma server between them."""
    await asyncio.to_thread(chroma.start)
    shared = settings.with_overrides(chroma_url=chroma.url)
    built: list[Services] = []
    try:
        built.append(build_services(shared, embedder=embedder))
        built.append(build_services(shared, embedder=embedder))
        yield built[0], built[1]
    finally:
        for services in built:
            await services.close()


PG_ONLY = pytest.mark.skipif(
    not USE_PG,
    reason="needs Postgres: SQLite has no FOR UPDATE SKIP LOCKED (SQLAlchemy drops "
    "it), so relay concurrency is tested on Postgres; CI runs the integration folder there too",
)


@PG_ONLY
async def test_two_relays_drain_one_outbox_without_handling_an_event_twice(
    settings: Settings, embedder: Embedder, chroma_server: ChromaServer
) -> None:
    """Two relays take due events the way their background loops do (``run_due``: claims
    with SKIP LOCKED, leases respected), concurrently, until nothing is left."""
    count = 300
    async with two_relays(settings, embedder, chroma_server) as (first, second):
        ids = await _insert_due_events(first, count)
        a, b = ObservedRelay(first.relay), ObservedRelay(second.relay)
        stats = await asyncio.wait_for(
            asyncio.gather(
                first.relay.drain(include_leased=False), second.relay.drain(include_leased=False)
            ),
            120,
        )
        assert sum(s.failed for s in stats) == 0, stats
        assert set(a.handled).isdisjoint(b.handled), sorted(set(a.handled) & set(b.handled))[:10]
        assert len(a.handled) == len(set(a.handled)) and len(b.handled) == len(set(b.handled))
        assert a.handled and b.handled, (len(a.handled), len(b.handled))
        assert len(a.handled) + len(b.handled) == 2 * count
        db_ids, events = await sql_state(first)
        assert sorted(db_ids) == sorted(ids)
        assert_outbox_complete(db_ids, events)
        async with first.db.transaction(write=False) as session:
            retried = await session.scalar(
                select(func.count()).select_from(OutboxEvent).where(OutboxEvent.attempts > 0)
            )
        assert retried == 0
        files, others = yaml_tree(settings.decisions_dir)
        assert set(files) == set(ids) and others == []
        assert await first.index.count() == count
        assert await indexed_ids(second.index, ids) == set(ids)
        print(
            f"\ntwo relays: A handled {len(a.handled)} in {a.batches} batch(es), "
            f"B handled {len(b.handled)} in {b.batches} batch(es)"
        )


@PG_ONLY
async def test_drain_does_not_take_events_another_relay_is_working_on(
    settings: Settings, embedder: Embedder, chroma_server: ChromaServer
) -> None:
    """Relay A (e.g. a running server) claims a batch and is slow to process it; meanwhile an
    operator runs ``cstp outbox drain`` (relay B's ``drain()``, defaults as the CLI uses them).
    B must leave A's leased events alone and take only what is due."""
    count = 150  # 300 events: A's first claim (200) holds most, 100 stay due for B
    async with two_relays(settings, embedder, chroma_server) as (first, second):
        ids = await _insert_due_events(first, count)
        release = asyncio.Event()
        a, b = ObservedRelay(first.relay, hold=release), ObservedRelay(second.relay)
        task = asyncio.create_task(first.relay.drain())
        try:
            await asyncio.wait_for(a.working.wait(), 30)  # A committed its claim (lease taken)
            await asyncio.wait_for(second.relay.drain(), 60)
        finally:
            release.set()
            await asyncio.wait_for(task, 60)
        db_ids, events = await sql_state(first)
        assert_outbox_complete(db_ids, events)  # the work itself is all done either way
        assert sorted(db_ids) == sorted(ids)
        twice = sorted(set(a.handled) & set(b.handled))
        assert not twice, f"{len(twice)} event(s) handled by both relays, e.g. {twice[:5]}"
        # A held its first claim (200); B took the 100 that were due, and only those
        assert (len(a.handled), len(b.handled)) == (200, 100)


@PG_ONLY
async def test_calls_succeed_after_postgres_closed_the_servers_connections(
    settings: Settings, embedder: Embedder, seed_decision: dict[str, Any]
) -> None:
    """Postgres restarting (or an operator's ``pg_terminate_backend``) closes every pooled
    connection of the server. Once that has happened, the next calls of every kind get fresh
    connections instead of failing. (No background relay here: its own pass would otherwise
    be the first to meet a closed connection.)"""
    intent = {
        "intent": "Cache sessions in Redis",
        "category": "architecture",
        "stakes": "medium",
        "confidence": 0.7,
    }
    app = create_app(replace(settings, relay_enabled=False), embedder=embedder)
    pool_events = app.state.services.db.write_engine.sync_engine
    idle: dict[int, Any] = {}  # the pooled connections not checked out, by record

    @event.listens_for(pool_events, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        idle[id(record)] = record

    @event.listens_for(pool_events, "checkout")
    def _checkout(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle.pop(id(record), None)

    async with serve_app(app) as client:
        rpc = Rpc(client)
        # concurrent calls, so the pool holds more than one connection as a rule (announcements
        # only: a recorded decision's outbox bookkeeping would run in a transaction of its
        # own in the background and meet a closed connection first)
        await asyncio.gather(*(rpc.ok("cstp.announceIntent", intent) for _ in range(4)))
        closed = await run_sql(
            settings.database_url,
            "SELECT pg_terminate_backend(pid) AS closed FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert closed and all(row["closed"] for row in closed), closed

        async def closes_seen() -> tuple[bool, Any]:
            # The case the test is about: the closes arrived while the connections sat in the
            # pool, and asyncpg has seen them (from the event loop) before the next checkout.
            drivers = [r.driver_connection for r in idle.values()]
            still_open = [d for d in drivers if d is not None and not d.is_closed()]
            return bool(idle) and not still_open, (len(idle), len(still_open))

        await poll_until(closes_seen, 10, "every pooled connection seen closed")
        for _ in range(3):  # more calls than one connection: each pooled one is replaced
            results = await asyncio.gather(
                rpc.ok("cstp.announceIntent", intent),
                rpc.ok("cstp.recordDecision", seed_decision),
                rpc.ok("cstp.queryDecisions", {"query": "session cache"}),
                rpc.ok("cstp.checkGuardrails", {"action": {"description": "Cache sessions"}}),
            )
            assert results[0]["received"] is True and results[1]["success"] is True
            assert isinstance(results[2]["decisions"], list) and "allowed" in results[3]
        found = await rpc.ok("cstp.queryDecisions", {"query": seed_decision["decision"]})
        assert found["total"] == 3  # the decision recorded once per round
