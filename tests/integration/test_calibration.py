"""cstp.getCalibration over the real HTTP app: SPEC's worked examples, every filter (nested and
top-level), every groupBy, abandoned and unreviewed decisions, too little data, -32602 with
the field named, and 100,000 reviewed decisions answered in SQL with flat Python memory."""

from __future__ import annotations

import time
import tracemalloc
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, update

from app.calibration.schemas import round3
from app.db.decisions import Decision, DecisionReview

METHOD = "cstp.getCalibration"
SCORE = {"success": 1.0, "partial": 0.5, "failure": 0.0}
T0 = datetime(2026, 3, 1, tzinfo=UTC)


async def record(rpc: Any, confidence: float, token: str = "token-alice", **fields: Any) -> str:
    params = {
        "decision": f"Decide something at {confidence}",
        "confidence": confidence,
        "category": "architecture",
        **fields,
    }
    result = await rpc.ok("cstp.recordDecision", params, token=token)
    return str(result["id"])


async def review(
    rpc: Any, services: Any, decision_id: str, outcome: str, token: str = "token-alice"
) -> None:
    """Review through cstp.reviewDecision when the app has it, else write what it writes."""
    if rpc.client.app.state.registry.get("cstp.reviewDecision") is not None:
        await rpc.ok("cstp.reviewDecision", {"id": decision_id, "outcome": outcome}, token=token)
        return
    latest = {
        "outcome": outcome,
        "reviewed_at": datetime.now(UTC),
        "reviewed_by": services.settings.auth_tokens[token],
    }
    async with services.db.transaction() as session:
        session.add(DecisionReview(decision_id=decision_id, **latest))
        await session.execute(
            update(Decision).where(Decision.id == decision_id).values(status="reviewed", **latest)
        )


async def record_reviewed(
    rpc: Any,
    services: Any,
    confidence: float,
    outcomes: list[str],
    token: str = "token-alice",
    **fields: Any,
) -> list[str]:
    ids = []
    for outcome in outcomes:
        decision_id = await record(rpc, confidence, token, **fields)
        await review(rpc, services, decision_id, outcome, token)
        ids.append(decision_id)
    return ids


def row(i: int, confidence: float, outcome: str | None, **fields: Any) -> dict[str, Any]:
    """A decision row for direct bulk inserts (fast set-ups that need chosen timestamps)."""
    return {
        "id": f"{i:08x}",
        "summary": "s",
        "decision": "d",
        "category": "architecture",
        "confidence": confidence,
        "stakes": "medium",
        "created_at": T0,
        "recorded_by": "alice",
        "outcome": outcome,
        "status": "pending" if outcome is None else "reviewed",
        "reviewed_at": None if outcome is None else T0 + timedelta(days=1),
        **fields,
    }


async def insert_rows(services: Any, rows: list[dict[str, Any]], chunk: int = 5000) -> None:
    for start in range(0, len(rows), chunk):
        async with services.db.transaction() as session:
            # Core insert: a plain DBAPI executemany, several times faster than the ORM path.
            await session.execute(insert(Decision.__table__), rows[start : start + chunk])


async def test_worked_example_slightly_overconfident(rpc: Any, services: Any) -> None:
    await record_reviewed(rpc, services, 0.75, ["success"] * 4 + ["failure"] * 2)
    result = await rpc.ok(METHOD, {})
    headline = [result[k] for k in ("brierScore", "accuracy", "calibrationGap", "interpretation")]
    assert headline == [0.229, 0.667, -0.083, "slightly_overconfident"]
    assert result["overall"] == {
        "brierScore": 0.229,
        "accuracy": 0.667,
        "calibrationGap": -0.083,
        "interpretation": "slightly_overconfident",
        "totalDecisions": 6,
        "reviewedDecisions": 6,
        "pendingDecisions": 0,
        "meanConfidence": 0.75,
    }
    assert result["buckets"] == [
        {
            "bucket": "0.7-0.8",
            "low": 0.7,
            "high": 0.8,
            "count": 6,
            "meanConfidence": 0.75,
            "accuracy": 0.667,
            "gap": -0.083,
            "brierScore": 0.229,
        }
    ]
    assert any(
        "0.7-0.8" in r and "67%" in r and "lower confidence" in r for r in result["recommendations"]
    )
    assert (result["agent"], result["filters"]) == ("alice", {"minDecisions": 5})
    assert "groups" not in result


async def test_worked_example_underconfident(rpc: Any, services: Any) -> None:
    await record_reviewed(rpc, services, 0.8, ["success"] * 5)
    result = await rpc.ok(METHOD, {"filters": {}})
    assert (result["brierScore"], result["accuracy"], result["calibrationGap"]) == (0.04, 1.0, 0.2)
    assert result["interpretation"] == "underconfident"
    assert [b["bucket"] for b in result["buckets"]] == ["0.8-0.9"]
    assert any("higher confidence" in r for r in result["recommendations"])


