"""cstp.reviewDecision over the real RPC: the result, the review history (append-only rows),
the refreshed YAML file and the re-indexed search entry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.exc import DBAPIError

from app.asgi import create_app
from app.config import Settings
from app.runtime import Runtime, iso
from support.app import SEED_DECISION, Rpc, add_token, serve_app
from support.databases import run_sql

T0 = datetime(2026, 5, 4, 10, 30, 0, tzinfo=UTC)

PROJECT_FIELDS = {
    "project": "atlas",
    "feature": "memory-store",
    "pr": 314,
    "file": "app/store.py",
    "line": 42,
    "commit": "abc123d",
}


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@dataclass
class App:
    rpc: Rpc
    clock: Clock
    settings: Settings


@pytest.fixture
async def app(settings: Settings, embedder: Any) -> AsyncIterator[App]:
    clock = Clock(T0)
    litestar_app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    async with serve_app(litestar_app) as client:
        yield App(Rpc(client), clock, settings)


@pytest.fixture(scope="module")
async def shared_app(shared_settings: Settings, embedder: Any) -> AsyncIterator[App]:
    """One app for the module's tests that review only the decision they recorded themselves
    and never move the clock."""
    clock = Clock(T0)
    litestar_app = create_app(shared_settings, runtime=Runtime(now=clock), embedder=embedder)
    async with serve_app(litestar_app) as client:
        yield App(Rpc(client), clock, shared_settings)


async def sql(settings: Settings, statement: str, **params: Any) -> list[dict[str, Any]]:
    """Run one statement on the test database in its own connection (what an auditor does)."""
    return await run_sql(settings.database_url, statement, **params)


def bob_reviewer(a: App) -> str:
    """A token of role reviewer for bob: it reviews decisions other agents recorded."""
    return add_token(a.rpc.client, "token-bob-reviewer", "bob", "reviewer")


def full_decision() -> dict[str, Any]:
    return {**SEED_DECISION, **PROJECT_FIELDS}


def yaml_of(settings: Settings, path: str) -> dict[str, Any]:
    assert path.startswith("decisions/")
    file = Path(settings.decisions_dir) / path.removeprefix("decisions/")
    data: dict[str, Any] = yaml.safe_load(file.read_text(encoding="utf-8"))
    return data


async def record(
    a: App, params: dict[str, Any] | None = None, token: str = "token-alice"
) -> dict[str, Any]:
    result: dict[str, Any] = await a.rpc.ok(
        "cstp.recordDecision", params or full_decision(), token=token
    )
    assert result["indexed"] is True
    return result


# ---------------------------------------------------------------------------------------------
# The call itself
# ---------------------------------------------------------------------------------------------


async def test_review_result_and_reviewer(app: App) -> None:
    recorded = await record(app)
    reviewed_at = app.clock.advance(days=30, minutes=5)
    result = await app.rpc.ok(
        "cstp.reviewDecision",
        {
            "id": recorded["id"],
            "outcome": "success",
            "actualResult": "Worked well",
            "agent": {"id": "mallory"},  # informational, never trusted
        },
        token=bob_reviewer(app),
    )
    core = {"success", "id", "path", "status", "reviewedAt", "reindexed"}
    assert core <= set(result), result
    assert {k: result[k] for k in core - {"reviewedAt"}} == {
        "success": True,
        "id": recorded["id"],
        "path": recorded["path"],
        "status": "reviewed",
        "reindexed": True,
    }
    assert result["reviewedAt"] in (iso(reviewed_at), iso(reviewed_at).replace("Z", "+00:00"))
    decision = (await app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["reviewedBy"] == "bob"
    assert decision["recordedBy"] == "alice"
    assert decision["status"] == "reviewed"
    assert decision["outcome"] == "success"
    assert decision["actualResult"] == "Worked well"
    assert decision["reviewedAt"] == result["reviewedAt"]


@pytest.mark.parametrize("outcome", ["success", "partial", "failure", "abandoned"])
async def test_every_outcome_is_accepted(shared_app: App, outcome: str) -> None:
    recorded = await record(shared_app)
    result = await shared_app.rpc.ok(
        "cstp.reviewDecision", {"id": recorded["id"], "outcome": outcome}
    )
    assert result["status"] == "reviewed" and result["reindexed"] is True
    decision = (await shared_app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["outcome"] == outcome


async def test_an_agent_cannot_review_a_decision_another_agent_recorded(app: App) -> None:
    """An agent's token has ``review:own``: another agent's decision answers -32010 naming
    ``review:any`` (a reviewer's scope), and neither the row nor its reviews change."""
    recorded = await record(app)  # alice's
    answer = await app.rpc.call(
        "cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure"}, token="token-bob"
    )
    assert answer["error"]["code"] == -32010, answer
    assert answer["error"]["data"] == {"scope": "review:any"}
    decision = (await app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["status"] == "pending" and decision["reviews"] == []


async def test_unknown_id_is_decision_not_found(app: App) -> None:
    await record(app)
    error = await app.rpc.error("cstp.reviewDecision", {"id": "deadbeef", "outcome": "success"})
    assert error["code"] == -32007
    assert error["data"]["id"] == "deadbeef"
    assert await sql(app.settings, "SELECT id FROM decision_reviews") == []


@pytest.mark.parametrize(
    "bad_id", ["xyz", "DEADBEEF", "dec-123", "1234567", "123456789", "deadbeeg", "", 12345678, None]
)
async def test_malformed_id_is_invalid_params(shared_app: App, bad_id: Any) -> None:
    error = await shared_app.rpc.error("cstp.reviewDecision", {"id": bad_id, "outcome": "success"})
    assert error["code"] == -32602, error
    assert error["data"]["field"] == "id", error


@pytest.mark.parametrize("outcome", ["great", "SUCCESS", "", 1, None, ["success"]])
async def test_bad_outcome_is_invalid_params(shared_app: App, outcome: Any) -> None:
    recorded = await record(shared_app)
    error = await shared_app.rpc.error(
        "cstp.reviewDecision", {"id": recorded["id"], "outcome": outcome}
    )
    assert error["code"] == -32602, error
    assert error["data"]["field"] == "outcome", error
    decision = (await shared_app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["status"] == "pending" and decision["outcome"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"actualResult": 5}, "actualResult"),
        ({"lessons": ["a"]}, "lessons"),
        ({"affectedKpis": "latency"}, "affectedKpis"),
    ],
)
async def test_bad_optional_fields_are_invalid_params(
    shared_app: App, params: dict[str, Any], field: str
) -> None:
    recorded = await record(shared_app)
    error = await shared_app.rpc.error(
        "cstp.reviewDecision", {"id": recorded["id"], "outcome": "success", **params}
    )
    assert error["code"] == -32602
    assert error["data"]["field"] == field


