"""Acceptance of the decision write path (seed F007; docs/PROTOCOL.md, the envelope and decision
files), through the real RPC over HTTP: recordDecision, getDecision, listDecisions, the YAML
export, the vector index, id collisions, concurrency, an index outage healed by the outbox, and
rebuilding the tree.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from app.asgi import create_app
from app.config import Settings
from app.db.decisions import Decision
from app.db.outbox import OutboxEvent
from app.decisions import bulk
from app.runtime import Runtime
from app.search.embedder import Embedder
from app.search.index import IndexUnavailable
from app.services import build_services
from support.app import AppClient, Rpc, serve_app, settings_in
from support.databases import copy_database
from support.processes import ChromaServer
from support.waiting import poll_until

ID_RE = re.compile(r"^[0-9a-f]{8}$")
ISO_UTC_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")
CAMEL_RE = re.compile(r"^[a-z][a-zA-Z0-9]*$")
SECTION3_ORDER = [
    "id",
    "summary",
    "decision",
    "category",
    "confidence",
    "stakes",
    "status",
    "date",
    "context",
    "reasons",
    "kpi_indicators",
    "mental_state",
    "review_by",
    "tags",
    "pre_decision",
    "recorded_by",
    "project",
    "feature",
    "pr",
    "file",
    "line",
    "commit",
    "outcome",
    "reviewed_at",
    "reviewed_by",
    "actual_result",
    "lessons",
    "review_notes",
    "affected_kpis",
]
UNRELATED = [
    "Adopt weekly retrospective meetings for the team",
    "Use ruff as the Python linter and formatter",
    "Rotate third-party API keys every 90 days",
    "Deploy the auth service to production on Fridays only",
]
PARAPHRASE = "Picked Postgres as the database for storing agent memory"


# ---------------------------------------------------------------- helpers


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def yaml_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (not only *.yaml: stray temp files must show up too)."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_section3_order(doc: dict[str, Any]) -> None:
    assert set(doc) <= set(SECTION3_ORDER), set(doc) - set(SECTION3_ORDER)
    assert list(doc) == [k for k in SECTION3_ORDER if k in doc]


def yaml_of(settings: Settings, result: dict[str, Any]) -> tuple[Path, bytes]:
    path = settings.decisions_dir / result["path"].removeprefix("decisions/")
    return path, path.read_bytes()


async def outbox_rows(client: AppClient) -> list[tuple[str, str, str]]:
    services = client.app.state.services
    async with services.db.transaction(write=False) as session:
        rows = await session.execute(
            select(OutboxEvent.kind, OutboxEvent.decision_id, OutboxEvent.status).order_by(
                OutboxEvent.id
            )
        )
        return [(k, d, s) for k, d, s in rows.all()]


@asynccontextmanager
async def app_client(
    settings: Settings, embedder: Embedder, runtime: Runtime | None = None
) -> AsyncIterator[tuple[Rpc, AppClient]]:
    async with serve_app(create_app(settings, runtime=runtime, embedder=embedder)) as client:
        yield Rpc(client), client


def simple(text: str, **extra: Any) -> dict[str, Any]:
    return {"decision": text, "confidence": 0.7, "category": "process", **extra}


# ---------------------------------------------------------------- 1. the seed example


async def test_seed_example_is_recorded_exported_and_findable_at_once(
    rpc: Any, services: Any, settings: Settings, seed_decision: dict[str, Any]
) -> None:
    others = [await rpc.ok("cstp.recordDecision", simple(t)) for t in UNRELATED]
    result = await rpc.ok("cstp.recordDecision", seed_decision)

    assert set(result) == {"success", "id", "path", "indexed", "timestamp", "quality"}
    assert result["success"] is True and result["indexed"] is True
    assert result["quality"] == {"flags": []}  # a decision, not a status update
    assert ID_RE.match(result["id"])
    assert result["id"] not in {o["id"] for o in others}
    assert ISO_UTC_RE.match(result["timestamp"]), result["timestamp"]
    when = parse_ts(result["timestamp"])
    assert result["path"] == (
        f"decisions/{when:%Y}/{when:%m}/{when:%Y-%m-%d}-decision-{result['id']}.yaml"
    )

    path, raw = yaml_of(settings, result)
    assert path.is_file()
    doc = yaml.safe_load(raw.decode("utf-8"))
    expected_keys = [
        "id",
        "summary",
        "decision",
        "category",
        "confidence",
        "stakes",
        "status",
        "date",
        "context",
        "reasons",
        "kpi_indicators",
        "mental_state",
        "review_by",
        "tags",
        "pre_decision",
        "recorded_by",
    ]
    assert list(doc) == expected_keys  # SPEC section 3's order, nothing empty, nothing extra
    assert doc["id"] == result["id"]
    assert doc["summary"] == seed_decision["decision"]
    assert doc["decision"] == seed_decision["decision"]
    assert doc["category"] == "architecture"
    assert doc["confidence"] == 0.85
    assert doc["stakes"] == "high"
    assert doc["status"] == "pending"
    assert parse_ts(str(doc["date"])) == when
    assert doc["context"] == seed_decision["context"]
    assert doc["reasons"] == [
        {"type": "analysis", "text": "ACID compliance needed for consistency", "strength": 0.9},
        {"type": "pattern", "text": "Similar to prior successful database choice", "strength": 0.7},
    ]
    assert doc["kpi_indicators"] == ["latency", "consistency"]
    assert doc["mental_state"] == "deliberate"
    assert parse_ts(str(doc["review_by"])) == when + timedelta(days=30)
    assert doc["tags"] == ["database", "infrastructure"]
    assert doc["pre_decision"] == {
        "query_run": True,
        "similar_found": 2,
        "guardrails_checked": True,
        "guardrails_passed": True,
    }
    assert doc["recorded_by"] == "alice"

    hits = await services.index.query(PARAPHRASE, where=None, limit=5, workspace="default")
    assert hits[0].id == result["id"]
    assert len(hits) == 5

    found = await rpc.ok("cstp.queryDecisions", {"query": PARAPHRASE, "limit": 5})
    assert found["decisions"][0]["id"] == result["id"]
    assert len(found["decisions"]) == 5


# ---------------------------------------------------------------- 2. getDecision


async def test_get_decision_returns_every_stored_field_camel_case(
    shared_rpc: Any, seed_decision: dict[str, Any]
) -> None:
    project = {
        "project": "cstp",
        "feature": "F007",
        "pr": 42,
        "file": "app/x.py",
        "line": 7,
        "commit": "abc1234",
    }
    result = await shared_rpc.ok("cstp.recordDecision", {**seed_decision, **project})
    answer = await shared_rpc.ok("cstp.getDecision", {"id": result["id"]})
    assert answer["found"] is True
    d = answer["decision"]
    assert all(CAMEL_RE.match(k) for k in d), [k for k in d if not CAMEL_RE.match(k)]
    assert d["id"] == result["id"]
    assert d["decision"] == seed_decision["decision"]
    assert d["confidence"] == 0.85
    assert d["category"] == "architecture"
    assert d["stakes"] == "high"
    assert d["status"] == "pending"
    assert d["context"] == seed_decision["context"]
    assert d["reasons"] == seed_decision["reasons"]
    assert d["kpiIndicators"] == ["latency", "consistency"]
    assert d["mentalState"] == "deliberate"
    assert d["reviewIn"] == "30d"
    assert parse_ts(d["reviewBy"]) == parse_ts(result["timestamp"]) + timedelta(days=30)
    assert d["tags"] == ["database", "infrastructure"]
    assert d["preDecision"] == seed_decision["preDecision"]
    assert d["recordedBy"] == "alice"
    assert parse_ts(d["createdAt"]) == parse_ts(result["timestamp"])
    assert d["path"] == result["path"]
    for key, value in project.items():
        assert d[key] == value, key
    assert d["reviews"] == []

    again = await shared_rpc.ok("cstp.getDecision", {"decision_id": result["id"]})
    assert again == answer


async def test_get_decision_errors(shared_rpc: Any) -> None:
    missing = await shared_rpc.error("cstp.getDecision", {"id": "0000abcd"})
    assert missing["code"] == -32007
    assert missing["data"]["id"] == "0000abcd"
    for params in ({"id": "xyz"}, {"id": 12345678}, {}, {"id": "0000abcd\n"}):
        bad = await shared_rpc.error("cstp.getDecision", params)
        assert bad["code"] == -32602, params
        assert bad["data"]["field"] == "id", params


# ---------------------------------------------------------------- 3. validation


def _without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {k: v for k, v in p.items() if k != key}


def _with(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {**p, **changes}


def _reason(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(p: dict[str, Any]) -> dict[str, Any]:
        first = {**p["reasons"][0], **changes}
        first = {k: v for k, v in first.items() if v is not ...}
        return {**p, "reasons": [first, *p["reasons"][1:]]}

    return apply


INVALID = [
    ("missing-decision", _without("decision"), "decision"),
    ("blank-decision", _with(decision="   "), "decision"),
    ("missing-confidence", _without("confidence"), "confidence"),
    ("confidence-1.5", _with(confidence=1.5), "confidence"),
    ("confidence-negative", _with(confidence=-0.1), "confidence"),
    ("confidence-string", _with(confidence="0.9"), "confidence"),
    ("confidence-bool", _with(confidence=True), "confidence"),
    ("missing-category", _without("category"), "category"),
    ("category-unknown", _with(category="cooking"), "category"),
    ("stakes-unknown", _with(stakes="huge"), "stakes"),
    ("reason-type", _reason(type="vibes"), "reasons[0].type"),
    ("reason-no-text", _reason(text=...), "reasons[0].text"),
    ("reason-strength", _reason(strength=2), "reasons[0].strength"),
    ("mental-state", _with(mentalState="sleepy"), "mentalState"),
    ("review-in", _with(reviewIn="soon"), "reviewIn"),
    ("review-in-newline", _with(reviewIn="5d\n"), "reviewIn"),
    ("tags-not-list", _with(tags="database"), "tags"),
    ("pr-not-int", _with(pr="abc"), "pr"),
]


@pytest.fixture(scope="module")
async def refused(
    template_db: str, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[tuple[Rpc, AppClient, Settings]]:
    """One app for the calls that must write nothing: its database, tree and outbox stay
    empty for as long as each of them is refused (the first one that wrote would fail)."""
    folder = tmp_path_factory.mktemp("refused")
    async with copy_database(template_db, folder) as url:
        settings = settings_in(folder, url)
        async with app_client(settings, embedder) as (rpc, client):
            yield rpc, client, settings


@pytest.mark.parametrize(
    ("mutate", "field"), [(m, f) for _n, m, f in INVALID], ids=[n for n, _m, _f in INVALID]
)
async def test_invalid_params_name_the_field_and_write_nothing(
    refused: tuple[Rpc, AppClient, Settings],
    seed_decision: dict[str, Any],
    mutate: Callable[[dict[str, Any]], dict[str, Any]],
    field: str,
) -> None:
    rpc, client, settings = refused
    error = await rpc.error("cstp.recordDecision", mutate(seed_decision))
    assert error["code"] == -32602
    assert error["message"] == "Invalid params"
    assert error["data"]["field"] == field
    assert isinstance(error["data"]["error"], str) and error["data"]["error"]
    assert (await rpc.ok("cstp.listDecisions"))["total"] == 0
    assert await outbox_rows(client) == []
    assert yaml_files(settings.decisions_dir) == {}


async def test_zero_confidence_is_a_value(shared_rpc: Any, shared_settings: Settings) -> None:
    result = await shared_rpc.ok("cstp.recordDecision", simple("Keep the monolith", confidence=0.0))
    got = (await shared_rpc.ok("cstp.getDecision", {"id": result["id"]}))["decision"]
    assert got["confidence"] == 0.0 and isinstance(got["confidence"], float)
    doc = yaml.safe_load(yaml_of(shared_settings, result)[1])
    assert doc["confidence"] == 0.0 and isinstance(doc["confidence"], float)
    assert result["indexed"] is True
    for whole in (0, 1):  # JSON integers are numbers too
        other = await shared_rpc.ok(
            "cstp.recordDecision",
            simple(
                "Whole confidence",
                confidence=whole,
                reasons=[{"type": "analysis", "text": "no strength"}],
            ),
        )
        got = (await shared_rpc.ok("cstp.getDecision", {"id": other["id"]}))["decision"]
        assert got["confidence"] == float(whole)
        assert got["reasons"] == [{"type": "analysis", "text": "no strength", "strength": 0.8}]


async def test_unknown_params_are_ignored_and_null_means_absent(
    shared_rpc: Any, shared_settings: Settings
) -> None:
    params = {
        **simple("Adopt trunk-based development"),
        "bogus": {"nested": [1, 2]},
        "agent": {"id": "mallory"},
        "retrievalMode": "semantic",
        "stakes": None,
        "context": None,
        "reasons": None,
        "kpiIndicators": None,
        "mentalState": None,
        "reviewIn": None,
        "tags": None,
        "preDecision": None,
        "project": None,
        "pr": None,
        "line": None,
    }
    result = await shared_rpc.ok("cstp.recordDecision", params)
    d = (await shared_rpc.ok("cstp.getDecision", {"id": result["id"]}))["decision"]
    assert d["stakes"] == "medium"  # the default, as if absent
    assert d["recordedBy"] == "alice"
    assert d["reasons"] == [] and d["tags"] == [] and d["kpiIndicators"] == []
    assert d["context"] is None and d["mentalState"] is None and d["reviewBy"] is None
    assert "bogus" not in d
    doc = yaml.safe_load(yaml_of(shared_settings, result)[1])
    assert list(doc) == [
        "id",
        "summary",
        "decision",
        "category",
        "confidence",
        "stakes",
        "status",
        "date",
        "recorded_by",
    ]


async def test_project_context_fills_in_the_project_fields_only(shared_rpc: Any) -> None:
    """SPEC section 2: project_context is "an object holding the project fields"; it is no
    back door for the other params."""
    base = {"decision": "Cache embeddings on disk", "category": "tooling"}
    sneaked = await shared_rpc.error(
        "cstp.recordDecision", dict(base, project_context={"confidence": 0.9, "project": "p1"})
    )
    assert sneaked["code"] == -32602 and sneaked["data"]["field"] == "confidence"
    for not_an_object in ("p1", ["p1"], 3):
        error = await shared_rpc.error(
            "cstp.recordDecision", dict(base, confidence=0.9, project_context=not_an_object)
        )
        assert error["code"] == -32602, not_an_object
        assert error["data"]["field"] == "project_context", not_an_object
    wrong = await shared_rpc.error(
        "cstp.recordDecision", dict(base, confidence=0.9, project_context={"pr": "abc"})
    )
    assert wrong["data"]["field"] == "project_context.pr"
    both = await shared_rpc.ok(
        "cstp.recordDecision",
        dict(
            base, confidence=0.9, project="top", project_context={"project": "ctx", "feature": "f"}
        ),
    )
    stored = (await shared_rpc.ok("cstp.getDecision", {"id": both["id"]}))["decision"]
    assert stored["project"] == "top" and stored["feature"] == "f"


async def test_snake_case_aliases(shared_rpc: Any, shared_settings: Settings) -> None:
    params = {
        **simple("Cache embeddings on disk"),
        "kpi_indicators": ["latency"],
        "mental_state": "exploratory",
        "review_in": "2w",
        "pre_decision": {"queryRun": True, "similarFound": 3},
        "project_context": {"project": "x", "pr": 3},
    }
    result = await shared_rpc.ok("cstp.recordDecision", params)
    d = (await shared_rpc.ok("cstp.getDecision", {"id": result["id"]}))["decision"]
    assert d["kpiIndicators"] == ["latency"]
    assert d["mentalState"] == "exploratory"
    assert d["reviewIn"] == "2w"
    assert parse_ts(d["reviewBy"]) == parse_ts(result["timestamp"]) + timedelta(days=14)
    assert d["preDecision"]["queryRun"] is True and d["preDecision"]["similarFound"] == 3
    assert d["project"] == "x" and d["pr"] == 3
    doc = yaml.safe_load(yaml_of(shared_settings, result)[1])
    assert doc["project"] == "x" and doc["pr"] == 3
    assert_section3_order(doc)
    assert doc["kpi_indicators"] == ["latency"] and doc["mental_state"] == "exploratory"


# ---------------------------------------------------------------- 4. id collisions


async def test_colliding_id_is_redrawn_never_overwritten(
    settings: Settings, embedder: Embedder
) -> None:
    ids = iter(["aaaaaaaa", "aaaaaaaa", "bbbbbbbb"])
    runtime = Runtime(decision_id=lambda: next(ids))
    async with app_client(settings, embedder, runtime) as (rpc, _client):
        first = await rpc.ok("cstp.recordDecision", simple("First decision: use SQLite"))
        second = await rpc.ok("cstp.recordDecision", simple("Second decision: use Redis"))
        assert first["id"] == "aaaaaaaa"
        assert second["id"] == "bbbbbbbb"
        assert second["indexed"] is True
        kept = (await rpc.ok("cstp.getDecision", {"id": "aaaaaaaa"}))["decision"]
        assert kept["decision"] == "First decision: use SQLite"
        other = (await rpc.ok("cstp.getDecision", {"id": "bbbbbbbb"}))["decision"]
        assert other["decision"] == "Second decision: use Redis"
        assert (await rpc.ok("cstp.listDecisions"))["total"] == 2
        doc = yaml.safe_load(yaml_of(settings, first)[1])
        assert doc["decision"] == "First decision: use SQLite"
        assert len(yaml_files(settings.decisions_dir)) == 2


async def test_a_group_whose_commit_raised_after_the_database_committed_is_not_written_twice(
    settings: Settings, embedder: Embedder
) -> None:
    """The connection can be lost while COMMIT is answered: the rows are stored, the writer
    sees an error. Writing the group again would record every decision twice (new ids); each
    call must instead be answered as committed. The fault is injected after the commit."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    armed = {"left": 1}

    def mark(session: Session, _context: Any, _instances: Any) -> None:
        if any(isinstance(o, Decision) for o in session.new):
            session.info["decisions"] = True

    def lost_answer(session: Session) -> None:
        if session.info.pop("decisions", False) and armed["left"]:
            armed["left"] -= 1
            raise ConnectionResetError("connection lost while COMMIT was answered")

    event.listen(Session, "before_flush", mark)
    event.listen(Session, "after_commit", lost_answer)
    try:
        async with app_client(settings, embedder) as (rpc, _client):
            answers = await asyncio.gather(
                *(
                    rpc.ok("cstp.recordDecision", simple(f"Decision {n}: cache the embeddings"))
                    for n in range(3)
                )
            )
            assert armed["left"] == 0  # the fault did happen
            listed = await rpc.ok("cstp.listDecisions", {"limit": 50})
            assert listed["total"] == 3, listed
            assert sorted(d["id"] for d in listed["decisions"]) == sorted(a["id"] for a in answers)
            assert all(a["indexed"] for a in answers), answers
            assert len(yaml_files(settings.decisions_dir)) == 3
    finally:
        event.remove(Session, "before_flush", mark)
        event.remove(Session, "after_commit", lost_answer)