async def test_abandoned_is_reviewed_but_not_scored(rpc: Any, services: Any) -> None:
    await record_reviewed(rpc, services, 0.8, ["success"] * 5 + ["abandoned"] * 3)
    await record(rpc, 0.3)  # never reviewed
    overall = (await rpc.ok(METHOD, {}))["overall"]
    assert overall["brierScore"] == 0.04 and overall["interpretation"] == "underconfident"
    assert (overall["totalDecisions"], overall["reviewedDecisions"]) == (5, 8)
    assert overall["pendingDecisions"] == 1


async def test_partial_scores_half_and_latest_review_counts(rpc: Any, services: Any) -> None:
    ids = await record_reviewed(rpc, services, 0.5, ["partial"] * 4 + ["failure"])
    await review(rpc, services, ids[-1], "partial")  # a second review replaces the first
    result = await rpc.ok(METHOD, {})
    assert (result["brierScore"], result["accuracy"], result["calibrationGap"]) == (0.0, 0.5, 0.0)
    assert result["interpretation"] == "well_calibrated"
    assert result["overall"]["totalDecisions"] == 5


async def test_bucket_edges_are_the_same_on_every_database(services: Any, rpc: Any) -> None:
    confidences = [0.0, 0.09, 0.1, 0.3, 0.6, 0.7, 0.75, 0.8, 0.95, 0.99, 1.0]
    await insert_rows(services, [row(i, c, "success") for i, c in enumerate(confidences)])
    buckets = (await rpc.ok(METHOD, {}))["buckets"]
    assert {b["bucket"]: b["count"] for b in buckets} == {
        "0.0-0.1": 2,
        "0.1-0.2": 1,
        "0.3-0.4": 1,
        "0.6-0.7": 1,
        "0.7-0.8": 2,
        "0.8-0.9": 1,
        "0.9-1.0": 3,
    }
    assert [b["low"] for b in buckets] == [0.0, 0.1, 0.3, 0.6, 0.7, 0.8, 0.9]


async def test_too_little_data_is_a_clear_answer_not_an_error(rpc: Any, services: Any) -> None:
    result = await rpc.ok(METHOD, {})
    assert (result["interpretation"], result["brierScore"], result["calibrationGap"]) == (
        "insufficient_data",
        None,
        None,
    )
    assert result["overall"]["totalDecisions"] == 0 and result["buckets"] == []
    assert "review more decisions" in result["recommendations"][0]
    await record_reviewed(rpc, services, 0.9, ["success", "failure", "success"])
    result = await rpc.ok(METHOD, {})
    assert result["interpretation"] == "insufficient_data"
    assert result["overall"]["totalDecisions"] == 3
    assert result["brierScore"] == round3((0.01 + 0.81 + 0.01) / 3)
    assert "Only 3 reviewed decision(s)" in result["recommendations"][0]
    enough = await rpc.ok(METHOD, {"filters": {"minDecisions": 3}})
    assert enough["interpretation"] == "overconfident"  # 67% success at 0.9


async def test_agent_filter_follows_the_recording_token(rpc: Any, services: Any) -> None:
    await record_reviewed(rpc, services, 0.8, ["success"] * 5, token="token-alice")
    await record_reviewed(rpc, services, 0.6, ["failure"] * 5, token="token-bob")
    alice = await rpc.ok(METHOD, {"filters": {"agent": "alice"}}, token="token-bob")
    assert alice["overall"]["totalDecisions"] == 5 and alice["accuracy"] == 1.0
    assert alice["agent"] == "bob" and alice["filters"]["agent"] == "alice"
    bob = await rpc.ok(METHOD, {"filters": {"agent": "bob"}})
    assert bob["accuracy"] == 0.0 and bob["interpretation"] == "overconfident"
    assert (await rpc.ok(METHOD, {}))["overall"]["totalDecisions"] == 10
    assert (await rpc.ok(METHOD, {"filters": {"agent": "carol"}}))["overall"]["totalDecisions"] == 0


async def test_category_and_stakes_filters_combine(rpc: Any, services: Any) -> None:
    rows = [row(i, 0.7, "success", category="security", stakes="high") for i in range(3)]
    rows += [row(10 + i, 0.7, "failure", category="security", stakes="low") for i in range(4)]
    rows += [row(20 + i, 0.7, "partial", category="tooling", stakes="high") for i in range(5)]
    await insert_rows(services, rows)

    async def scored(params: dict[str, Any]) -> int:
        return int((await rpc.ok(METHOD, params))["overall"]["totalDecisions"])

    assert await scored({"filters": {"category": "security"}}) == 7
    assert await scored({"filters": {"stakes": "high"}}) == 8
    assert await scored({"filters": {"category": "security", "stakes": "high"}}) == 3
    assert await scored({"filters": {"category": "process"}}) == 0


