"""The SQL cookbook of docs/AUDIT.md, run as written on the test database (SQLite or Postgres).

Each query is taken from the document by its ``###`` heading and executed with SQLAlchemy
``text()`` against data made through the real RPC by an app whose clock the test moves, so
"last week" really leaves out an intent made ten days ago. Every query of the cookbook must be
checked here: a query added to the document without a test fails ``test_every_query_is_tested``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.db.base import UtcDateTime
from app.runtime import Runtime
from app.search.embedder import Embedder
from support.app import Rpc, serve_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "AUDIT.md"
NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
WEEK_AGO = NOW - timedelta(days=7)
MONTH_AGO = NOW - timedelta(days=30)
TIME_PARAMS = {"since", "until"}
TIME_COLUMNS = {"received_at", "created_at", "reviewed_at"}
BOOL_COLUMNS = {"allowed", "claimed_query_run"}

Q_BLOCKED = "Every intent of an agent last week that was blocked"
Q_FIRED = "Which guardrails fired for an announcement"
Q_SHOWN = "What an agent was shown before a decision"
Q_NO_DECISION = "Intents never followed by a decision"
Q_BY_CORRELATION = "A client's own id: the decisions that followed one announcement"
Q_FAILED = "Rate-limited or failed announcements by agent"
Q_UNANNOUNCED = "Decisions recorded without a prior announcement"
Q_DESPITE_BLOCK = "Decisions taken after a blocked announcement"
Q_REVIEWS = "Review history of a decision"
Q_OUTBOX = "Outbox work not yet done"
TESTED = {
    Q_BLOCKED,
    Q_FIRED,
    Q_SHOWN,
    Q_BY_CORRELATION,
    Q_NO_DECISION,
    Q_FAILED,
    Q_UNANNOUNCED,
    Q_DESPITE_BLOCK,
    Q_REVIEWS,
    Q_OUTBOX,
}


def load_cookbook() -> dict[str, str]:
    """``### heading`` → the first ```sql block under it, in the cookbook section."""
    doc = DOC.read_text(encoding="utf-8")
    assert "## SQL cookbook" in doc
    cookbook = doc.split("## SQL cookbook", 1)[1]
    queries: dict[str, str] = {}
    for section in re.split(r"^### ", cookbook, flags=re.M)[1:]:
        heading, _, body = section.partition("\n")
        block = re.search(r"^```sql\n(.*?)^```", body, flags=re.M | re.S)
        if block:
            assert heading.strip() not in queries, f"two queries named {heading!r}"
            queries[heading.strip()] = block.group(1)
    return queries


def test_every_query_is_tested() -> None:
    assert set(load_cookbook()) == TESTED


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


def normalized(row: Any) -> tuple[Any, ...]:
    """One row as plain Python values, the same on both databases."""
    out: list[Any] = []
    for key, value in row._mapping.items():
        if value is not None and key in TIME_COLUMNS:
            if isinstance(value, str):  # SQLite keeps naive UTC text
                value = datetime.fromisoformat(value).replace(tzinfo=UTC)
            value = value.astimezone(UTC)
        elif value is not None and key in BOOL_COLUMNS:
            value = bool(value)
        elif key == "distance":
            value = round(value, 6)
        out.append(value)
    return tuple(out)


