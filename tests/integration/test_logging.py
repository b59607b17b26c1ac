"""What the server logs, read as an operator reads it: no caller can make a log line long,
and an outage is told in a line when it starts and one when it ends."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.search.embedder import Embedder
from support.app import AppClient, serve_app

AUTH = {"Authorization": "Bearer token-alice"}
MCP_HEADERS = {**AUTH, "Host": "127.0.0.1:9991", "Accept": "application/json, text/event-stream"}
HUGE = 600_000  # characters: a body still under the 1 MiB cap
LONGEST_LINE = 1_000


@pytest.fixture
async def app_client(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    """The real app with a budget of one listGuardrails call, to be rate limited."""
    limits = parse_rate_limits("default=100000/1,cstp.listGuardrails=1/600")
    app = create_app(replace(settings, rate_limits=limits), embedder=embedder)
    async with serve_app(app) as http:
        yield http


def longest(caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    """The longest line logged, as a log file would hold it (tracebacks included)."""
    lines = caplog.text.splitlines() or [""]
    line = max(lines, key=len)
    return len(line), line[:300]


async def test_no_caller_supplied_value_makes_a_log_line_long(
    app_client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A 600,000-character id (a call that works, one rate limited, one for an unknown method,
    a notification), a method name as long, a float id written with 600,000 digits, and the
    same over MCP: every log line stays short, and the call's line still names the call."""
    big = "i" * HUGE
    bodies: list[bytes] = [
        json.dumps({"jsonrpc": "2.0", "id": big, "method": "cstp.listGuardrails"}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": big, "method": "cstp.listGuardrails"}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": big, "method": "cstp.nope"}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "m" * HUGE}).encode(),
        json.dumps({"jsonrpc": "2.0", "method": "m" * HUGE}).encode(),
        b'{"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": 1.' + b"5" * HUGE + b"}",
    ]
    mcp_bodies: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": big, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": big,
            "method": "tools/call",
            "params": {"name": "list_decisions", "arguments": {"limit": 1}},
        },
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "t" * HUGE}},
        {"jsonrpc": "2.0", "method": "notifications/" + "n" * HUGE},
        {"jsonrpc": "2.0", "id": 3, "method": "x" * HUGE},
    ]
    with caplog.at_level(logging.INFO):
        for body in bodies:
            response = await app_client.post("/cstp", content=body, headers=AUTH)
            assert response.status_code in (200, 204), response.text[:200]
        for mcp_body in mcp_bodies:
            async with asyncio.timeout(60):
                response = await app_client.post("/mcp", json=mcp_body, headers=MCP_HEADERS)
            assert response.status_code < 500, response.text[:200]
    size, line = longest(caplog)
    assert size <= LONGEST_LINE, (size, line)
    calls = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "cstp.rpc" and r.getMessage().startswith("{")
    ]
    outcomes = [(c["face"], c["method"][:20], c["outcome"]) for c in calls]
    assert ("jsonrpc", "cstp.listGuardrails", "ok") in outcomes, outcomes
    assert ("jsonrpc", "cstp.listGuardrails", "-32002") in outcomes, outcomes  # rate limited
    assert ("jsonrpc", "cstp.nope", "-32601") in outcomes, outcomes
    limited = next(c for c in calls if c["outcome"] == "-32002")
    assert limited["id"].startswith("iiii") and len(limited["id"]) < 300, limited["id"][:300]