async def test_since_inclusive_until_exclusive(rpc: Any, services: Any) -> None:
    days = [T0 + timedelta(days=d) for d in range(5)]  # 1 to 5 March 2026
    await insert_rows(services, [row(i, 0.6, "success", created_at=d) for i, d in enumerate(days)])

    async def scored(filters: dict[str, Any]) -> int:
        return int((await rpc.ok(METHOD, {"filters": filters}))["overall"]["totalDecisions"])

    assert await scored({"since": "2026-03-02"}) == 4
    assert await scored({"until": "2026-03-04"}) == 3
    assert await scored({"since": "2026-03-02T00:00:00Z", "until": "2026-03-04T00:00:00Z"}) == 2
    assert await scored({"since": "2026-03-02T00:00:01+00:00"}) == 3
    assert await scored({"since": "2026-03-02T01:00:00+01:00"}) == 4  # same instant as 00:00Z
    echoed = (await rpc.ok(METHOD, {"filters": {"since": "2026-03-02"}}))["filters"]
    assert echoed == {"since": "2026-03-02T00:00:00Z", "minDecisions": 5}


async def test_filters_at_the_top_level(rpc: Any, services: Any) -> None:
    await record_reviewed(rpc, services, 0.8, ["success"] * 3, token="token-alice")
    await record_reviewed(rpc, services, 0.6, ["failure"] * 4, token="token-bob")
    result = await rpc.ok(METHOD, {"agent": "alice", "minDecisions": 3})
    assert result["filters"] == {"agent": "alice", "minDecisions": 3}
    assert (result["overall"]["totalDecisions"], result["interpretation"]) == (3, "underconfident")
    # ``filters`` wins over a top-level value for the same key, key by key.
    mixed = await rpc.ok(METHOD, {"filters": {"agent": "bob"}, "agent": "alice", "minDecisions": 4})
    assert mixed["filters"] == {"agent": "bob", "minDecisions": 4}
    assert mixed["interpretation"] == "overconfident"
    # The informational ``agent: {id}`` of older clients is not a filter; nulls are absent.
    info = await rpc.ok(
        METHOD, {"agent": {"id": "mallory"}, "filters": {"agent": None}, "category": None}
    )
    assert info["overall"]["totalDecisions"] == 7 and "agent" not in info["filters"]


async def test_group_by_category_stakes_agent(rpc: Any, services: Any) -> None:
    rows = [
        row(i, 0.75, "success" if i < 4 else "failure", category="security", stakes="critical")
        for i in range(6)
    ]
    rows += [
        row(10 + i, 0.8, "success", category="tooling", stakes="low", recorded_by="bob")
        for i in range(5)
    ]
    rows += [row(20 + i, 0.9, "abandoned", category="process", recorded_by="bob") for i in range(2)]
    await insert_rows(services, rows)

    async def groups(by: str) -> dict[str, dict[str, Any]]:
        result = await rpc.ok(METHOD, {"groupBy": by})
        assert result["groupBy"] == by and result["overall"]["totalDecisions"] == 11
        return {g["key"]: g for g in result["groups"]}

    by_category = await groups("category")
    assert list(by_category) == ["process", "security", "tooling"]
    security = by_category["security"]
    assert (security["brierScore"], security["accuracy"], security["calibrationGap"]) == (
        0.229,
        0.667,
        -0.083,
    )
    assert (security["interpretation"], by_category["tooling"]["interpretation"]) == (
        "slightly_overconfident",
        "underconfident",
    )
    process = by_category["process"]  # only abandoned decisions: reviewed, none scored
    assert [
        process[k] for k in ("interpretation", "reviewedDecisions", "totalDecisions", "brierScore")
    ] == ["insufficient_data", 2, 0, None]

    by_stakes = await groups("stakes")
    assert list(by_stakes) == ["low", "medium", "critical"]  # by severity
    assert by_stakes["critical"]["totalDecisions"] == 6

    by_agent = await groups("agent")
    assert {k: g["totalDecisions"] for k, g in by_agent.items()} == {"alice": 6, "bob": 5}

    advice = (await rpc.ok(METHOD, {"groupBy": "category"}))["recommendations"]
    assert any("category 'tooling'" in r for r in advice)