async def test_concurrent_records_drawing_a_taken_id_all_succeed(
    settings: Settings, embedder: Embedder
) -> None:
    """Concurrent calls are committed together; a colliding id in such a group must neither
    fail the other calls nor overwrite the stored decision."""
    drawn = itertools.chain(["aaaaaaaa"] * 4, (f"{n:08x}" for n in itertools.count(0xB0000000)))
    runtime = Runtime(decision_id=lambda: next(drawn))
    async with app_client(settings, embedder, runtime) as (rpc, _client):
        first = await rpc.ok("cstp.recordDecision", simple("Kept: the first decision"))
        assert first["id"] == "aaaaaaaa"
        texts = [f"Concurrent decision {n} about message queue {n}" for n in range(6)]
        answers = await asyncio.gather(*(rpc.ok("cstp.recordDecision", simple(t)) for t in texts))
        ids = [a["id"] for a in answers]
        assert len(set(ids)) == 6 and "aaaaaaaa" not in ids
        assert all(a["success"] is True and a["indexed"] is True for a in answers)
        for text_, answer in zip(texts, answers, strict=True):
            got = (await rpc.ok("cstp.getDecision", {"id": answer["id"]}))["decision"]
            assert got["decision"] == text_
        kept = (await rpc.ok("cstp.getDecision", {"id": "aaaaaaaa"}))["decision"]
        assert kept["decision"] == "Kept: the first decision"
        assert (await rpc.ok("cstp.listDecisions"))["total"] == 7
        assert len(yaml_files(settings.decisions_dir)) == 7


