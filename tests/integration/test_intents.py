"""cstp.announceIntent (seed F004, issue 6) through the real RPC, the real embedder and a real
Chroma index, with the audit rows it leaves in SQL (SQLite or Postgres, by the fixtures)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from app.asgi import create_app
from app.audit.canonical import covered
from app.cli import main
from app.config import Settings
from app.db.decisions import Decision
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleResult
from app.db.intents import Intent, IntentMatch
from app.guardrails.service import Request, evaluate_request
from app.intents.writer import Announcement
from app.operations.context import CallContext
from app.scopes import Principal
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.databases import run_sql

ANNOUNCE = "cstp.announceIntent"

# The seed's example request, exactly (F004 "Request").
SEED_PARAMS: dict[str, Any] = {
    "intent": "Deploy authentication service to production",
    "context": "PR #42 approved, all tests passing, CI green",
    "category": "architecture",
    "stakes": "high",
    "confidence": 0.85,
    "agent": {"id": "emerson", "url": "https://emerson.example.com"},
    "correlationId": "550e8400-e29b-41d4-a716-446655440000",
    "metadata": {"pr_number": 42, "branch": "feat/auth-v2", "commit": "abc123"},
}
SEED_RESULT_KEYS = {
    "received",
    "correlationId",
    "receivedAt",
    "similarDecisions",
    "guardrailStatus",
    "suggestions",
    "respondingAgent",
}

DEPLOYED = "Deployed auth service v2.1 to production behind a 30-minute rollback window"
ROLLED_BACK = "Rolled back the authentication service after a memory leak in production"
UNRELATED = "Use PostgreSQL for agent memory storage"
OTHER_CATEGORY = "Deploy the authentication service runbook to the team wiki"


def decision(text_: str, category: str = "architecture", **extra: Any) -> dict[str, Any]:
    return {"decision": text_, "confidence": 0.8, "category": category, **extra}


async def record(rpc: Rpc, params: dict[str, Any], token: str | None = None) -> str:
    result = await rpc.ok("cstp.recordDecision", params, token)
    assert result["indexed"] is True, result
    return str(result["id"])


async def review(rpc: Rpc, decision_id: str, outcome: str, **fields: Any) -> None:
    result = await rpc.ok("cstp.reviewDecision", {"id": decision_id, "outcome": outcome, **fields})
    assert result["reindexed"] is True, result


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    """The test's own engine on the test database: what an auditor's SQL client sees."""
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="module")
async def shared_db(shared_settings: Settings) -> AsyncIterator[AsyncEngine]:
    """``db`` on the module's shared database (``shared_rpc``'s): its tests read only the rows
    of their own correlation ids."""
    engine = create_async_engine(shared_settings.database_url)
    yield engine
    await engine.dispose()


async def rows(db: AsyncEngine, model: Any, *where: Any, order_by: Any = None) -> list[Any]:
    async with AsyncSession(db) as session:
        query = select(model).where(*where)
        if order_by is not None:
            query = query.order_by(order_by)
        return list(await session.scalars(query))


def parse_ts(value: str) -> datetime:
    assert value.endswith("Z") or value.endswith("+00:00"), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@asynccontextmanager
async def app_rpc(settings: Settings, embedder: Embedder) -> AsyncIterator[Rpc]:
    async with serve_app(create_app(settings, embedder=embedder)) as client:
        yield Rpc(client)


# ---------------------------------------------------------------- the seed example


async def test_seed_example_returns_every_field_and_leaves_audit_rows(
    rpc: Rpc, services: Any, db: AsyncEngine
) -> None:
    deployed = await record(rpc, decision(DEPLOYED, stakes="high"))
    await review(rpc, deployed, "success", lessons="Required 30-min rollback window")
    rolled_back = await record(rpc, decision(ROLLED_BACK, stakes="high"))
    await review(rpc, rolled_back, "partial", notes="Issue was in connection pooling")
    unrelated = await record(rpc, decision(UNRELATED))
    other = await record(rpc, decision(OTHER_CATEGORY, category="process"))

    before = datetime.now(UTC)
    # answered within 5 s (a TimeoutError otherwise): the seed's budget is 1 s, a generous
    # bound here, measured in bench/
    result = await asyncio.wait_for(rpc.ok(ANNOUNCE, SEED_PARAMS), timeout=5)

    assert set(result) >= SEED_RESULT_KEYS
    assert result["received"] is True
    assert result["correlationId"] == SEED_PARAMS["correlationId"]
    received_at = parse_ts(result["receivedAt"])
    assert before - timedelta(seconds=1) <= received_at <= datetime.now(UTC)
    assert result["respondingAgent"] == "cognition-engines"

    # similar decisions: real ones, from the intent's category only, nearest first
    similar = result["similarDecisions"]
    by_id = {d["id"]: d for d in similar}
    assert set(by_id) == {deployed, rolled_back, unrelated}
    assert other not in by_id
    distances = [d["distance"] for d in similar]
    assert distances == sorted(distances)
    assert all(0.0 <= d < 2.0 for d in distances)
    assert [d["id"] for d in similar][-1] == unrelated  # the unrelated one is the farthest
    for item in similar:
        assert {"id", "title", "date", "distance"} <= set(item)
        parse_ts(item["date"])
    assert by_id[deployed]["title"] == DEPLOYED
    assert by_id[deployed]["outcome"] == "success"
    assert by_id[deployed]["notes"] == "Required 30-min rollback window"
    assert by_id[rolled_back]["outcome"] == "partial"
    assert by_id[rolled_back]["notes"] == "Issue was in connection pooling"
    assert "outcome" not in by_id[unrelated] and "notes" not in by_id[unrelated]

    # guardrails: allowed, with the staged-rollout warning (high stakes, no staged rollout)
    status = result["guardrailStatus"]
    assert {"allowed", "violations", "warnings", "evaluated"} <= set(status)
    assert status["allowed"] is True
    assert status["violations"] == []
    assert [w["guardrailId"] for w in status["warnings"]] == ["prefer-staged-rollout"]
    assert status["warnings"][0]["message"]
    assert status["evaluated"] == len(services.rules.applicable(None)) >= 1

    # suggestions: from the reviewed neighbours' outcomes and the warning's suggestion
    suggestions = result["suggestions"]
    assert 1 <= len(suggestions) <= 5
    assert f"Similar action succeeded: {DEPLOYED}" in suggestions
    assert f"Similar action had issues: {ROLLED_BACK}" in suggestions  # the seed's text, as is
    staged = status["warnings"][0].get("suggestion")
    assert staged and staged in suggestions

    # the audit rows
    [intent] = await rows(db, Intent, Intent.correlation_id == SEED_PARAMS["correlationId"])
    assert intent.agent == "alice"
    assert intent.outcome == "ok" and intent.error_code is None
    assert intent.intent == SEED_PARAMS["intent"] and intent.context == SEED_PARAMS["context"]
    assert (intent.category, intent.stakes, intent.confidence) == ("architecture", "high", 0.85)
    assert intent.metadata_ == SEED_PARAMS["metadata"]
    assert intent.claimed_agent == SEED_PARAMS["agent"]
    assert intent.allowed is True
    assert intent.similar_found == len(similar)
    assert intent.received_at == received_at
    assert intent.response is not None and json.loads(intent.response) == result

    matches = await rows(
        db, IntentMatch, IntentMatch.intent_id == intent.id, order_by=IntentMatch.rank
    )
    assert [m.rank for m in matches] == list(range(1, len(similar) + 1))
    assert [m.decision_id for m in matches] == [d["id"] for d in similar]
    assert [round(m.distance, 6) for m in matches] == [d["distance"] for d in similar]
    assert [m.outcome for m in matches] == [d.get("outcome") for d in similar]

    assert intent.evaluation_id is not None
    [evaluation] = await rows(
        db, GuardrailEvaluation, GuardrailEvaluation.id == intent.evaluation_id
    )
    assert evaluation.source == "announceIntent" and evaluation.agent == "alice"
    assert evaluation.description == SEED_PARAMS["intent"]
    assert (evaluation.category, evaluation.stakes, evaluation.confidence) == (
        "architecture",
        "high",
        0.85,
    )
    assert evaluation.allowed is True
    assert (evaluation.evaluated, evaluation.violations, evaluation.warnings) == (
        status["evaluated"],
        0,
        1,
    )
    assert evaluation.facts["pr_number"] == 42 and evaluation.facts["branch"] == "feat/auth-v2"
    assert evaluation.rule_set_version
    results = await rows(
        db, GuardrailRuleResult, GuardrailRuleResult.evaluation_id == evaluation.id
    )
    assert len(results) == status["evaluated"]
    assert {r.guardrail_id for r in results if r.fired} == {"prefer-staged-rollout"}


async def test_a_failed_similar_decision_is_shown_with_its_lessons_and_warned_about(
    rpc: Rpc,
) -> None:
    lessons = "Run schema migrations in a maintenance window: the table lock blocked logins"
    failed = await record(
        rpc, decision("Migrate the user sessions table to the new schema during business hours")
    )
    await review(
        rpc, failed, "failure", lessons=lessons, actualResult="Logins were blocked for 20 minutes"
    )
    await record(rpc, decision("Adopt weekly retrospective meetings for the team"))

    result = await rpc.ok(
        ANNOUNCE,
        {
            "intent": "Migrate the sessions table schema in the middle of the working day",
            "category": "architecture",
        },
    )
    similar = result["similarDecisions"]
    assert similar[0]["id"] == failed
    assert similar[0]["outcome"] == "failure"
    assert similar[0]["notes"] == lessons  # lessons win over the actual result
    warnings = [s for s in result["suggestions"] if "Similar action failed" in s]
    assert warnings == [f"Warning: Similar action failed: {similar[0]['title']}"]
    assert len(result["suggestions"]) <= 5


async def test_suggestions_are_capped_at_five(rpc: Rpc) -> None:
    texts = [
        "Rotate the API signing keys of the payment gateway",
        "Rotate the database credentials of the payment service",
        "Rotate TLS certificates of the payment API",
        "Rotate the OAuth client secrets of the payment integration",
    ]
    for n, text_ in enumerate(texts):
        decision_id = await record(rpc, decision(text_, category="security"))
        await review(
            rpc, decision_id, ("success", "failure", "partial", "success")[n], lessons=f"lesson {n}"
        )
    # critical stakes at 0.6 and category security: three warnings that carry a suggestion
    result = await rpc.ok(
        ANNOUNCE,
        {
            "intent": "Rotate all secrets of the payment platform at once",
            "category": "security",
            "stakes": "critical",
            "confidence": 0.6,
        },
    )
    status = result["guardrailStatus"]
    assert status["allowed"] is True
    assert len(status["warnings"]) == 3
    assert len(result["similarDecisions"]) == 4
    assert len(result["suggestions"]) == 5
    assert len(set(result["suggestions"])) == 5


async def test_similar_decisions_are_the_query_decisions_search(rpc: Rpc) -> None:
    """Same search as cstp.queryDecisions: intent + context, the category, at most five."""
    texts = [
        "Deploy the billing service to production with a canary",
        "Deploy the search service to production on Fridays",
        "Deploy the auth service with blue-green switching",
        "Roll out the payments service region by region",
        "Deploy the notification service straight to production",
        "Release the mobile API gateway to production at night",
        "Ship the admin dashboard to production behind a flag",
    ]
    ids = [await record(rpc, decision(t)) for t in texts]
    await record(rpc, decision("Deploy the docs service to production", category="process"))
    # notes: lessons, else review notes, else actual result
    await review(rpc, ids[0], "success", actualResult="went fine")
    await review(rpc, ids[1], "partial", actualResult="slow", notes="cache was cold")
    await review(rpc, ids[2], "failure", actualResult="down", notes="n", lessons="test the switch")
    params = {
        "intent": "Deploy a service to production",
        "context": "with a rollback plan",
        "category": "architecture",
    }
    announced = await rpc.ok(ANNOUNCE, params)
    queried = await rpc.ok(
        "cstp.queryDecisions",
        {
            "query": "Deploy a service to production with a rollback plan",
            "filters": {"category": "architecture"},
            "limit": 5,
        },
    )
    similar = announced["similarDecisions"]
    assert len(similar) == 5
    assert [(d["id"], d["distance"]) for d in similar] == [
        (d["id"], d["distance"]) for d in queried["decisions"]
    ]
    notes = {d["id"]: d.get("notes") for d in similar}
    expected = {ids[0]: "went fine", ids[1]: "cache was cold", ids[2]: "test the switch"}
    for decision_id, note in expected.items():
        if decision_id in notes:
            assert notes[decision_id] == note


async def test_guardrails_see_metadata_but_metadata_cannot_override_core_fields(
    shared_rpc: Rpc,
) -> None:
    base = {"intent": "Switch the production load balancer", "category": "integration"}
    blocked = await shared_rpc.ok(ANNOUNCE, {**base, "metadata": {"affects_production": True}})
    assert blocked["guardrailStatus"]["allowed"] is False
    assert [v["guardrailId"] for v in blocked["guardrailStatus"]["violations"]] == [
        "production-needs-code-review"
    ]
    # the blocking rule's advice is in its violation; suggestions take the warnings' (SPEC.md)
    advice = blocked["guardrailStatus"]["violations"][0]["suggestion"]
    assert advice and advice not in blocked["suggestions"]
    allowed = await shared_rpc.ok(
        ANNOUNCE, {**base, "metadata": {"affects_production": True, "code_review": True}}
    )
    assert allowed["guardrailStatus"]["allowed"] is True
    # stakes/confidence from the params win over metadata keys of the same name
    core = await shared_rpc.ok(
        ANNOUNCE,
        {
            **base,
            "stakes": "high",
            "confidence": 0.3,
            "metadata": {"stakes": "low", "confidence": 0.99},
        },
    )
    assert core["guardrailStatus"]["allowed"] is False
    assert "no-high-stakes-low-confidence" in [
        v["guardrailId"] for v in core["guardrailStatus"]["violations"]
    ]


async def test_missing_or_blank_intent_is_32602_naming_intent(shared_rpc: Rpc) -> None:
    for params in ({}, {"intent": "   "}, {"intent": None}, {"intent": 5}):
        error = await shared_rpc.error(ANNOUNCE, params)
        assert error["code"] == -32602 and error["data"]["field"] == "intent", params


# ---------------------------------------------------------------- correlationId


async def test_correlation_id_is_generated_when_absent(rpc: Rpc, db: AsyncEngine) -> None:
    first = await rpc.ok(ANNOUNCE, {"intent": "Add a cache in front of the search API"})
    second = await rpc.ok(
        ANNOUNCE, {"intent": "Add a cache in front of the search API", "correlationId": None}
    )
    for result in (first, second):
        assert str(uuid.UUID(result["correlationId"])) == result["correlationId"]
    assert first["correlationId"] != second["correlationId"]
    stored = await rows(db, Intent, Intent.agent == "alice")
    assert sorted(i.correlation_id for i in stored) == sorted(
        [first["correlationId"], second["correlationId"]]
    )


async def test_invalid_correlation_id_is_32602_naming_the_field(shared_rpc: Rpc) -> None:
    for bad in ("has space", "x" * 129, "", "semi;colon", "ünïcode", 42, "c-1\n"):
        error = await shared_rpc.error(ANNOUNCE, {"intent": "Add a cache", "correlationId": bad})
        assert error["code"] == -32602, bad
        assert error["data"]["field"] == "correlationId", bad


async def test_longest_and_all_allowed_characters_are_accepted(shared_rpc: Rpc) -> None:
    for cid in ("a" * 128, "Az09._:-", "x"):
        result = await shared_rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": cid})
        assert result["correlationId"] == cid


async def test_safe_retry_returns_the_identical_response_and_one_row(
    rpc: Rpc, db: AsyncEngine
) -> None:
    await record(rpc, decision(DEPLOYED))
    params = dict(SEED_PARAMS, correlationId="retry-1")
    body = {"jsonrpc": "2.0", "method": ANNOUNCE, "id": "r", "params": params}
    first = await rpc.raw(body)
    await record(rpc, decision(ROLLED_BACK))  # the world changes between the two calls
    second = await rpc.raw(body)
    assert first.status_code == second.status_code == 200
    assert "result" in first.json()
    assert second.content == first.content  # byte for byte, receivedAt included
    # a retry may drop optional nulls / reorder keys and is still the same intent
    reordered = dict(reversed(list(params.items())), agent=None)
    third = await rpc.raw({"jsonrpc": "2.0", "method": ANNOUNCE, "id": "r", "params": reordered})
    assert third.content == first.content

    stored = await rows(db, Intent, Intent.correlation_id == "retry-1")
    assert [(i.agent, i.outcome) for i in stored] == [("alice", "ok")]
    evaluations = await rows(
        db, GuardrailEvaluation, GuardrailEvaluation.source == "announceIntent"
    )
    assert len(evaluations) == 1  # a retry is answered from the stored response


async def test_concurrent_retries_get_one_answer_and_one_row(
    shared_rpc: Rpc, shared_db: AsyncEngine
) -> None:
    await record(shared_rpc, decision(DEPLOYED))
    body = {
        "jsonrpc": "2.0",
        "method": ANNOUNCE,
        "id": 1,
        "params": dict(SEED_PARAMS, correlationId="race-1"),
    }
    answers = await asyncio.gather(*(shared_rpc.raw(body) for _ in range(6)))  # really overlapping
    assert all("result" in a.json() for a in answers), [a.content for a in answers]
    assert len({a.content for a in answers}) == 1
    stored = await rows(shared_db, Intent, Intent.correlation_id == "race-1")
    assert [i.outcome for i in stored] == ["ok"]


async def test_an_announcement_with_a_correlation_id_holds_no_writer_up_while_it_searches(
    rpc: Rpc, services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looking up a correlationId for a safe retry is a read: while the announcement then
    searches (the embedding, the index), a decision recorded meanwhile is committed and
    answered. (On SQLite the lookup once ran on the call's write session and took the
    database's write lock for the rest of the call, search included.)"""
    searching, release = asyncio.Event(), asyncio.Event()
    query_text = services.index.query_text

    async def slow_search(*args: Any, **kwargs: Any) -> Any:
        searching.set()
        await release.wait()
        return await query_text(*args, **kwargs)

    monkeypatch.setattr(services.index, "query_text", slow_search)
    announcing = asyncio.ensure_future(
        rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": "slow-1"})
    )
    try:
        await asyncio.wait_for(searching.wait(), timeout=10)
        recorded = await asyncio.wait_for(
            rpc.ok("cstp.recordDecision", decision("Use Redis for the cache")), timeout=10
        )
        assert recorded["success"] is True
    finally:
        release.set()
    assert (await asyncio.wait_for(announcing, timeout=10))["correlationId"] == "slow-1"


