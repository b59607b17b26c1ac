"""The learning loop (SPEC.md, section 9) on a history imported as YAML files: reviews due
appear in ready, most overdue first, and leave it once reviewed; an agent whose calibration
drifted in the last 30 days is flagged by checkDrift with both windows' numbers and appears in
ready as calibration_drift, a well calibrated one is not."""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from app.cli import main
from app.config import Settings
from support.app import Rpc, add_token

pytestmark = pytest.mark.usefixtures("commands_share_the_model")
NOW = datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decision(
    agent: str,
    text: str,
    *,
    days_ago: float,
    confidence: float = 0.8,
    category: str = "architecture",
    review_by_days_ago: float | None = None,
    outcome: str | None = None,
    reviewed_days_ago: float | None = None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": secrets.token_hex(4),
        "summary": text,
        "decision": text,
        "category": category,
        "confidence": confidence,
        "stakes": "medium",
        "status": "reviewed" if outcome else "pending",
        "date": iso(NOW - timedelta(days=days_ago)),
        "recorded_by": agent,
    }
    if review_by_days_ago is not None:
        fields["review_by"] = iso(NOW - timedelta(days=review_by_days_ago))
    if outcome is not None:
        assert reviewed_days_ago is not None
        fields |= {
            "outcome": outcome,
            "reviewed_at": iso(NOW - timedelta(days=reviewed_days_ago)),
            "reviewed_by": agent,
        }
    return fields


async def imported(settings: Settings, tmp_path: Path, decisions: list[dict[str, Any]]) -> None:
    tree = tmp_path / "history"
    for d in decisions:
        created = datetime.fromisoformat(d["date"].replace("Z", "+00:00"))
        folder = tree / f"{created:%Y}" / f"{created:%m}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{created:%Y-%m-%d}-decision-{d['id']}.yaml"
        (folder / name).write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
    env = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUDIT_KEY": None,
        "CSTP_AUDIT_KEY_FILE": None,
    }
    result: Result = await asyncio.to_thread(
        CliRunner().invoke, main, ["import", str(tree)], env=env
    )
    assert result.exit_code == 0, result.output


async def test_reviews_due_most_overdue_first_and_gone_once_reviewed(
    rpc: Rpc, settings: Settings, tmp_path: Path
) -> None:
    history = [
        decision("alice", "Adopt feature flags", days_ago=120, review_by_days_ago=90),
        decision("alice", "Split the billing service", days_ago=120, review_by_days_ago=3),
        decision("alice", "Use Kafka for events", days_ago=120, review_by_days_ago=30),
        decision("alice", "Move CI to arm runners", days_ago=120, review_by_days_ago=-10),
        decision("alice", "Keep the monolith for now", days_ago=120),  # no reviewIn: stale
        decision("bob", "Cache the catalogue", days_ago=120, review_by_days_ago=60),
        decision(
            "alice",
            "Use Postgres",
            days_ago=120,
            review_by_days_ago=100,
            outcome="success",
            reviewed_days_ago=99,
        ),
    ]
    await imported(settings, tmp_path, history)
    answer = await rpc.ok("cstp.ready", {})
    items = answer["items"]
    due = [i for i in items if i["kind"] == "review_due"]
    assert [i["decisionId"] for i in due] == [history[0]["id"], history[2]["id"], history[1]["id"]]
    assert [i["priority"] for i in due] == ["high", "high", "medium"]
    assert all(i["agent"] == "alice" for i in items)
    stale = [i for i in items if i["kind"] == "stale_pending"]
    assert [i["decisionId"] for i in stale] == [history[4]["id"]]
    assert answer["total"] == 4
    assert [i["kind"] for i in items] == ["review_due"] * 3 + ["stale_pending"]  # most urgent

    await rpc.ok("cstp.reviewDecision", {"id": history[0]["id"], "outcome": "success"})
    after = await rpc.ok("cstp.ready", {})
    assert history[0]["id"] not in [i.get("decisionId") for i in after["items"]]
    assert after["total"] == 3

    # another agent's list needs review:any
    refused = await rpc.error("cstp.ready", {"agent": "bob"})
    assert refused["code"] == -32010 and refused["data"] == {"scope": "review:any"}
    add_token(rpc.client, "token-rita", "rita", "reviewer")
    bobs = await rpc.ok("cstp.ready", {"agent": "bob"}, "token-rita")
    assert [i["decisionId"] for i in bobs["items"]] == [history[5]["id"]]


