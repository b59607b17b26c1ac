"""Escalation and approvals (SPEC.md, section 8) on a real app and database: an escalate rule
asks for a person, the approval is decided once by another agent (four eyes), expires by time,
and the agent learns where it stands by announcing again; every step is a chained audit row.
The MCP face and two server processes are in test_approvals_served.py."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from app.approvals import expiry
from app.asgi import create_app
from app.cli import main
from app.config import Settings
from app.scopes import ROLES, Principal
from app.search.embedder import Embedder
from support.app import AppClient, Rpc, add_token, serve_app
from support.databases import USE_PG, run_sql

pytestmark = pytest.mark.usefixtures("commands_share_the_model")

RULES = """
guardrails:
  - id: prod-db-migration
    description: A production database migration needs a person's approval
    action: escalate
    timeout: 30m
    conditions:
      - {field: migration, operator: "==", value: true}
    message: "Migration of {database} needs approval"
  - id: quick-approval
    description: Asks a person, who has one second to answer
    action: escalate
    timeout: 1s
    conditions:
      - {field: quick, operator: "==", value: true}
    message: Needs a quick approval
  - id: tests-failing
    description: Nothing ships with failing tests
    action: block
    conditions:
      - {field: tests_failing, operator: "==", value: true}
    message: Tests are failing
  - id: shadow-payments
    description: Would ask for payments over a threshold (trial)
    action: escalate
    mode: shadow
    conditions:
      - {field: amount, operator: ">", value: 1000}
    message: A payment over 1000 would need approval