async def test_id_taken_by_a_concurrent_uncommitted_insert_is_redrawn(
    settings: Settings, embedder: Embedder
) -> None:
    """Another transaction has inserted ``aaaaaaaa`` but not committed: the call cannot see it
    (on Postgres its INSERT waits on the primary key, then fails when the other commits), so
    the collision is only caught by the key. It must be redrawn, not overwritten or an error.
    On SQLite writers are serialised, so the call sees the committed row and redraws."""
    ids = iter(["00000000", "aaaaaaaa", "bbbbbbbb"])
    runtime = Runtime(decision_id=lambda: next(ids))
    other = create_async_engine(settings.database_url)
    try:
        # No background relay: the call is then the app's only writer once the warm-up's
        # outbox bookkeeping is recorded, so a writer seen waiting below is the call.
        quiet = replace(settings, relay_enabled=False)
        async with app_client(quiet, embedder, runtime) as (rpc, client):
            # a first call opens the app's connections (and switches a SQLite file to WAL)
            await rpc.ok("cstp.recordDecision", simple("Warm-up decision"))
            await client.app.state.services.relay.flush()
            async with AsyncSession(other) as session:
                await session.begin()
                session.add(
                    Decision(
                        id="aaaaaaaa",
                        summary="Held by another writer",
                        decision="Held by another writer",
                        category="process",
                        confidence=0.5,
                        stakes="medium",
                        status="pending",
                        created_at=datetime.now(UTC),
                        recorded_by="bob",
                    )
                )
                await session.flush()
                call = asyncio.create_task(
                    rpc.call("cstp.recordDecision", simple("Mine: use Redis"))
                )
                await _until_blocked_on_a_lock(settings, client.app.state.services, call)
                await session.commit()
            answer = await asyncio.wait_for(call, 30)
            assert "result" in answer, answer
            assert answer["result"]["id"] == "bbbbbbbb"
            held = (await rpc.ok("cstp.getDecision", {"id": "aaaaaaaa"}))["decision"]
            assert held["decision"] == "Held by another writer"
            mine = (await rpc.ok("cstp.getDecision", {"id": "bbbbbbbb"}))["decision"]
            assert mine["decision"] == "Mine: use Redis"
    finally:
        await other.dispose()


