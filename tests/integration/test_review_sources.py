"""Where an outcome comes from (SPEC.md, section 9): every review has a source, getDecision
shows it per review, getCalibration scores one source when asked and names the sources it
scored; `cstp audit verify` holds the decision's copy of its latest review's source to it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from app.decisions import repository
from support.app import Rpc
from support.databases import run_sql

pytestmark = pytest.mark.usefixtures("commands_share_the_model")


async def cstp(url: str, *args: str) -> Result:
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def record(rpc: Rpc, n: int, confidence: float) -> str:
    decision = {
        "decision": f"Use a cache, take {n}",
        "confidence": confidence,
        "category": "architecture",
    }
    result = await rpc.ok("cstp.recordDecision", decision)
    return str(result["id"])


async def observed(services: Any, decision_id: str, outcome: str) -> None:
    """A review from CI, as the CI hook stores it (the same repository call)."""
    async with services.db.transaction(write=True) as session:
        decision = await repository.lock_one(session, "default", decision_id)
        repository.add_review(
            session,
            decision,
            outcome=outcome,
            actual_result=None,
            lessons=None,
            notes=None,
            affected_kpis=None,
            reviewed_by="ci",
            reviewed_at=services.runtime.now(),
            source="ci",
        )


async def test_sources_are_shown_scored_apart_and_verified(
    rpc: Rpc, services: Any, database_url: str
) -> None:
    claimed = [await record(rpc, n, 0.9) for n in range(3)]
    seen = [await record(rpc, n + 3, 0.9) for n in range(3)]
    for d in claimed:
        await rpc.ok("cstp.reviewDecision", {"id": d, "outcome": "success"})
    for d in seen:
        await observed(services, d, "failure")

    got = (await rpc.ok("cstp.getDecision", {"id": seen[0]}))["decision"]
    assert [r["source"] for r in got["reviews"]] == ["ci"]
    mine = (await rpc.ok("cstp.getDecision", {"id": claimed[0]}))["decision"]
    assert [r["source"] for r in mine["reviews"]] == ["agent"]

    both = await rpc.ok("cstp.getCalibration", {"minDecisions": 1})
    assert both["sources"] == ["agent", "ci"] and both["overall"]["totalDecisions"] == 6
    ci = await rpc.ok("cstp.getCalibration", {"filters": {"source": ["ci"], "minDecisions": 1}})
    assert ci["sources"] == ["ci"] and ci["filters"]["source"] == ["ci"]
    assert ci["overall"]["totalDecisions"] == 3 and ci["accuracy"] == 0.0
    agent = await rpc.ok(
        "cstp.getCalibration", {"filters": {"source": ["agent"], "minDecisions": 1}}
    )
    assert agent["accuracy"] == 1.0 and agent["sources"] == ["agent"]
    none = await rpc.ok("cstp.getCalibration", {"filters": {"source": ["human"]}})
    assert none["sources"] == [] and none["overall"]["totalDecisions"] == 0
    bad = await rpc.error("cstp.getCalibration", {"filters": {"source": ["rumour"]}})
    assert bad["code"] == -32602

    assert (await cstp(database_url, "audit", "verify")).exit_code == 0
    # the decision's copy of the source (a review column: not frozen) is held to its latest,
    # chained review
    await run_sql(
        database_url, f"UPDATE decisions SET review_source = 'human' WHERE id = '{seen[0]}'"
    )
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 1 and seen[0] in verified.output