def reviewed_history(agent: str, drifting: bool) -> list[dict[str, Any]]:
    """90 days well calibrated (confidence 0.8, 8 of 10 succeed) before the last 30; in the
    last 30 the same, or (drifting) confident and mostly wrong."""
    out = []
    for n in range(10):
        out.append(
            decision(
                agent,
                f"{agent} baseline choice {n}",
                days_ago=100 - n,
                confidence=0.8,
                outcome="success" if n < 8 else "failure",
                reviewed_days_ago=80 - n * 4,
            )
        )
    for n in range(8):
        good = n < 6 if not drifting else n < 2
        out.append(
            decision(
                agent,
                f"{agent} recent choice {n}",
                days_ago=28 - n,
                confidence=0.8,
                outcome="success" if good else "failure",
                reviewed_days_ago=20 - n * 2,
            )
        )
    return out


async def test_drift_flagged_with_both_windows_and_in_ready(
    rpc: Rpc, settings: Settings, tmp_path: Path
) -> None:
    await imported(
        settings, tmp_path, reviewed_history("alice", True) + reviewed_history("bob", False)
    )
    groups = (await rpc.ok("cstp.checkDrift", {}))["groups"]
    by_agent = {g["agent"]: g for g in groups}
    alice, bob = by_agent["alice"], by_agent["bob"]
    assert alice["category"] == "architecture" and alice["drifted"] is True
    assert alice["baseline"] == {"n": 10, "brierScore": 0.16, "accuracy": 0.8}
    assert alice["recent"]["n"] == 8 and alice["recent"]["accuracy"] == 0.25
    assert alice["recent"]["brierScore"] == 0.49
    assert any("Brier score 0.490" in r and "0.160" in r for r in alice["reasons"])
    assert any("accuracy 0.250" in r and "-55 points" in r for r in alice["reasons"])
    assert bob["drifted"] is False and bob["reasons"] == []
    assert bob["recent"]["accuracy"] == 0.75

    # fewer than minDecisions on a side: nothing concluded
    strict = (await rpc.ok("cstp.checkDrift", {"agent": "alice", "minDecisions": 9}))["groups"]
    assert [g["drifted"] for g in strict] == [False]

    items = (await rpc.ok("cstp.ready", {}))["items"]
    drift = [i for i in items if i["kind"] == "calibration_drift"]
    assert len(drift) == 1 and drift[0]["category"] == "architecture"
    assert drift[0]["priority"] == "high" and "Brier score" in drift[0]["reason"]
    bob_token = "token-bob"
    assert not [
        i
        for i in (await rpc.ok("cstp.ready", {}, bob_token))["items"]
        if i["kind"] == "calibration_drift"
    ]


async def test_a_status_update_is_flagged_and_left_out_of_calibration(
    rpc: Rpc, database_url: str
) -> None:
    from support.databases import run_sql

    noise = await rpc.ok(
        "cstp.recordDecision",
        {"decision": "Done, sent the email", "confidence": 0.9, "category": "process"},
    )
    real = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Use Postgres instead of MongoDB for the ledger",
            "confidence": 0.9,
            "category": "process",
        },
    )
    assert noise["quality"] == {"flags": ["not_a_decision"]}
    assert real["quality"] == {"flags": []}
    rows = await run_sql(
        database_url, "SELECT id, quality_flags IS NULL AS plain FROM decisions ORDER BY id"
    )
    assert {r["id"]: bool(r["plain"]) for r in rows} == {noise["id"]: False, real["id"]: True}
    calibration = await rpc.ok("cstp.getCalibration", {"category": "process", "minDecisions": 1})
    assert calibration["overall"]["pendingDecisions"] == 1  # the real one only
    await rpc.ok("cstp.reviewDecision", {"id": noise["id"], "outcome": "success"})
    reviewed = await rpc.ok("cstp.getCalibration", {"category": "process", "minDecisions": 1})
    assert reviewed["overall"]["totalDecisions"] == 1  # reviewed anyway: it counts
    assert reviewed["overall"]["pendingDecisions"] == 1