async def test_same_correlation_id_for_a_different_intent_is_a_conflict(
    shared_rpc: Rpc, shared_db: AsyncEngine
) -> None:
    params = {"intent": "Add a cache in front of the search API", "correlationId": "c-1"}
    original = await shared_rpc.ok(ANNOUNCE, params)
    for changed in (
        {"intent": "Drop the search API cache"},
        {"context": "after the outage"},
        {"stakes": "high"},
        {"metadata": {"ticket": 7}},
    ):
        error = await shared_rpc.error(ANNOUNCE, {**params, **changed})
        assert error["code"] == -32008, changed
    assert await shared_rpc.ok(ANNOUNCE, params) == original
    stored = await rows(shared_db, Intent, Intent.correlation_id == "c-1")
    assert sorted((i.outcome, i.error_code) for i in stored) == [("failed", -32008)] * 4 + [
        ("ok", None)
    ]


async def test_another_agent_may_use_the_same_correlation_id(
    shared_rpc: Rpc, shared_db: AsyncEngine
) -> None:
    alice = await shared_rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": "shared-1"})
    bob = await shared_rpc.ok(
        ANNOUNCE, {"intent": "Remove the cache", "correlationId": "shared-1"}, token="token-bob"
    )
    assert bob["correlationId"] == alice["correlationId"] == "shared-1"
    again = await shared_rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": "shared-1"})
    assert again == alice
    stored = await rows(
        shared_db, Intent, Intent.correlation_id == "shared-1", order_by=Intent.agent
    )
    assert [(i.agent, i.intent, i.outcome) for i in stored] == [
        ("alice", "Add a cache", "ok"),
        ("bob", "Remove the cache", "ok"),
    ]