async def _until_blocked_on_a_lock(
    settings: Settings, services: Any, call: asyncio.Task[Any]
) -> None:
    """Wait until the call waits on the lock the other transaction holds. Postgres: some
    backend of the database waits on a lock (the call's INSERT, on the held id). SQLite: an
    app write connection has sent its ``BEGIN IMMEDIATE``, which waits for the other
    transaction's write lock (the call's group commit: no other writer runs here)."""

    async def check(waiting: Callable[[], Any]) -> tuple[bool, Any]:
        if call.done():
            raise AssertionError("the recordDecision call never waited on the held id")
        return bool(await waiting()), None

    if settings.is_sqlite:
        began = threading.Event()

        def on_execute(*args: Any) -> None:
            # Runs as the statement goes to the driver; the poll below sees it only once the
            # statement is with aiosqlite's thread (the loop runs nothing else before that).
            if args[2] == "BEGIN IMMEDIATE":
                began.set()

        engine = services.db.write_engine.sync_engine
        event.listen(engine, "before_cursor_execute", on_execute)
        try:

            async def sent() -> bool:
                return began.is_set()

            await poll_until(lambda: check(sent), 20, "the call waiting for the write lock")
        finally:
            event.remove(engine, "before_cursor_execute", on_execute)
        return
    dsn = settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    try:

        async def lock_waits() -> int:
            return await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )

        await poll_until(lambda: check(lock_waits), 20, "the call waiting on the held id")
    finally:
        await conn.close()