"""
MIGRATION = {
    "intent": "Run the orders table migration on the production database",
    "category": "architecture",
    "stakes": "medium",
    "confidence": 0.8,
    "metadata": {"migration": True, "database": "orders"},
    "correlationId": "mig-orders-1",
}


@pytest.fixture
def escalating(settings: Settings, tmp_path: Path) -> Settings:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "approvals.yaml").write_text(RULES, encoding="utf-8")
    return dataclasses.replace(settings, guardrails_dir=rules)


@pytest.fixture
async def app(escalating: Settings, embedder: Embedder) -> Any:
    async with serve_app(create_app(escalating, embedder=embedder)) as http:
        yield http


@pytest.fixture
def rpc(app: AppClient) -> Rpc:
    """alice (role agent) asks; carol approves; alice-approver is alice with ``approve``."""
    add_token(app, "token-carol", "carol", "approver")
    add_token(app, "token-audra", "audra", "auditor")
    both = ROLES["agent"] | {"approve"}
    app.app.state.tokens.add(
        "token-alice-approver", Principal("alice", role="approver", scopes=both)
    )
    return Rpc(app)


async def cstp(url: str, *args: str) -> Result:
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def test_escalate_pending_four_eyes_approved_then_allowed(
    rpc: Rpc, database_url: str
) -> None:
    first = await rpc.ok("cstp.announceIntent", MIGRATION)
    status = first["guardrailStatus"]
    escalation = status["escalation"]
    assert status["allowed"] is False and status["violations"] == []
    assert escalation["status"] == "pending" and escalation["rules"] == ["prod-db-migration"]
    approval_id = escalation["approvalId"]

    # the requester cannot decide, not even with the approve scope; a plain agent lacks it
    own = await rpc.error(
        "cstp.decideApproval", {"id": approval_id, "verdict": "approve"}, "token-alice-approver"
    )
    assert own["code"] == -32010
    plain = await rpc.error("cstp.decideApproval", {"id": approval_id, "verdict": "approve"})
    assert plain["code"] == -32010 and plain["data"] == {"scope": "approve"}

    # asking again while pending: evaluated again, the same approval, never a replay
    again = await rpc.ok("cstp.announceIntent", MIGRATION)
    assert again["guardrailStatus"]["escalation"]["approvalId"] == approval_id
    assert again["guardrailStatus"]["allowed"] is False
    assert again["guardrailStatus"]["evaluationId"] != status["evaluationId"]

    decided = await rpc.ok(
        "cstp.decideApproval",
        {"id": approval_id, "verdict": "approve", "reason": "Window agreed"},
        "token-carol",
    )
    approval = decided["approval"]
    assert approval["status"] == "approved" and approval["decidedBy"] == "carol"
    assert approval["reason"] == "Window agreed" and approval["requestedBy"] == "alice"
    assert approval["correlationId"] == "mig-orders-1"
    assert approval["action"]["description"] == MIGRATION["intent"]

    allowed = await rpc.ok("cstp.announceIntent", MIGRATION)
    assert allowed["guardrailStatus"]["allowed"] is True
    assert allowed["guardrailStatus"]["escalation"] == {**escalation, "status": "approved"}
    assert await rpc.ok("cstp.announceIntent", MIGRATION) == allowed  # a retry: replayed

    twice = await rpc.error(
        "cstp.decideApproval", {"id": approval_id, "verdict": "deny"}, "token-carol"
    )
    assert twice["code"] == -32008 and twice["data"]["status"] == "approved"

    # the same intent under the same correlationId but changed: -32008, as before approvals
    changed = {**MIGRATION, "metadata": {**MIGRATION["metadata"], "database": "users"}}
    assert (await rpc.error("cstp.announceIntent", changed))["code"] == -32008

    rows = await run_sql(
        database_url,
        "SELECT outcome, allowed FROM intents WHERE correlation_id = 'mig-orders-1' "
        "ORDER BY received_at",
    )
    assert [(r["outcome"], bool(r["allowed"])) for r in rows] == [
        ("escalated", False),
        ("escalated", False),
        ("ok", True),
        ("failed", False),  # the changed intent, refused (-32008), is stored too
    ]
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 0, verified.output


async def test_an_approval_past_its_timeout_reads_expired_and_stays_not_allowed(
    rpc: Rpc, app: AppClient, database_url: str
) -> None:
    quick = {**MIGRATION, "correlationId": "quick-1", "metadata": {"quick": True}}
    first = await rpc.ok("cstp.announceIntent", quick)
    approval_id = first["guardrailStatus"]["escalation"]["approvalId"]
    await asyncio.sleep(1.2)
    got = await rpc.ok("cstp.getApproval", {"id": approval_id})  # alice's own request
    assert got["approval"]["status"] == "expired" and "decidedBy" not in got["approval"]
    again = await rpc.ok("cstp.announceIntent", quick)
    assert again["guardrailStatus"]["allowed"] is False
    assert again["guardrailStatus"]["escalation"]["status"] == "expired"
    late = await rpc.error(
        "cstp.decideApproval", {"id": approval_id, "verdict": "approve"}, "token-carol"
    )
    assert late["code"] == -32008 and late["data"]["status"] == "expired"

    # the expiry becomes a chained row (the server's loop writes it; here, at once)
    services = app.app.state.services

    def later() -> datetime:  # past the writer's grace after the deadline
        return services.runtime.now() + expiry.GRACE

    assert await expiry.expire_overdue(services.db, services.runtime.now) == 0  # grace
    assert await expiry.expire_overdue(services.db, later) == 1
    assert await expiry.expire_overdue(services.db, later) == 0
    rows = await run_sql(database_url, "SELECT verdict, decided_by FROM approval_decisions")
    assert rows == [{"verdict": "expired", "decided_by": None}]
    still = await rpc.ok("cstp.getApproval", {"id": approval_id}, "token-carol")
    assert still["approval"]["status"] == "expired"
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 0, verified.output


async def test_block_wins_and_a_shadow_escalate_rule_asks_nobody(
    rpc: Rpc, database_url: str
) -> None:
    both = {
        **MIGRATION,
        "correlationId": "both-1",
        "metadata": {"migration": True, "tests_failing": True},
    }
    blocked = (await rpc.ok("cstp.announceIntent", both))["guardrailStatus"]
    assert blocked["allowed"] is False and "escalation" not in blocked
    assert [v["guardrailId"] for v in blocked["violations"]] == ["tests-failing"]

    pay = {"description": "Pay the supplier invoice", "context": {"amount": 5000}}
    shadowed = await rpc.ok("cstp.checkGuardrails", {"action": pay})
    assert shadowed["allowed"] is True and "escalation" not in shadowed
    assert await run_sql(database_url, "SELECT id FROM approvals") == []
    results = await run_sql(
        database_url,
        "SELECT guardrail_id, mode, fired, would_escalate FROM guardrail_rule_results "
        "WHERE guardrail_id IN ('shadow-payments', 'prod-db-migration', 'tests-failing') "
        "ORDER BY guardrail_id, evaluation_id",
    )
    seen = {(r["guardrail_id"], r["mode"], bool(r["fired"]), r["would_escalate"]) for r in results}
    assert ("shadow-payments", "shadow", False, True) in {
        (g, m, f, None if w is None else bool(w)) for g, m, f, w in seen
    }
    assert ("prod-db-migration", "enforce", True, False) in {
        (g, m, f, None if w is None else bool(w)) for g, m, f, w in seen
    }
    escalations = await run_sql(
        database_url, "SELECT violations, escalations FROM guardrail_evaluations"
    )
    assert {"violations": 1, "escalations": 1} in escalations
    listed = await rpc.ok("cstp.listGuardrails", {})
    by_id = {g["id"]: g for g in listed["guardrails"]}
    assert by_id["prod-db-migration"]["action"] == "escalate"
    assert by_id["prod-db-migration"]["timeout"] == "30m"
    assert by_id["shadow-payments"]["mode"] == "shadow"
    assert "timeout" not in by_id["tests-failing"]


async def test_check_guardrails_asks_and_takes_the_approval_id(rpc: Rpc) -> None:
    action = {"description": "Migrate the billing database", "context": {"migration": True}}
    asked = await rpc.ok("cstp.checkGuardrails", {"action": action})
    escalation = asked["escalation"]
    assert asked["allowed"] is False and escalation["status"] == "pending"
    approval_id = escalation["approvalId"]
    got = await rpc.ok("cstp.getApproval", {"id": approval_id})
    assert got["approval"]["correlationId"] is None

    pending = await rpc.ok("cstp.checkGuardrails", {"action": action, "approvalId": approval_id})
    assert pending["allowed"] is False and pending["escalation"]["approvalId"] == approval_id
    await rpc.ok("cstp.decideApproval", {"id": approval_id, "verdict": "approve"}, "token-carol")
    approved = await rpc.ok("cstp.checkGuardrails", {"action": action, "approvalId": approval_id})
    assert approved["allowed"] is True and approved["escalation"]["status"] == "approved"

    other = {**action, "description": "Migrate the users database"}
    wrong = await rpc.error("cstp.checkGuardrails", {"action": other, "approvalId": approval_id})
    assert wrong["code"] == -32008
    # another agent's approval is as one that does not exist
    theirs = await rpc.error(
        "cstp.checkGuardrails", {"action": action, "approvalId": approval_id}, "token-bob"
    )
    assert theirs["code"] == -32007
    unknown = await rpc.error(
        "cstp.getApproval", {"id": "00000000-0000-4000-8000-000000000000"}, "token-carol"
    )
    assert unknown["code"] == -32007


async def test_who_sees_which_approvals_and_the_order_of_the_list(rpc: Rpc) -> None:
    ids = []
    for n in range(3):
        asked = await rpc.ok("cstp.announceIntent", {**MIGRATION, "correlationId": f"list-{n}"})
        ids.append(asked["guardrailStatus"]["escalation"]["approvalId"])
    await rpc.ok(
        "cstp.decideApproval", {"id": ids[0], "verdict": "deny", "reason": "No"}, "token-carol"
    )

    # bob (an agent) does not see alice's request; carol (approver), audra (auditor) do
    assert (await rpc.error("cstp.getApproval", {"id": ids[1]}, "token-bob"))["code"] == -32007
    for token in ("token-carol", "token-audra", "token-alice"):
        assert (await rpc.ok("cstp.getApproval", {"id": ids[1]}, token))["approval"]["id"] == ids[1]
    assert (await rpc.error("cstp.listApprovals", {}))["data"] == {"scope": "approve"}

    listed = await rpc.ok("cstp.listApprovals", {}, "token-audra")
    assert listed["total"] == 3
    statuses = [a["status"] for a in listed["approvals"]]
    assert statuses == ["pending", "pending", "denied"]  # pending first
    pending = await rpc.ok("cstp.listApprovals", {"status": "pending", "limit": 1}, "token-carol")
    assert pending["total"] == 2 and len(pending["approvals"]) == 1
    denied = await rpc.ok("cstp.listApprovals", {"status": "denied"}, "token-carol")
    assert [a["id"] for a in denied["approvals"]] == [ids[0]]
    assert denied["approvals"][0]["reason"] == "No"


async def test_the_audit_chain_covers_approvals_and_replay_names_the_ending(
    rpc: Rpc, database_url: str
) -> None:
    first = await rpc.ok("cstp.announceIntent", MIGRATION)
    evaluation_id = first["guardrailStatus"]["evaluationId"]
    approval_id = first["guardrailStatus"]["escalation"]["approvalId"]
    replayed = await cstp(database_url, "guardrails", "replay", evaluation_id)
    assert replayed.exit_code == 0, replayed.output
    assert "stored:   allowed false (escalated)" in replayed.output
    assert "replayed: allowed false (escalated)" in replayed.output
    assert f"approval {approval_id}: pending" in replayed.output

    await rpc.ok(
        "cstp.decideApproval",
        {"id": approval_id, "verdict": "deny", "reason": "Not during the sale"},
        "token-carol",
    )
    replayed = await cstp(database_url, "guardrails", "replay", evaluation_id)
    assert f"approval {approval_id}: denied by carol at " in replayed.output
    assert replayed.output.rstrip().endswith("same verdict")

    tables = await run_sql(
        database_url,
        "SELECT table_name, row_id FROM audit_chain WHERE table_name LIKE 'approval%' ORDER BY seq",
    )
    assert [(t["table_name"], t["row_id"]) for t in tables] == [
        ("approvals", approval_id),
        ("approval_decisions", approval_id),
    ]
    assert (await cstp(database_url, "audit", "verify")).exit_code == 0

    # rows are append-only; an edit behind the database's back is named by verify
    with pytest.raises(Exception, match="append-only"):
        await run_sql(database_url, "UPDATE approval_decisions SET verdict = 'approved'")
    if USE_PG:
        tamper = [
            "ALTER TABLE approval_decisions DISABLE TRIGGER USER",
            "UPDATE approval_decisions SET verdict = 'approved', decided_by = 'mallory'",
            "ALTER TABLE approval_decisions ENABLE TRIGGER USER",
        ]
    else:
        tamper = [
            "DROP TRIGGER trg_approval_decisions_no_update",
            "UPDATE approval_decisions SET verdict = 'approved', decided_by = 'mallory'",
        ]
    for statement in tamper:
        await run_sql(database_url, statement)
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 1, verified.output
    assert "approval_decisions" in verified.output and approval_id in verified.output


async def test_the_protocol_examples_of_the_approval_methods(rpc: Rpc) -> None:
    """PROTOCOL.md's examples, on a real escalation (their ids are the page's)."""
    from test_protocol import example, result_schema  # the page's parser

    document = await rpc.ok("rpc.discover")
    by_name = {m["name"]: m for m in document["methods"]}
    asked = await rpc.ok("cstp.announceIntent", MIGRATION)
    approval_id = asked["guardrailStatus"]["escalation"]["approvalId"]
    jsonschema.validate(asked, result_schema(document, by_name["cstp.announceIntent"]))
    for name, token in (
        ("cstp.getApproval", "token-carol"),
        ("cstp.listApprovals", "token-carol"),
        ("cstp.decideApproval", "token-carol"),
    ):
        params = example(name).get("params", {})
        if "id" in params:
            params = {**params, "id": approval_id}
        result = await rpc.ok(name, params, token)
        jsonschema.validate(result, result_schema(document, by_name[name]))


async def test_webhooks_tell_of_the_request_the_decision_and_a_block(
    rpc: Rpc, escalating: Settings
) -> None:
    from test_webhooks import arrived, subscribe

    from support.receiver import Receiver

    receiver = Receiver().start()
    try:
        events = "approval.requested,approval.decided,guardrail.blocked"
        sub = await subscribe(escalating, receiver.url, events)
        asked = await rpc.ok("cstp.announceIntent", MIGRATION)
        approval_id = asked["guardrailStatus"]["escalation"]["approvalId"]
        await rpc.ok("cstp.announceIntent", MIGRATION)  # pending: asks nobody again
        await rpc.ok(
            "cstp.decideApproval",
            {"id": approval_id, "verdict": "approve", "reason": "Window agreed"},
            "token-carol",
        )
        blocked = await rpc.ok(
            "cstp.checkGuardrails",
            {"action": {"description": "Ship it", "context": {"tests_failing": True}}},
        )
        ids = await arrived(receiver, 3)
        await asyncio.sleep(0.5)  # anything more would come now
    finally:
        receiver.stop()
    assert ids == [
        f"msg_approval_requested_{approval_id}",
        f"msg_approval_decided_{approval_id}",
        f"msg_guardrail_blocked_{blocked['evaluationId']}",
    ]
    bodies = [r.verified(sub["secret"]) for r in receiver.got]  # the library's verifier
    requested, decided, block = (b["data"] for b in bodies)
    assert [b["type"] for b in bodies] == events.split(",")
    assert requested["requestedBy"] == "alice" and requested["rules"] == ["prod-db-migration"]
    assert requested["correlationId"] == MIGRATION["correlationId"]
    assert decided["status"] == "approved" and decided["decidedBy"] == "carol"
    assert decided["reason"] == "Window agreed"
    assert block["violations"] == ["tests-failing"] and block["agent"] == "alice"


SECOND_RULE = """
guardrails:
  - id: orders-second-person
    description: Orders migrations need a second person too
    action: escalate
    conditions:
      - {field: database, operator: "==", value: orders}
    message: Orders need a second person