async def run(conn: AsyncConnection, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    names = set(re.findall(r"(?<!:):([A-Za-z_]\w*)", sql))
    assert names == set(params), f"the query binds {sorted(names)}"
    query = text(sql).bindparams(
        *(bindparam(name, type_=UtcDateTime()) for name in names & TIME_PARAMS)
    )
    return [normalized(r) for r in (await conn.execute(query, params)).all()]


@dataclass
class World:
    """What the test did through the RPC, to compare the queries' answers with."""

    announced: dict[str, dict[str, Any]] = field(default_factory=dict)
    intents: dict[str, str] = field(default_factory=dict)
    decisions: dict[str, str] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def world_rpc(settings: Settings, embedder: Embedder) -> AsyncIterator[tuple[Rpc, Clock]]:
    clock = Clock(NOW - timedelta(days=10))
    audited = replace(
        settings, rate_limits=parse_rate_limits("default=1000/60,cstp.announceIntent=5/3600")
    )
    app = create_app(audited, runtime=Runtime(now=clock), embedder=embedder)
    async with serve_app(app) as client:
        yield Rpc(client), clock


async def build_world(rpc: Rpc, clock: Clock) -> World:
    world = World()

    def at(delta: timedelta) -> None:
        assert NOW - delta >= clock.now, "time only moves forward"
        clock.now = NOW - delta

    async def announce(cid: str, token: str = "token-alice", **params: Any) -> None:
        result = await rpc.ok("cstp.announceIntent", {**params, "correlationId": cid}, token)
        world.announced[cid] = result
        world.intents[cid] = params["intent"]

    async def record(name: str, text_: str, token: str = "token-alice", **params: Any) -> None:
        result = await rpc.ok(
            "cstp.recordDecision",
            {"decision": text_, "confidence": 0.8, "category": "architecture", **params},
            token,
        )
        assert result["indexed"] is True
        world.decisions[name] = result["id"]
        world.titles[name] = text_

    at(timedelta(days=10))
    await announce(
        "old-blocked",
        intent="Deploy the payments service to production on Friday",
        category="architecture",
        stakes="high",
        confidence=0.2,
    )
    at(timedelta(days=9))
    await record(
        "base1", "Deployed auth service v2.1 to production behind a rollback window", stakes="high"
    )
    at(timedelta(days=9) - timedelta(minutes=1))
    await rpc.ok(
        "cstp.reviewDecision",
        {
            "id": world.decisions["base1"],
            "outcome": "success",
            "lessons": "Keep a 30-minute rollback window",
        },
    )
    at(timedelta(days=9) - timedelta(minutes=2))
    await record(
        "base2", "Rolled back the authentication service after a memory leak", token="token-bob"
    )
    at(timedelta(days=3))
    await announce(
        "blocked-1",
        intent="Deploy the new authentication service to production",
        category="architecture",
        stakes="high",
        confidence=0.3,
    )
    at(timedelta(days=3) - timedelta(minutes=5))
    await record(
        "linked",
        "Deploy the new authentication service behind a feature flag",
        correlationId="blocked-1",
    )
    at(timedelta(days=2))
    await announce(
        "allowed-1",
        intent="Add a read replica for reporting queries",
        category="architecture",
        stakes="low",
    )
    at(timedelta(days=2) - timedelta(minutes=30))
    await rpc.ok(
        "cstp.reviewDecision",
        {
            "id": world.decisions["base2"],
            "outcome": "partial",
            "lessons": "Size the connection pool for peak load",
            "notes": "Issue was in connection pooling",
        },
        token="token-bob",
    )
    at(timedelta(days=1))
    await announce(
        "blocked-2",
        intent="Switch the production load balancer to the new cluster",
        category="integration",
        metadata={"affects_production": True},
    )
    at(timedelta(days=1) - timedelta(minutes=1))
    await announce(
        "bob-blocked",
        token="token-bob",
        intent="Drop the legacy sessions table in production",
        category="architecture",
        stakes="critical",
        confidence=0.1,
    )
    at(timedelta(hours=12))
    await record(
        "quick",
        "Bump the ruff version used in CI",
        category="tooling",
        preDecision={"queryRun": True},
    )
    at(timedelta(hours=1))
    error = await rpc.error(
        "cstp.announceIntent", {"intent": "Add a cache", "category": "nonsense"}
    )
    assert error["code"] == -32602
    error = await rpc.error("cstp.announceIntent", {"category": "architecture"}, token="token-bob")
    assert error["code"] == -32602
    at(timedelta(minutes=30))
    for n in (1, 2):  # alice's sixth and seventh announcements of the hour: over her budget
        error = await rpc.error("cstp.announceIntent", {"intent": f"Add cache {n}"})
        assert error["code"] == -32002
    return world


async def test_the_cookbook_answers_exactly(
    world_rpc: tuple[Rpc, Clock], database_url: str
) -> None:
    rpc, clock = world_rpc
    world = await build_world(rpc, clock)
    queries = load_cookbook()
    ids = world.decisions
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:

            async def q(name: str, **params: Any) -> list[tuple[Any, ...]]:
                return await run(conn, queries[name], **params)

            async def evaluation_of(cid: str) -> str:
                found = await run(
                    conn,
                    "SELECT id FROM guardrail_evaluations WHERE "
                    "source = 'announceIntent' AND description = :d",
                    d=world.intents[cid],
                )
                assert len(found) == 1
                return str(found[0][0])

            # --- every intent of an agent last week that was blocked
            assert await q(Q_BLOCKED, agent="alice", since=WEEK_AGO, until=NOW) == [
                (
                    NOW - timedelta(days=3),
                    "blocked-1",
                    world.intents["blocked-1"],
                    "architecture",
                    "high",
                    0.3,
                    await evaluation_of("blocked-1"),
                ),
                (
                    NOW - timedelta(days=1),
                    "blocked-2",
                    world.intents["blocked-2"],
                    "integration",
                    "medium",
                    None,
                    await evaluation_of("blocked-2"),
                ),
            ]
            longer = await q(Q_BLOCKED, agent="alice", since=MONTH_AGO, until=NOW)
            assert [r[1] for r in longer] == ["old-blocked", "blocked-1", "blocked-2"]
            bob = await q(Q_BLOCKED, agent="bob", since=WEEK_AGO, until=NOW)
            assert [r[1] for r in bob] == ["bob-blocked"]

            # --- which guardrails fired for an announcement
            status = world.announced["blocked-1"]["guardrailStatus"]
            assert await q(Q_FIRED, agent="alice", correlation_id="blocked-1") == [
                ("block", "no-high-stakes-low-confidence", status["violations"][0]["message"]),
                ("warn", "prefer-staged-rollout", status["warnings"][0]["message"]),
            ]
            assert [r[1] for r in await q(Q_FIRED, agent="alice", correlation_id="blocked-2")] == [
                "production-needs-code-review"
            ]
            assert await q(Q_FIRED, agent="bob", correlation_id="blocked-1") == []

            # --- what an agent was shown before a decision
            shown = world.announced["blocked-1"]["similarDecisions"]
            assert [s["id"] for s in shown] == [ids["base1"], ids["base2"]]
            now_outcome = {ids["base1"]: "success", ids["base2"]: "partial"}
            assert await q(Q_SHOWN, agent="alice", decision_id=ids["linked"]) == [
                (
                    rank,
                    s["id"],
                    s["title"],
                    s["distance"],
                    s.get("outcome"),
                    now_outcome[s["id"]],
                    "blocked-1",
                    NOW - timedelta(days=3),
                    False,
                )
                for rank, s in enumerate(shown, start=1)
            ]
            assert shown[1].get("outcome") is None  # base2 was reviewed after it was shown
            assert await q(Q_SHOWN, agent="bob", decision_id=ids["linked"]) == []
            assert await q(Q_SHOWN, agent="alice", decision_id=ids["quick"]) == []

            # --- the decisions that followed one announcement, by the client's own id
            followed = await q(Q_BY_CORRELATION, agent="alice", correlation_id="blocked-1")
            assert [(r[0], r[1], r[4]) for r in followed] == [
                ("blocked-1", world.intents["blocked-1"], ids["linked"])
            ]
            assert await q(Q_BY_CORRELATION, agent="bob", correlation_id="blocked-1") == []
            assert await q(Q_BY_CORRELATION, agent="alice", correlation_id="allowed-1") == []

            # --- intents never followed by a decision
            assert await q(Q_NO_DECISION, since=WEEK_AGO, until=NOW) == [
                ("alice", NOW - timedelta(days=2), "allowed-1", world.intents["allowed-1"], True),
                ("alice", NOW - timedelta(days=1), "blocked-2", world.intents["blocked-2"], False),
                (
                    "bob",
                    NOW - timedelta(days=1) + timedelta(minutes=1),
                    "bob-blocked",
                    world.intents["bob-blocked"],
                    False,
                ),
            ]
            assert [r[2] for r in await q(Q_NO_DECISION, since=MONTH_AGO, until=NOW)] == [
                "old-blocked",
                "allowed-1",
                "blocked-2",
                "bob-blocked",
            ]

            # --- rate-limited or failed announcements by agent
            assert await q(Q_FAILED, since=WEEK_AGO, until=NOW) == [
                ("alice", "failed", -32602, 1),
                ("alice", "rate_limited", -32002, 2),
                ("bob", "failed", -32602, 1),
            ]
            assert await q(Q_FAILED, since=WEEK_AGO, until=NOW - timedelta(minutes=45)) == [
                ("alice", "failed", -32602, 1),
                ("bob", "failed", -32602, 1),
            ]

            # --- decisions recorded without a prior announcement
            assert await q(Q_UNANNOUNCED, since=MONTH_AGO, until=NOW) == [
                ("alice", NOW - timedelta(days=9), ids["base1"], world.titles["base1"], None),
                ("alice", NOW - timedelta(hours=12), ids["quick"], world.titles["quick"], True),
                (
                    "bob",
                    NOW - timedelta(days=9) + timedelta(minutes=2),
                    ids["base2"],
                    world.titles["base2"],
                    None,
                ),
            ]
            assert [r[2] for r in await q(Q_UNANNOUNCED, since=WEEK_AGO, until=NOW)] == [
                ids["quick"]
            ]

            # --- decisions taken after a blocked announcement
            assert await q(Q_DESPITE_BLOCK, since=WEEK_AGO, until=NOW) == [
                (
                    "alice",
                    NOW - timedelta(days=3) + timedelta(minutes=5),
                    ids["linked"],
                    world.titles["linked"],
                    "blocked-1",
                    world.intents["blocked-1"],
                ),
            ]

            # --- review history of a decision
            assert await q(Q_REVIEWS, decision_id=ids["base2"]) == [
                (
                    NOW - timedelta(days=2) + timedelta(minutes=30),
                    "bob",
                    "partial",
                    None,
                    "Size the connection pool for peak load",
                    "Issue was in connection pooling",
                ),
            ]
            assert await q(Q_REVIEWS, decision_id="00000000") == []

            # --- outbox work not yet done: everything was delivered right after commit (and
            # the bookkeeping, recorded off the answers' path, has caught up)
            await rpc.client.app.state.services.relay.flush()
            assert await q(Q_OUTBOX) == []
    finally:
        await engine.dispose()


def check_is_portable(sql: str) -> list[str]:
    """Dialect features the cookbook promises not to use."""
    banned: dict[str, Callable[[str], bool]] = {
        "date function": lambda s: bool(
            re.search(
                r"\b(now|date|datetime|strftime|julianday|date_trunc|interval|current_date|"
                r"current_timestamp|extract)\b\s*[(']?",
                s,
                flags=re.I,
            )
        ),
        "JSON operator": lambda s: "->" in s or "json_" in s.lower(),
        "cast syntax": lambda s: "::" in s,
        "literal timestamp": lambda s: bool(re.search(r"'\d{4}-\d{2}-\d{2}", s)),
    }
    return [name for name, hit in banned.items() if hit(sql)]


def test_the_cookbook_uses_no_dialect_specific_sql() -> None:
    for heading, sql in load_cookbook().items():
        assert check_is_portable(sql) == [], heading