# ---------------------------------------------------------------- 5. concurrency


async def test_fifty_concurrent_records(
    rpc: Any, client: Any, services: Any, settings: Settings
) -> None:
    params = [
        simple(f"Concurrent decision number {n} about caching layer {n}", tags=[f"n{n}"])
        for n in range(50)
    ]
    answers = await asyncio.gather(*(rpc.call("cstp.recordDecision", p) for p in params))
    assert all("result" in a for a in answers), [a for a in answers if "result" not in a]
    results = [a["result"] for a in answers]
    assert all(r["success"] is True and r["indexed"] is True for r in results)
    ids = {r["id"] for r in results}
    assert len(ids) == 50 and all(ID_RE.match(i) for i in ids)
    assert (await rpc.ok("cstp.listDecisions", {"limit": 500}))["total"] == 50
    files = yaml_files(settings.decisions_dir)
    assert len(files) == 50
    assert {r["path"].removeprefix("decisions/") for r in results} == set(files)
    assert await services.index.count() == 50
    await services.relay.flush()  # the outbox bookkeeping is recorded off the answer's path
    assert {s for _k, _d, s in await outbox_rows(client)} == {"done"}


# Slow: a load of 30 announcements and 30 linked records at once (the fast loop keeps the
# fifty concurrent records above).
@pytest.mark.slow
async def test_more_concurrent_linked_records_than_database_connections(
    rpc: Any, services: Any
) -> None:
    """Records that name their announced intent look the intent up first. That lookup must
    not keep a database connection while the call waits for its rows to be committed: on
    Postgres 30 such calls at once (more than the pool's 20 connections) would otherwise
    leave the group writer no connection to commit with, and stall until the pool's
    30 s checkout timeout."""
    n = 30
    for i in range(n):
        await rpc.ok(
            "cstp.announceIntent",
            {"intent": f"Cache layer {i} for the search API", "correlationId": f"linked-{i}"},
        )
    answers = await asyncio.wait_for(
        asyncio.gather(
            *(
                rpc.call(
                    "cstp.recordDecision",
                    simple(f"Add cache layer {i} to the search API", correlationId=f"linked-{i}"),
                )
                for i in range(n)
            )
        ),
        timeout=20,
    )
    assert all("result" in a for a in answers), [a for a in answers if "result" not in a]
    ids = [a["result"]["id"] for a in answers]
    assert len(set(ids)) == n
    for i, decision_id in enumerate(ids):
        decision = (await rpc.ok("cstp.getDecision", {"id": decision_id}))["decision"]
        assert decision["decision"] == f"Add cache layer {i} to the search API"


