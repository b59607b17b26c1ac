"""cstp.getSessionContext (SPEC.md, section 9): a brief within maxTokens counted with the
embedder's tokenizer, the same for the same stored state, markdown or JSON, stored and chained
as shown; over MCP also the prompt ``session_brief`` (the official SDK's client)."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner, Result
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from app.cli import main
from app.search.embedder import token_counter
from support.app import AppClient, Rpc
from support.databases import run_sql

pytestmark = pytest.mark.usefixtures("commands_share_the_model")
MCP_HOST = "http://127.0.0.1:9991"


async def cstp(url: str, *args: str) -> Result:
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def history(rpc: Rpc) -> list[str]:
    ids = []
    for n, (text, outcome) in enumerate(
        [
            ("Use PostgreSQL for the ledger instead of MongoDB", "success"),
            ("Adopt Redis streams for the order events", "failure"),
            ("Pick Kafka over RabbitMQ for the audit log shipping", "failure"),
            ("Choose blue-green deploys for the checkout service", "success"),
        ]
    ):
        made = await rpc.ok(
            "cstp.recordDecision",
            {"decision": text, "confidence": 0.6 + n / 10, "category": "architecture"},
        )
        await rpc.ok(
            "cstp.reviewDecision",
            {"id": made["id"], "outcome": outcome, "lessons": f"Lesson {n}: measure first"},
        )
        ids.append(made["id"])
    return ids


async def test_a_brief_within_budget_deterministic_and_stored(rpc: Rpc, database_url: str) -> None:
    ids = await history(rpc)
    params = {"task": "Choose a message broker for order events"}
    first = await rpc.ok("cstp.getSessionContext", params)
    text = first["context"]
    assert text.startswith("# Session brief for alice\nTask: Choose a message broker")
    assert "## Your calibration by category" in text and "architecture: 4 reviewed" in text
    assert "## Relevant past decisions" in text and "## Your recent failures" in text
    assert "## Guardrails in force" in text and "block production-needs-code-review" in text
    assert f"[{ids[1]}]" in text and "Lesson 1: measure first" in text
    count = token_counter()
    assert first["tokens"] == count(text) <= 1500
    second = await rpc.ok("cstp.getSessionContext", params)
    assert second["context"] == text and second["briefId"] != first["briefId"]

    small = await rpc.ok("cstp.getSessionContext", {**params, "maxTokens": 200})
    assert small["tokens"] == count(small["context"]) <= 200
    assert "left out to fit the token budget" in small["context"]

    data = await rpc.ok("cstp.getSessionContext", {**params, "format": "json"})
    brief = data["context"]
    assert brief["agent"] == "alice" and brief["task"] == params["task"]
    assert {d["id"] for d in brief["relevant"]} <= set(ids)
    assert [f["id"] for f in brief["recentFailures"]] == [ids[2], ids[1]]
    assert any(r["mode"] == "enforce" for r in brief["rules"])
    assert data["tokens"] == count(json.dumps(brief, ensure_ascii=False, separators=(",", ":")))

    rows = await run_sql(
        database_url, "SELECT id, agent, format, tokens, content FROM session_briefs"
    )
    stored = {r["id"]: r for r in rows}
    assert stored[first["briefId"]]["content"] == text
    assert stored[small["briefId"]]["tokens"] == small["tokens"]
    assert json.loads(stored[data["briefId"]]["content"]) == brief
    assert (await cstp(database_url, "audit", "verify")).exit_code == 0
    with pytest.raises(Exception, match="append-only"):
        await run_sql(database_url, "UPDATE session_briefs SET content = 'nothing to see'")
    bad = await rpc.error("cstp.getSessionContext", {"maxTokens": 100})
    assert bad["code"] == -32602


async def test_the_session_brief_prompt_over_mcp(client: AppClient, rpc: Rpc) -> None:
    await history(rpc)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=client.app),
                base_url=MCP_HOST,
                headers={"Authorization": "Bearer token-alice"},
                timeout=httpx2.Timeout(60),
            )
        )
        read, write = await stack.enter_async_context(
            streamable_http_client(f"{MCP_HOST}/mcp", http_client=http)
        )
        session: Any = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        prompts = (await session.list_prompts()).prompts
        assert [p.name for p in prompts] == ["session_brief"]
        got = await session.get_prompt(
            "session_brief", {"task": "Pick a broker", "maxTokens": "400"}
        )
        text = got.messages[0].content.text
        assert text.startswith("# Session brief for alice\nTask: Pick a broker")
        assert token_counter()(text) <= 400
        tool = await session.call_tool("get_session_context", {"format": "json"})
        assert not tool.is_error and tool.structured_content["context"]["agent"] == "alice"