async def test_group_by_confidence_bucket(rpc: Any, services: Any) -> None:
    rows = [row(i, 0.75, "success" if i < 4 else "failure") for i in range(6)]
    rows += [row(10 + i, 0.3, "failure") for i in range(2)]
    rows += [row(20, 0.35, None)]
    await insert_rows(services, rows)
    result = await rpc.ok(METHOD, {"groupBy": "confidenceBucket"})
    groups = {g["key"]: g for g in result["groups"]}
    assert list(groups) == ["0.3-0.4", "0.7-0.8"]
    assert groups["0.7-0.8"]["interpretation"] == "slightly_overconfident"
    low = groups["0.3-0.4"]
    assert (low["totalDecisions"], low["pendingDecisions"]) == (2, 1)
    assert low["interpretation"] == "insufficient_data"


async def test_invalid_params_name_the_field(shared_rpc: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"groupBy": "colour"}, "groupBy"),
        ({"filters": {"minDecisions": 0}}, "filters.minDecisions"),
        ({"minDecisions": 0}, "minDecisions"),
        ({"filters": {"minDecisions": 2.5}}, "filters.minDecisions"),
        ({"filters": {"minDecisions": True}}, "filters.minDecisions"),
        ({"filters": {"since": "yesterday"}}, "filters.since"),
        ({"until": "2026-13-01"}, "until"),
        ({"since": "2026-03-01T10:00:00"}, "since"),  # no time zone
        ({"filters": {"since": "2026-03-02", "until": "2026-03-01"}}, "filters.until"),
        ({"filters": {"stakes": "huge"}}, "filters.stakes"),
        ({"filters": {"agent": 7}}, "filters.agent"),
        ({"filters": "everything"}, "filters"),
    ]
    for params, field in cases:
        error = await shared_rpc.error(METHOD, params)
        assert error["code"] == -32602, (params, error)
        assert error["data"]["field"] == field, (params, error)
    colour = await shared_rpc.error(METHOD, {"groupBy": "colour"})
    assert "confidenceBucket" in colour["data"]["error"]


SCORED = ("success", "success", "partial", "failure", "success", "failure", "partial")


def outcome_of(i: int) -> str | None:
    """A deterministic mix: 1 in 51 unreviewed, 1 in 10 of the rest abandoned."""
    if i % 51 == 0:
        return None
    return "abandoned" if i % 10 == 3 else SCORED[(i * 5) % len(SCORED)]


def generated(count: int) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
    """Deterministic rows plus the figures they must produce, computed here independently."""
    rows, n, reviewed, conf, score, squared = [], 0, 0, 0.0, 0.0, 0.0
    buckets: dict[str, int] = defaultdict(int)
    for i in range(count):
        confidence = ((i * 37) % 101) / 100
        outcome = outcome_of(i)
        rows.append(row(i, confidence, outcome, recorded_by=("alice", "bob")[i % 2]))
        reviewed += outcome is not None
        if outcome in SCORE:
            n += 1
            conf += confidence
            score += SCORE[outcome]
            squared += (confidence - SCORE[outcome]) ** 2
            index = next(k for k in range(9, -1, -1) if confidence >= k / 10)
            buckets[f"{index / 10:.1f}-{(index + 1) / 10:.1f}"] += 1
    expected = {
        "brierScore": round3(squared / n),
        "accuracy": round3(score / n),
        "calibrationGap": round3((score - conf) / n),
        "meanConfidence": round3(conf / n),
        "totalDecisions": n,
        "reviewedDecisions": reviewed,
        "pendingDecisions": count - reviewed,
    }
    return rows, expected, dict(buckets)


@pytest.mark.slow  # 100k rows
async def test_100k_reviewed_decisions_in_sql_with_flat_memory(rpc: Any, services: Any) -> None:
    rows, expected, buckets = generated(102_000)
    assert expected["reviewedDecisions"] == 100_000 and expected["totalDecisions"] == 90_000
    started = time.perf_counter()
    await insert_rows(services, rows, chunk=10_000)
    del rows
    inserted = time.perf_counter() - started
    await rpc.ok(METHOD, {"filters": {"agent": "nobody"}})  # warm caches outside the measure
    tracemalloc.start()
    try:
        result = await rpc.ok(METHOD, {"groupBy": "agent"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    overall = result["overall"]
    for key, value in expected.items():
        assert overall[key] == value, (key, overall[key], value)
    assert {b["bucket"]: b["count"] for b in result["buckets"]} == buckets
    assert sum(g["totalDecisions"] for g in result["groups"]) == expected["totalDecisions"]
    print(f"100k calibration: insert {inserted:.1f}s, call peak {peak / 1e6:.2f} MB")
    assert peak < 5 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB (insert took {inserted:.1f}s)"