async def test_a_decision_carries_the_correlation_id_its_client_chose(
    rpc: Rpc, settings: Settings, database_url: str
) -> None:
    cid = "deploy-auth-42"
    await rpc.ok(ANNOUNCE, {"intent": "Deploy the auth service", "correlationId": cid})
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Deploy the auth service on Tuesday",
            "confidence": 0.8,
            "category": "architecture",
            "correlationId": cid,
        },
    )
    other = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Keep the old auth service running for a week",
            "confidence": 0.7,
            "category": "architecture",
        },
    )

    got = (await rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert got["correlationId"] == cid
    assert (await rpc.ok("cstp.getDecision", {"id": other["id"]}))["decision"][
        "correlationId"
    ] is None

    exported = yaml.safe_load(
        (settings.decisions_dir / recorded["path"].removeprefix("decisions/")).read_text()
    )
    assert exported["correlation_id"] == cid

    listed = await rpc.ok("cstp.listDecisions", {"correlationId": cid})
    assert [(d["id"], d["correlationId"]) for d in listed["decisions"]] == [(recorded["id"], cid)]
    assert listed["total"] == 1
    everything = await rpc.ok("cstp.listDecisions", {})
    assert {d["id"] for d in everything["decisions"]} == {recorded["id"], other["id"]}
    assert (await rpc.error("cstp.listDecisions", {"correlationId": "bad id"}))["data"][
        "field"
    ] == "correlationId"

    # An auditor joins decisions to the intents they followed on the client's own id.
    joined = await run_sql(
        database_url,
        """
        SELECT d.id AS decision_id, i.intent FROM decisions d
        JOIN intents i ON i.agent = d.recorded_by AND i.correlation_id = d.correlation_id
        WHERE i.outcome = 'ok'""",
    )
    assert joined == [{"decision_id": recorded["id"], "intent": "Deploy the auth service"}]


# ---------------------------------------------------------------- failures are audited too


async def test_a_refused_announcement_with_too_deep_metadata_is_still_audited(
    shared_rpc: Rpc, shared_db: AsyncEngine
) -> None:
    deep: Any = "leaf"
    for _ in range(900):
        deep = {"k": deep}
    error = await shared_rpc.error(
        ANNOUNCE, {"intent": "Nested facts\x00", "correlationId": "deep-1", "metadata": deep}
    )
    assert error["code"] == -32602
    stored = await rows(shared_db, Intent, Intent.correlation_id == "deep-1")
    assert [(i.outcome, i.error_code, i.intent, i.metadata_) for i in stored] == [
        ("failed", -32602, "Nested facts\ufffd", None)
    ]


async def test_index_down_is_answered_from_keyword_search_and_the_intent_row_says_so(
    settings: Settings, embedder: Embedder, free_port: int, db: AsyncEngine
) -> None:
    """Issue 36 (tests/integration/test_index_outage_verdict.py has the rest): the verdict
    needs no vectors, so the call is answered, degraded, where it used to be -32003."""
    down = replace(settings, chroma_url=f"http://127.0.0.1:{free_port}")  # nothing listens
    async with app_rpc(down, embedder) as rpc:
        # the answer comes at once, not after a wait for the index (TimeoutError after 10 s)
        result = await asyncio.wait_for(
            rpc.ok(ANNOUNCE, dict(SEED_PARAMS, correlationId="down-1")), timeout=10
        )
        assert (result["degraded"], result["retrievalMode"]) == (True, "keyword")
        assert result["guardrailStatus"]["evaluated"] > 0
        assert "127.0.0.1" not in json.dumps(result)
        stored = await rows(db, Intent, Intent.correlation_id == "down-1")
        assert len(stored) == 1
        row = stored[0]
        assert (row.agent, row.outcome, row.error_code) == ("alice", "ok", None)
        assert row.search_degraded is True
        assert row.intent == SEED_PARAMS["intent"]
        assert row.context == SEED_PARAMS["context"]
        assert (row.category, row.stakes, row.confidence) == ("architecture", "high", 0.85)
        assert row.allowed == result["guardrailStatus"]["allowed"]
        assert await rows(db, IntentMatch, IntentMatch.intent_id == row.id) == []


# ---------------------------------------------------------------- recordDecision links


async def test_record_decision_links_the_intent_and_takes_pre_decision_from_it(
    rpc: Rpc, db: AsyncEngine
) -> None:
    await record(rpc, decision(DEPLOYED))
    await record(rpc, decision(ROLLED_BACK))
    # high stakes at 0.3 confidence: a block rule fires, so the announcement is not allowed
    announced = await rpc.ok(
        ANNOUNCE,
        {
            "intent": "Deploy the new authentication service to production",
            "category": "architecture",
            "stakes": "high",
            "confidence": 0.3,
            "correlationId": "link-1",
        },
    )
    assert announced["guardrailStatus"]["allowed"] is False
    shown = len(announced["similarDecisions"])
    assert shown == 2

    claimed = {
        "queryRun": False,
        "similarFound": 99,
        "guardrailsChecked": False,
        "guardrailsPassed": True,
    }
    recorded = await rpc.ok(
        "cstp.recordDecision",
        decision(
            "Deploy the new authentication service behind a feature flag",
            stakes="high",
            correlationId="link-1",
            preDecision=claimed,
        ),
    )
    got = (await rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert got["preDecision"] == {
        "queryRun": True,
        "similarFound": shown,
        "guardrailsChecked": True,
        "guardrailsPassed": False,
    }

    [intent] = await rows(db, Intent, Intent.correlation_id == "link-1")
    [row] = await rows(db, Decision, Decision.id == recorded["id"])
    assert row.intent_id == intent.id
    assert got["intentId"] == intent.id
    assert row.pre_similar_found == shown and row.pre_guardrails_passed is False

    # an allowed announcement gives guardrailsPassed true
    await rpc.ok(
        ANNOUNCE,
        {"intent": "Add a read replica", "category": "architecture", "correlationId": "link-2"},
    )
    second = await rpc.ok(
        "cstp.recordDecision", decision("Add a read replica for reporting", correlationId="link-2")
    )
    got = (await rpc.ok("cstp.getDecision", {"id": second["id"]}))["decision"]
    assert got["preDecision"]["guardrailsPassed"] is True
    assert got["preDecision"]["queryRun"] is True


async def test_record_decision_with_unknown_or_foreign_correlation_id_is_32602(
    rpc: Rpc, db: AsyncEngine
) -> None:
    await rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": "alice-only"})
    for token, cid in (("token-alice", "never-announced"), ("token-bob", "alice-only")):
        error = await rpc.error(
            "cstp.recordDecision", decision("Add a cache", correlationId=cid), token=token
        )
        assert error["code"] == -32602
        assert error["data"]["field"] == "correlationId"
    error = await rpc.error(
        "cstp.recordDecision", decision("Add a cache", correlationId="has space")
    )
    assert error["code"] == -32602 and error["data"]["field"] == "correlationId"
    assert (await rpc.ok("cstp.listDecisions"))["total"] == 0


# ---------------------------------------------------------------- append-only


APPEND_ONLY_VIOLATIONS = (
    "UPDATE intents SET outcome = 'failed'",
    "UPDATE intents SET response = NULL",
    "DELETE FROM intents",
    "UPDATE intent_matches SET distance = 0",
    "DELETE FROM intent_matches",
)


async def test_intents_and_matches_refuse_update_and_delete(rpc: Rpc, db: AsyncEngine) -> None:
    await record(rpc, decision(DEPLOYED))
    await rpc.ok(ANNOUNCE, dict(SEED_PARAMS, correlationId="audit-1"))
    for statement in APPEND_ONLY_VIOLATIONS:
        with pytest.raises(DBAPIError) as info:
            async with db.begin() as conn:
                await conn.execute(text(statement))
        assert "append-only" in str(info.value), statement
    async with db.connect() as conn:
        counts = (
            await conn.execute(
                text(
                    "SELECT (SELECT COUNT(*) FROM intents WHERE outcome = 'ok' "
                    "AND response IS NOT NULL), "
                    "(SELECT COUNT(*) FROM intent_matches WHERE distance > 0)"
                )
            )
        ).one()
    assert tuple(counts) == (1, 1)


# ---------------------------------------------------------------- group commit (SQLite)


async def test_concurrent_announcements_each_keep_their_own_audit_rows(
    rpc: Rpc, db: AsyncEngine, database_url: str
) -> None:
    """Announcements in flight together (on SQLite written in one transaction) each leave
    their own intent row, matches and evaluation, answered with their own ids, and the audit
    chain covers every row."""
    await record(rpc, decision(DEPLOYED))
    n = 8
    answers = await asyncio.gather(
        *(
            rpc.ok(ANNOUNCE, dict(SEED_PARAMS, intent=f"Deploy service {i}", correlationId=f"g{i}"))
            for i in range(n)
        )
    )
    stored = {i.correlation_id: i for i in await rows(db, Intent, Intent.outcome == "ok")}
    assert set(stored) == {f"g{i}" for i in range(n)}
    for i, answer in enumerate(answers):
        intent = stored[answer["correlationId"]]
        assert intent.intent == f"Deploy service {i}"
        assert intent.evaluation_id == answer["guardrailStatus"]["evaluationId"]
        assert json.loads(intent.response or "") == answer
        matches = await rows(db, IntentMatch, IntentMatch.intent_id == intent.id)
        assert len(matches) == len(answer["similarDecisions"]) == 1
    source = GuardrailEvaluation.source == "announceIntent"
    evaluations = await rows(db, GuardrailEvaluation, source)
    assert {e.id for e in evaluations} == {i.evaluation_id for i in stored.values()}
    verified = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["audit", "verify"],
        env={"CSTP_DATABASE_URL": database_url, "CSTP_AUDIT_KEY": None},
    )
    assert verified.exit_code == 0, verified.output


async def test_an_announcement_that_cannot_be_written_fails_alone_in_its_group(
    rpc: Rpc, services: Any, db: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """When one announcement of a group cannot be written, the others are written (each
    alone, after the group's transaction failed) and only that one fails."""
    await rpc.ok(ANNOUNCE, {"intent": "Add a cache", "correlationId": "first"})
    (taken,) = await rows(db, Intent, Intent.correlation_id == "first")
    ctx = CallContext(Principal("alice"), ANNOUNCE, services, open_session=None)

    def announcement(n: int, intent_id: str) -> Announcement:
        staged = evaluate_request(
            ctx, Request(f"Add cache {n}", None, None, None, None, {}), source="announceIntent"
        )
        row = {
            "id": intent_id,
            "correlation_id": f"alone-{n}",
            "agent": "alice",
            "received_at": datetime.now(UTC),
            "outcome": "ok",
            "intent": f"Add cache {n}",
            "context": None,
            "category": None,
            "stakes": None,
            "confidence": None,
            "metadata": None,
            "claimed_agent": None,
            "request_hash": None,
            "allowed": True,
            "evaluation_id": staged.checked.evaluation_id,
            "similar_found": 0,
            "response": "{}",
            "error_code": None,
        }
        entry = covered("intents", row, {"intent_matches": []})
        return Announcement(staged, row, [], entry, callers_correlation=False)

    group = [announcement(1, str(uuid.uuid4())), announcement(2, taken.id)]
    group.append(announcement(3, str(uuid.uuid4())))
    with caplog.at_level(logging.INFO, logger="cstp.batches"):
        outcomes = await asyncio.gather(
            *(services.announcer.write(a) for a in group), return_exceptions=True
        )
    assert outcomes[0] is True and outcomes[2] is True, outcomes
    assert isinstance(outcomes[1], IntegrityError), outcomes
    assert "a batch of 3 announcements failed" in caplog.text
    written = await rows(db, Intent, Intent.correlation_id.like("alone-%"))
    assert sorted(i.correlation_id for i in written) == ["alone-1", "alone-3"]
    ids = [a.row["evaluation_id"] for a in group]
    evaluations = await rows(db, GuardrailEvaluation, GuardrailEvaluation.id.in_(ids))
    assert {e.id for e in evaluations} == {ids[0], ids[2]}