async def test_cancelling_a_drain_leaves_the_calls_it_waited_for_alone(
    rpc: Any, services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``drain`` (shutdown) waits for the group writer's work; if that wait is cancelled, the
    work goes on and the call still gets its answer, with its decision indexed."""
    reached, gate = asyncio.Event(), asyncio.Event()
    prepare = services.index.prepare

    async def slow_prepare(texts: Any) -> None:
        reached.set()
        await gate.wait()
        await prepare(texts)

    monkeypatch.setattr(services.index, "prepare", slow_prepare)
    call = asyncio.ensure_future(rpc.ok("cstp.recordDecision", simple("Keep the cache warm")))
    await asyncio.wait_for(reached.wait(), timeout=10)
    drain = asyncio.ensure_future(services.recorder.drain())

    async def committed() -> tuple[bool, Any]:
        listed = await rpc.ok("cstp.listDecisions")
        return listed["total"] == 1, listed["total"]

    # the decision is committed, the call is not answered: its delivery waits for the
    # embedding, and so does the drain
    await poll_until(committed, 10, "the decision committed")
    assert not call.done()
    assert not drain.done()
    drain.cancel()
    gate.set()
    result = await asyncio.wait_for(call, timeout=10)
    assert result["success"] is True and result["indexed"] is True


# ---------------------------------------------------------------- 6. vector index outage


# Slow: fault injection on a `chroma run` process (the fast loop's test_outbox_outage heals
# on a fake clock).
@pytest.mark.slow
async def test_index_outage_is_healed_by_the_relay_without_help(
    settings: Settings, embedder: Embedder, chroma_server: ChromaServer
) -> None:
    await asyncio.to_thread(chroma_server.start)
    remote = replace(settings, chroma_url=f"http://127.0.0.1:{chroma_server.port}")
    async with app_client(remote, embedder) as (rpc, client):
        services = client.app.state.services
        first = await rpc.ok("cstp.recordDecision", simple("Use Chroma as the vector index"))
        assert first["indexed"] is True

        await asyncio.to_thread(chroma_server.stop)
        later = [await rpc.ok("cstp.recordDecision", simple(t)) for t in UNRELATED[:3]]
        for result in later:
            assert result["success"] is True and result["indexed"] is False
        assert (await rpc.ok("cstp.listDecisions"))["total"] == 4
        for result in later:
            assert yaml_of(remote, result)[0].is_file()
        await services.relay.flush()
        rows = await outbox_rows(client)
        pending = {d for kind, d, status in rows if kind == "index" and status == "pending"}
        assert pending == {r["id"] for r in later}
        assert all(status == "done" for kind, _d, status in rows if kind == "export")

        await asyncio.to_thread(chroma_server.start)

        async def healed() -> tuple[bool, Any]:
            try:
                count = await services.index.count()
            except IndexUnavailable:
                count = -1
            statuses = {status for _k, _d, status in await outbox_rows(client)}
            return count == 4 and statuses == {"done"}, (count, statuses)

        await poll_until(healed, 40, "index complete and outbox done", interval=0.25)
        hits = await services.index.query(UNRELATED[2], where=None, limit=1, workspace="default")
        assert hits[0].id == later[2]["id"]


# ---------------------------------------------------------------- 7. rebuilding the tree


async def test_export_all_rebuilds_a_byte_identical_tree(
    rpc: Any,
    services: Any,
    settings: Settings,
    embedder: Embedder,
    seed_decision: dict[str, Any],
) -> None:
    await rpc.ok("cstp.recordDecision", seed_decision)
    unicode = await rpc.ok(
        "cstp.recordDecision",
        simple(
            "Entscheidung: café ☕",
            context="Grüße aus Köln — naïve “quotes”",
            tags=["ünïcode"],
            reasons=[{"type": "intuition", "text": "Ça va ✓"}],
        ),
    )
    for text in UNRELATED:
        await rpc.ok("cstp.recordDecision", simple(text, confidence=0.0))
    before = yaml_files(settings.decisions_dir)
    assert len(before) == 2 + len(UNRELATED)
    raw = before[unicode["path"].removeprefix("decisions/")]
    assert "Entscheidung: café ☕".encode() in raw  # real UTF-8, not escapes

    shutil.rmtree(settings.decisions_dir)
    assert yaml_files(settings.decisions_dir) == {}

    reports: list[tuple[int, int]] = []
    count = await bulk.export_all(services, progress=lambda d, t: reports.append((d, t)), batch=2)
    n = len(before)
    assert count == n
    for content in before.values():
        assert_section3_order(yaml.safe_load(content))
    assert yaml_files(settings.decisions_dir) == before
    assert reports[-1] == (n, n)
    assert len(reports) >= 3  # several batches
    assert [d for d, _t in reports] == sorted(d for d, _t in reports)
    assert all(t == n for _d, t in reports)

    # exporting again over an existing tree changes nothing; the CLI's way: its own services
    own = build_services(settings, embedder=embedder)
    try:
        assert await bulk.export_all(own) == n
    finally:
        await own.close()
    assert yaml_files(settings.decisions_dir) == before


async def test_export_all_of_an_empty_database(settings: Settings, embedder: Embedder) -> None:
    services = build_services(settings, embedder=embedder)
    reports: list[tuple[int, int]] = []
    try:
        assert await bulk.export_all(services, progress=lambda d, t: reports.append((d, t))) == 0
    finally:
        await services.close()
    assert reports == [(0, 0)]
    assert yaml_files(settings.decisions_dir) == {}


# ---------------------------------------------------------------- 8. listDecisions


class Clock:
    def __init__(self, value: datetime) -> None:
        self.value = value

    def __call__(self) -> datetime:
        return self.value


DAY0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
# (text, category, stakes, token, tags, confidence); recorded one day apart from DAY0
LISTED = [
    ("Use PostgreSQL for storage", "architecture", "high", "token-alice", ["db", "infra"], 0.9),
    ("Adopt weekly Retrospectives", "process", "low", "token-alice", ["db"], 0.5),
    ("Rotate API keys every 90 days", "security", "critical", "token-bob", ["infra", "sec"], 0.7),
    ("Use ruff as the linter", "tooling", "medium", "token-bob", [], 0.3),
    (
        "Integrate with the POSTGRES replica",
        "integration",
        "medium",
        "token-alice",
        ["db", "infra", "x"],
        0.6,
    ),
]
STAKES_RANK = {"low": 0, "medium": 1, "high": 2, "critical": 3}


@pytest.fixture(scope="module")
async def listed(
    template_db: str, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[tuple[Rpc, list[dict[str, Any]]]]:
    """The five decisions (one reviewed) that the list tests only read: one app for them."""
    folder = tmp_path_factory.mktemp("listed")
    clock = Clock(DAY0)
    async with (
        copy_database(template_db, folder) as url,
        app_client(settings_in(folder, url), embedder, Runtime(now=clock)) as (rpc, _client),
    ):
        rows = []
        for n, (text, category, stakes, token, tags, confidence) in enumerate(LISTED):
            clock.value = DAY0 + timedelta(days=n)
            result = await rpc.ok(
                "cstp.recordDecision",
                {
                    "decision": text,
                    "category": category,
                    "stakes": stakes,
                    "tags": tags,
                    "confidence": confidence,
                },
                token=token,
            )
            rows.append(
                {
                    "id": result["id"],
                    "text": text,
                    "category": category,
                    "stakes": stakes,
                    "agent": token.removeprefix("token-"),
                    "tags": tags,
                    "confidence": confidence,
                    "createdAt": clock.value,
                    "status": "pending",
                }
            )
        clock.value = DAY0 + timedelta(days=10)
        reviewed = await rpc.ok("cstp.reviewDecision", {"id": rows[1]["id"], "outcome": "success"})
        assert reviewed["status"] == "reviewed"
        rows[1]["status"] = "reviewed"
        yield rpc, rows


def _ids(rows: list[dict[str, Any]], *picks: int) -> set[str]:
    return {rows[i]["id"] for i in picks}


async def _listed_ids(rpc: Rpc, **params: Any) -> set[str]:
    answer = await rpc.ok("cstp.listDecisions", {"limit": 500, **params})
    assert answer["total"] == len(answer["decisions"])
    return {d["id"] for d in answer["decisions"]}


async def test_list_filters(listed: tuple[Rpc, list[dict[str, Any]]]) -> None:
    rpc, rows = listed
    assert await _listed_ids(rpc) == _ids(rows, 0, 1, 2, 3, 4)
    assert await _listed_ids(rpc, category="security") == _ids(rows, 2)
    assert await _listed_ids(rpc, category="cooking") == set()
    assert await _listed_ids(rpc, stakes="medium") == _ids(rows, 3, 4)
    assert await _listed_ids(rpc, status="pending") == _ids(rows, 0, 2, 3, 4)
    assert await _listed_ids(rpc, status="reviewed") == _ids(rows, 1)
    assert await _listed_ids(rpc, agent="bob") == _ids(rows, 2, 3)
    assert await _listed_ids(rpc, agent="alice") == _ids(rows, 0, 1, 4)
    assert await _listed_ids(rpc, tags=["db"]) == _ids(rows, 0, 1, 4)
    assert await _listed_ids(rpc, tags=["db", "infra"]) == _ids(rows, 0, 4)
    assert await _listed_ids(rpc, tags=["infra", "sec"]) == _ids(rows, 2)
    assert await _listed_ids(rpc, tags=["nope"]) == set()
    assert await _listed_ids(rpc, dateFrom="2026-01-11T00:00:00Z") == _ids(rows, 1, 2, 3, 4)
    assert await _listed_ids(rpc, dateFrom="2026-01-12") == _ids(rows, 2, 3, 4)
    assert await _listed_ids(rpc, dateTo="2026-01-13T00:00:00Z") == _ids(rows, 0, 1, 2)
    assert await _listed_ids(rpc, dateTo="2026-01-12") == _ids(rows, 0, 1, 2)  # through the day
    assert await _listed_ids(
        rpc, dateFrom="2026-01-11T00:00:00Z", dateTo="2026-01-13T00:00:00+00:00"
    ) == _ids(rows, 1, 2)
    assert await _listed_ids(rpc, search="postgres") == _ids(rows, 0, 4)
    assert await _listed_ids(rpc, search="RETRO") == _ids(rows, 1)
    assert await _listed_ids(rpc, search="%") == set()  # LIKE wildcards are literal
    assert await _listed_ids(rpc, search="_") == set()
    assert await _listed_ids(rpc, agent="alice", tags=["infra"], stakes="high") == _ids(rows, 0)

    answer = await rpc.ok(
        "cstp.listDecisions", {"agent": "bob", "sort": "createdAt", "order": "asc"}
    )
    first = answer["decisions"][0]
    assert first["id"] == rows[2]["id"] and first["agent"] == "bob"
    assert first["category"] == "security" and first["stakes"] == "critical"
    assert first["tags"] == ["infra", "sec"] and first["confidence"] == 0.7
    assert first["status"] == "pending"
    assert parse_ts(first["date"]) == rows[2]["createdAt"]


def _expected_order(rows: list[dict[str, Any]], key: str, order: str) -> list[str]:
    def sort_key(row: dict[str, Any]) -> tuple[Any, str]:
        value = STAKES_RANK[row["stakes"]] if key == "stakes" else row[key]
        return value, row["id"]

    return [r["id"] for r in sorted(rows, key=sort_key, reverse=order == "desc")]


async def test_list_sorts(listed: tuple[Rpc, list[dict[str, Any]]]) -> None:
    rpc, rows = listed
    for key in ("createdAt", "confidence", "category", "status"):
        for order in ("asc", "desc"):
            answer = await rpc.ok("cstp.listDecisions", {"sort": key, "order": order})
            got = [d["id"] for d in answer["decisions"]]
            assert got == _expected_order(rows, key, order), (key, order)


async def test_list_sorts_stakes_by_severity(listed: tuple[Rpc, list[dict[str, Any]]]) -> None:
    rpc, rows = listed
    for order in ("asc", "desc"):
        answer = await rpc.ok("cstp.listDecisions", {"sort": "stakes", "order": order})
        got = [d["id"] for d in answer["decisions"]]
        assert got == _expected_order(rows, "stakes", order), order


async def test_list_default_order_is_newest_first(listed: tuple[Rpc, list[dict[str, Any]]]) -> None:
    rpc, rows = listed
    answer = await rpc.ok("cstp.listDecisions")
    assert [d["id"] for d in answer["decisions"]] == [r["id"] for r in reversed(rows)]
    assert answer["limit"] == 20 and answer["offset"] == 0 and answer["total"] == 5


async def test_list_pagination(listed: tuple[Rpc, list[dict[str, Any]]]) -> None:
    rpc, rows = listed
    pages = []
    for offset in (0, 2, 4, 6):
        answer = await rpc.ok(
            "cstp.listDecisions",
            {"limit": 2, "offset": offset, "sort": "createdAt", "order": "asc"},
        )
        assert answer["total"] == 5 and answer["limit"] == 2 and answer["offset"] == offset
        pages.append([d["id"] for d in answer["decisions"]])
    assert [len(p) for p in pages] == [2, 2, 1, 0]
    assert [i for page in pages for i in page] == [r["id"] for r in rows]
    filtered = await rpc.ok(
        "cstp.listDecisions",
        {"tags": ["db"], "limit": 1, "offset": 1, "sort": "createdAt", "order": "asc"},
    )
    assert filtered["total"] == 3
    assert [d["id"] for d in filtered["decisions"]] == [rows[1]["id"]]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"offset": -1}, "offset"),
        ({"sort": "title"}, "sort"),
        ({"order": "up"}, "order"),
        ({"stakes": "huge"}, "stakes"),
        ({"status": "done"}, "status"),
        ({"tags": "db"}, "tags"),
        ({"dateFrom": "yesterday"}, "dateFrom"),
        ({"dateTo": "2026-13-45"}, "dateTo"),
    ],
)
async def test_list_rejects_bad_params(shared_rpc: Any, params: dict[str, Any], field: str) -> None:
    error = await shared_rpc.error("cstp.listDecisions", params)
    assert error["code"] == -32602
    assert error["data"]["field"] == field


async def test_list_limit_bounds_are_inclusive(shared_rpc: Any) -> None:
    for limit in (1, 500):
        assert (await shared_rpc.ok("cstp.listDecisions", {"limit": limit}))["limit"] == limit


async def test_snake_case_keys_inside_pre_decision_are_read(
    shared_rpc: Rpc, seed_decision: dict[str, Any]
) -> None:
    params = {k: v for k, v in seed_decision.items() if k != "preDecision"}
    params["pre_decision"] = {"query_run": True, "similar_found": 3, "guardrails_passed": False}
    recorded = await shared_rpc.ok("cstp.recordDecision", params)
    got = await shared_rpc.ok("cstp.getDecision", {"id": recorded["id"]})
    assert got["decision"]["preDecision"] == {
        "queryRun": True,
        "similarFound": 3,
        "guardrailsChecked": None,
        "guardrailsPassed": False,
    }