"""


async def test_an_approval_covers_its_own_rules_action_and_intent_only(
    rpc: Rpc, escalating: Settings, embedder: Embedder, database_url: str
) -> None:
    asked = await rpc.ok("cstp.announceIntent", MIGRATION)
    approval_id = asked["guardrailStatus"]["escalation"]["approvalId"]
    # the same correlationId for another intent, or the same with another context: -32008
    other = {**MIGRATION, "intent": "Drop the orders table"}
    assert (await rpc.error("cstp.announceIntent", other))["code"] == -32008
    await rpc.ok("cstp.decideApproval", {"id": approval_id, "verdict": "approve"}, "token-carol")
    stated = {**MIGRATION, "context": "and drop the old orders table first"}
    assert (await rpc.error("cstp.announceIntent", stated))["code"] == -32008
    action = {"description": "Migrate orders", "context": {"migration": True, "database": "orders"}}
    checked = await rpc.ok("cstp.checkGuardrails", {"action": action})
    check_id = checked["escalation"]["approvalId"]
    await rpc.ok("cstp.decideApproval", {"id": check_id, "verdict": "approve"}, "token-carol")

    # a rule added since: the approvals do not answer for it
    assert escalating.guardrails_dir is not None
    (escalating.guardrails_dir / "second.yaml").write_text(SECOND_RULE, encoding="utf-8")
    async with serve_app(create_app(escalating, embedder=embedder)) as restarted:
        again = Rpc(restarted)
        refused = await again.error("cstp.announceIntent", MIGRATION)
        assert refused["code"] == -32008
        assert refused["data"] == {"approvalId": approval_id, "rules": ["orders-second-person"]}
        renewed = await again.ok("cstp.checkGuardrails", {"action": action, "approvalId": check_id})
        assert renewed["allowed"] is False
        escalation = renewed["escalation"]
        assert escalation["status"] == "pending" and escalation["approvalId"] != check_id
        assert escalation["rules"] == ["prod-db-migration", "orders-second-person"]


async def test_an_answer_allowed_by_an_approval_is_evidence_and_replays(
    rpc: Rpc, database_url: str
) -> None:
    action = {"description": "Migrate the billing database", "context": {"migration": True}}
    asked = await rpc.ok("cstp.checkGuardrails", {"action": action})
    approval_id = asked["escalation"]["approvalId"]
    await rpc.ok("cstp.decideApproval", {"id": approval_id, "verdict": "approve"}, "token-carol")
    allowed = await rpc.ok("cstp.checkGuardrails", {"action": action, "approvalId": approval_id})
    rows = await run_sql(
        database_url,
        "SELECT id, allowed, escalations, approval_id FROM guardrail_evaluations "
        "WHERE escalations IS NOT NULL ORDER BY evaluated_at",
    )
    assert [(bool(r["allowed"]), r["escalations"], r["approval_id"]) for r in rows] == [
        (False, 1, approval_id),
        (True, 1, approval_id),
    ]
    assert rows[1]["id"] == allowed["evaluationId"]
    for row in rows:
        replayed = await cstp(database_url, "guardrails", "replay", row["id"])
        assert replayed.exit_code == 0, replayed.output
        assert f"approval {approval_id}: approved by carol" in replayed.output
    assert "stored:   allowed true (escalated)" in replayed.output
    assert (await cstp(database_url, "audit", "verify")).exit_code == 0


async def test_a_decision_recorded_for_a_denied_intent_links_it(
    rpc: Rpc, database_url: str
) -> None:
    asked = await rpc.ok("cstp.announceIntent", MIGRATION)
    approval_id = asked["guardrailStatus"]["escalation"]["approvalId"]
    await rpc.ok("cstp.decideApproval", {"id": approval_id, "verdict": "deny"}, "token-carol")
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Postpone the orders migration",
            "confidence": 0.7,
            "category": "architecture",
            "correlationId": MIGRATION["correlationId"],
        },
    )
    got = (await rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
    assert got["correlationId"] == MIGRATION["correlationId"]
    rows = await run_sql(
        database_url,
        "SELECT d.pre_guardrails_passed, i.outcome FROM decisions d "
        "JOIN intents i ON i.id = d.intent_id",
    )
    assert [(bool(r["pre_guardrails_passed"]), r["outcome"]) for r in rows] == [
        (False, "escalated")
    ]