async def test_snake_case_aliases(app: App) -> None:
    recorded = await record(app)
    kpis = {"latency": "-20%", "errors": 0}
    await app.rpc.ok(
        "cstp.reviewDecision",
        {
            "decision_id": recorded["id"],
            "outcome": "partial",
            "actual_result": "Faster, but flaky at first",
            "affected_kpis": kpis,
        },
    )
    decision = (await app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["outcome"] == "partial"
    assert decision["actualResult"] == "Faster, but flaky at first"
    assert decision["affectedKpis"] == kpis
    assert decision["reviews"][0]["actualResult"] == "Faster, but flaky at first"
    assert decision["reviews"][0]["affectedKpis"] == kpis
    exported = yaml_of(app.settings, recorded["path"])
    assert exported["actual_result"] == "Faster, but flaky at first"
    assert exported["affected_kpis"] == kpis


# ---------------------------------------------------------------------------------------------
# History, the decision row and the YAML file
# ---------------------------------------------------------------------------------------------

FIRST = {
    "outcome": "partial",
    "actualResult": "Migration took two weeks longer",
    "lessons": "Budget time for data backfills",
    "notes": "First look after a month",
    "affectedKpis": {"latency": "+5%"},
}
SECOND = {
    "outcome": "success",
    "actualResult": "Stable for a quarter",
    "lessons": "Postgres was the right call",
    "notes": "Final review",
    "affectedKpis": {"latency": "-30%", "incidents": 0},
}


async def test_two_reviews_keep_history_and_show_the_latest(app: App) -> None:
    recorded = await record(app)
    before = yaml_of(app.settings, recorded["path"])
    assert before["status"] == "pending" and "outcome" not in before

    first_at = app.clock.advance(days=30)
    first = await app.rpc.ok("cstp.reviewDecision", {"id": recorded["id"], **FIRST})
    second_at = app.clock.advance(days=60)
    second = await app.rpc.ok(
        "cstp.reviewDecision", {"id": recorded["id"], **SECOND}, token=bob_reviewer(app)
    )
    assert first["path"] == second["path"] == recorded["path"]

    rows = await sql(
        app.settings,
        "SELECT * FROM decision_reviews WHERE decision_id = :id ORDER BY reviewed_at",
        id=recorded["id"],
    )
    assert [
        (r["outcome"], r["reviewed_by"], r["lessons"], r["notes"], r["actual_result"]) for r in rows
    ] == [
        ("partial", "alice", FIRST["lessons"], FIRST["notes"], FIRST["actualResult"]),
        ("success", "bob", SECOND["lessons"], SECOND["notes"], SECOND["actualResult"]),
    ]

    decision = (await app.rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert decision["outcome"] == "success"
    assert decision["status"] == "reviewed"
    assert decision["reviewedBy"] == "bob"
    assert decision["actualResult"] == SECOND["actualResult"]
    assert decision["lessons"] == SECOND["lessons"]
    assert decision["reviewNotes"] == SECOND["notes"]
    assert decision["affectedKpis"] == SECOND["affectedKpis"]
    history = decision["reviews"]
    assert [
        (
            h["outcome"],
            h["reviewedBy"],
            h["lessons"],
            h["notes"],
            h["actualResult"],
            h["affectedKpis"],
        )
        for h in history
    ] == [
        (
            "partial",
            "alice",
            FIRST["lessons"],
            FIRST["notes"],
            FIRST["actualResult"],
            FIRST["affectedKpis"],
        ),
        (
            "success",
            "bob",
            SECOND["lessons"],
            SECOND["notes"],
            SECOND["actualResult"],
            SECOND["affectedKpis"],
        ),
    ]
    assert [h["reviewedAt"] for h in history] == [first["reviewedAt"], second["reviewedAt"]]
    assert first["reviewedAt"].startswith(first_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert second["reviewedAt"].startswith(second_at.strftime("%Y-%m-%dT%H:%M:%S"))
    # record-time fields are untouched by the reviews
    for key in (
        "decision",
        "category",
        "confidence",
        "stakes",
        "context",
        "tags",
        "kpiIndicators",
        "mentalState",
        "reviewIn",
        *PROJECT_FIELDS,
    ):
        assert decision[key] == full_decision()[key], key
    assert [r["text"] for r in decision["reasons"]] == [r["text"] for r in SEED_DECISION["reasons"]]

    after = yaml_of(app.settings, recorded["path"])
    for key, value in before.items():
        if key != "status":
            assert after.get(key) == value, f"YAML lost or changed {key!r} on review"
    assert after["status"] == "reviewed"
    assert after["outcome"] == "success"
    assert after["reviewed_by"] == "bob"
    assert str(after["reviewed_at"]).startswith(second_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert after["actual_result"] == SECOND["actualResult"]
    assert after["lessons"] == SECOND["lessons"]
    assert after["review_notes"] == SECOND["notes"]
    assert after["affected_kpis"] == SECOND["affectedKpis"]
    # the YAML keeps every record-time field the spec names
    for key in (
        "id",
        "summary",
        "decision",
        "category",
        "confidence",
        "stakes",
        "date",
        "context",
        "reasons",
        "kpi_indicators",
        "mental_state",
        "review_by",
        "tags",
        "pre_decision",
        "recorded_by",
        *PROJECT_FIELDS,
    ):
        assert key in after, key
    assert after["recorded_by"] == "alice"
    assert after["pr"] == 314 and after["line"] == 42


# ---------------------------------------------------------------------------------------------
# Re-indexing: the outcome becomes searchable and no metadata is dropped
# ---------------------------------------------------------------------------------------------


async def search(a: App, filters: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    result = await a.rpc.ok(
        "cstp.queryDecisions",
        {"query": "database for agent memory", "limit": 50, "filters": filters, **extra},
    )
    items: list[dict[str, Any]] = result["decisions"]
    return items


async def test_review_reindexes_with_outcome_and_all_metadata(app: App) -> None:
    target = await record(app)
    other = await record(
        app, {**full_decision(), "decision": "Use Redis for agent memory"}, token="token-bob"
    )
    everything_recorded = {
        "category": "architecture",
        "stakes": ["high"],
        "agent": "alice",
        "tags": ["database", "infrastructure"],
        "project": "atlas",
        "feature": "memory-store",
        "pr": 314,
        "minConfidence": 0.85,
        "maxConfidence": 0.85,
    }
    assert await search(app, {"hasOutcome": True}) == []
    assert {i["id"] for i in await search(app, {"hasOutcome": False})} == {
        target["id"],
        other["id"],
    }
    assert [i["id"] for i in await search(app, everything_recorded)] == [target["id"]]

    app.clock.advance(days=10)
    await app.rpc.ok(
        "cstp.reviewDecision",
        {"id": target["id"], "outcome": "failure", "lessons": "Too slow"},
        token=bob_reviewer(app),
    )

    found = await search(app, {"hasOutcome": True})
    assert [i["id"] for i in found] == [target["id"]]
    assert found[0]["outcome"] == "failure"
    assert found[0]["status"] == "reviewed"
    assert [i["id"] for i in await search(app, {"project": "atlas", "agent": "alice"})] == [
        target["id"]
    ]
    assert [i["id"] for i in await search(app, {"status": ["reviewed"]})] == [target["id"]]
    assert [i["id"] for i in await search(app, {"hasOutcome": False})] == [other["id"]]
    assert [i["id"] for i in await search(app, {"status": ["pending"]})] == [other["id"]]
    combined = {
        **everything_recorded,
        "hasOutcome": True,
        "status": ["reviewed"],
        "dateAfter": iso(T0),
        "dateBefore": iso(T0 + timedelta(seconds=1)),
    }
    rich = await search(app, combined, includeReasons=True)
    assert [i["id"] for i in rich] == [target["id"]]
    assert [r["text"] for r in rich[0]["reasons"]] == [r["text"] for r in SEED_DECISION["reasons"]]
    assert sorted(rich[0]["tags"]) == ["database", "infrastructure"]
    assert rich[0]["date"] == iso(T0)  # the decision's date, not the review's


async def test_second_review_replaces_the_indexed_outcome(app: App) -> None:
    recorded = await record(app)
    await app.rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure"})
    await app.rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"})
    found = await search(app, {"hasOutcome": True, "project": "atlas"})
    assert [(i["id"], i["outcome"]) for i in found] == [(recorded["id"], "success")]


# ---------------------------------------------------------------------------------------------
# Append-only history
# ---------------------------------------------------------------------------------------------


async def test_the_database_refuses_to_change_reviews(app: App) -> None:
    recorded = await record(app)
    await app.rpc.ok("cstp.reviewDecision", {"id": recorded["id"], **FIRST})
    await app.rpc.ok("cstp.reviewDecision", {"id": recorded["id"], **SECOND})
    snapshot = (
        "SELECT id, decision_id, outcome, lessons, reviewed_by FROM decision_reviews ORDER BY id"
    )
    before = await sql(app.settings, snapshot)
    assert len(before) == 2
    for statement in (
        "UPDATE decision_reviews SET outcome = 'failure'",
        "UPDATE decision_reviews SET lessons = 'rewritten' WHERE id = :id",
        "DELETE FROM decision_reviews WHERE id = :id",
        "DELETE FROM decision_reviews",
    ):
        with pytest.raises(DBAPIError):
            await sql(
                app.settings, statement, **({"id": before[0]["id"]} if ":id" in statement else {})
            )
    assert await sql(app.settings, snapshot) == before
