"""Scopes are checked in one place, the runner, for every face: a token without the scope a
method needs gets -32010 naming it, before the call does anything; with it, the call is
served; MCP's tools/list shows a token only the tools it may call. (docs/PROTOCOL.md, Scopes.)

The tokens of the configuration all have role ``agent``; the tokens of other roles here are
added to the app's token table as a token of the database will be."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from app.asgi import build_registry
from app.db.audit import AuditEntry
from app.db.intents import Intent
from app.operations.registry import Registry
from app.scopes import ROLES, Principal
from support.app import AppClient, Rpc

REGISTRY = build_registry()
# Params each method accepts (the ids need not exist: the scope is checked first).
PARAMS: dict[str, dict[str, Any]] = {
    "cstp.announceIntent": {"intent": "Add a cache in front of the catalogue"},
    "cstp.recordDecision": {
        "decision": "Use a cache",
        "confidence": 0.8,
        "category": "architecture",
        "stakes": "low",
    },
    "cstp.reviewDecision": {"id": "0123abcd", "outcome": "success"},
    "cstp.checkGuardrails": {"action": {"description": "Deploy on Friday"}},
    "cstp.queryDecisions": {"query": "cache"},
    "cstp.getDecision": {"id": "0123abcd"},
    "cstp.listDecisions": {},
    "cstp.listGuardrails": {},
    "cstp.getCalibration": {},
    "rpc.discover": {},
    "cstp.getApproval": {"id": "0123abcd-0000-4000-8000-000000000000"},
    "cstp.listApprovals": {},
    "cstp.decideApproval": {"id": "0123abcd-0000-4000-8000-000000000000", "verdict": "approve"},
    "cstp.ready": {},
    "cstp.checkDrift": {},
    "cstp.getSessionContext": {},
}


def with_role(client: AppClient, token: str, role: str) -> Rpc:
    client.app.state.tokens.add(token, Principal(f"{role}-agent", role=role, scopes=ROLES[role]))
    return Rpc(client, token=token)


def test_every_operation_declares_its_scopes_and_every_one_has_params_here() -> None:
    assert sorted(PARAMS) == REGISTRY.names()
    assert all(op.scopes for op in REGISTRY.operations())
    listed = REGISTRY.get("cstp.listDecisions")
    assert listed is not None
    for scopes in ((), ("everything",)):
        with pytest.raises(ValueError, match="must declare its scopes"):
            Registry().add(replace(listed, scopes=scopes))


@pytest.mark.parametrize("method", REGISTRY.names())
async def test_a_token_without_the_scope_is_forbidden_before_anything_happens(
    client: AppClient, rpc: Rpc, method: str
) -> None:
    monitor = with_role(client, "token-monitor", "monitor")  # scope "metrics" only
    answer = await monitor.call(method, PARAMS[method])
    operation = REGISTRY.get(method)
    assert operation is not None
    assert answer["error"]["code"] == -32010, answer
    assert answer["error"]["data"] == {"scope": operation.scopes[0]}
    assert (await rpc.ok("cstp.listDecisions", {}))["total"] == 0  # nothing was recorded


async def test_an_announcement_without_the_scope_writes_nothing_and_is_logged(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A token that may not announce never reaches the operation: no intent row, no chain
    entry (else a read-only token could fill the audit tables, unlimited by the rate limit
    it never reaches); the call's log line says who was refused."""
    reviewer = with_role(client, "token-reviewer", "reviewer")
    with caplog.at_level(logging.INFO, logger="cstp.rpc"):
        for _ in range(3):
            answer = await reviewer.call("cstp.announceIntent", PARAMS["cstp.announceIntent"])
            assert answer["error"]["data"] == {"scope": "announce"}
    services = client.app.state.services
    async with services.db.transaction(write=False) as session:
        assert (await session.scalars(select(Intent))).all() == []
        assert (await session.scalars(select(AuditEntry))).all() == []
    refused = [
        json.loads(r.getMessage()) for r in caplog.records if '"event": "rpc"' in r.getMessage()
    ]
    assert [(r["workspace"], r["agent"], r["outcome"]) for r in refused] == [
        ("default", "reviewer-agent", "-32010")
    ] * 3


async def test_read_scope_serves_the_reads_and_refuses_the_writes(client: AppClient) -> None:
    auditor = with_role(client, "token-auditor", "auditor")  # read, audit
    for method in ("cstp.listGuardrails", "cstp.getCalibration", "cstp.queryDecisions"):
        await auditor.ok(method, PARAMS[method])
    assert (await auditor.ok("cstp.listDecisions", {}))["total"] == 0
    missing = await auditor.call("cstp.getDecision", PARAMS["cstp.getDecision"])
    assert missing["error"]["code"] == -32007  # served: the id does not exist
    for method, scope in (
        ("cstp.recordDecision", "record"),
        ("cstp.announceIntent", "announce"),
        ("cstp.checkGuardrails", "announce"),
        ("cstp.reviewDecision", "review:own"),
    ):
        answer = await auditor.call(method, PARAMS[method])
        assert answer["error"]["code"] == -32010 and answer["error"]["data"] == {"scope": scope}


async def test_an_agent_token_keeps_every_agent_method(rpc: Rpc) -> None:
    recorded = await rpc.ok("cstp.recordDecision", PARAMS["cstp.recordDecision"])
    reviewed = await rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"})
    assert reviewed["success"] is True


async def mcp_tools(client: AppClient, token: str) -> list[str]:
    response = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Host": "127.0.0.1",
        },
    )
    assert response.status_code == 200, response.text
    return sorted(tool["name"] for tool in response.json()["result"]["tools"])


async def test_mcp_lists_only_the_tools_a_token_may_call(client: AppClient) -> None:
    with_role(client, "token-auditor", "auditor")
    with_role(client, "token-monitor", "monitor")
    assert await mcp_tools(client, "token-alice") == sorted(
        op.tool for op in REGISTRY.tools() if op.tool and set(op.scopes) & ROLES["agent"]
    )
    assert await mcp_tools(client, "token-auditor") == sorted(
        op.tool for op in REGISTRY.tools() if op.tool and set(op.scopes) & ROLES["auditor"]
    )
    assert await mcp_tools(client, "token-monitor") == []
