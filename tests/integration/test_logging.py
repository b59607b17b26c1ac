"""What the server logs, read as an operator reads it: no caller can make a log line long,
and an outage is told in a line when it starts and one when it ends."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.db.outbox import OutboxEvent
from app.outbox import admin
from app.search.embedder import Embedder
from support.app import AppClient, Rpc, serve_app
from support.processes import ChromaServer
from support.waiting import poll_until

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


# ---------------------------------------------------------------- noise


async def test_an_mcp_request_logs_nothing_at_info_but_its_call(
    app_client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Every /mcp request logged 'Terminating session: None' (the SDK's stateless transport
    ending), at the server's default level."""
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "list_decisions", "arguments": {"limit": 1}},
    }
    with caplog.at_level(logging.INFO):
        for body in ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, call):
            async with asyncio.timeout(60):
                response = await app_client.post("/mcp", json=body, headers=MCP_HEADERS)
            assert response.status_code == 200, response.text
    # At INFO and above: what a server at its default level writes (an earlier test may have
    # left a library's logger at DEBUG, whose records the capture then holds too).
    server_lines = [
        (r.name, r.getMessage())
        for r in caplog.records
        if r.levelno >= logging.INFO and not r.name.startswith("httpx")
    ]
    assert len(server_lines) == 1, server_lines  # the tool call's line; tools/list runs none
    assert server_lines[0][0] == "cstp.rpc"
    assert json.loads(server_lines[0][1])["method"] == "cstp.listDecisions"


def params(text: str) -> dict[str, Any]:
    return {"decision": text, "confidence": 0.7, "category": "architecture"}


TEXTS = (
    "Move the billing queue from RabbitMQ to Kafka",
    "Retire the legacy SOAP gateway for partners",
    "Shard the user table by tenant id",
    "Adopt feature flags for the mobile release",
)
QUERIES = 10


@pytest.mark.slow
async def test_an_index_outage_is_a_line_when_it_starts_and_one_when_it_ends(
    settings: Settings,
    embedder: Embedder,
    chroma_server: ChromaServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Chroma server is killed while decisions are recorded and searched, the outbox
    retries their index events, and it comes back. Each failed index call logged a warning
    (1,066 lines in a 4.5-minute outage), each retried event another, and each of Chroma's
    HTTP requests a line at INFO. Now: the index says once that it cannot be reached and
    once that it answers again, with how many calls failed meanwhile; the outbox likewise for
    its events; Chroma's requests are not logged."""
    await asyncio.to_thread(chroma_server.start)
    app = create_app(replace(settings, chroma_url=chroma_server.url), embedder=embedder)
    services = app.state.services
    async with serve_app(app) as client:
        rpc = Rpc(client)
        with caplog.at_level(logging.INFO):
            first = await rpc.ok("cstp.recordDecision", params("Use Chroma as the vector index"))
            assert first["indexed"] is True
            await asyncio.to_thread(chroma_server.stop)
            answers = [await rpc.ok("cstp.recordDecision", params(t)) for t in TEXTS]
            assert not any(a["indexed"] for a in answers), answers
            ids = [a["id"] for a in answers]
            for n in range(QUERIES):
                await rpc.call("cstp.queryDecisions", {"query": f"{TEXTS[n % 4]} {n}"})

            async def retried() -> tuple[bool, Any]:
                async with services.db.transaction(write=False) as session:
                    rows = await session.scalars(
                        select(OutboxEvent.attempts).where(
                            OutboxEvent.decision_id.in_(ids), OutboxEvent.kind == "index"
                        )
                    )
                    tries = list(rows)
                return len(tries) == len(ids) and min(tries) >= 3, tries

            await poll_until(
                retried, 60, "every waiting index event tried three times", interval=0.2
            )
            await asyncio.to_thread(chroma_server.start)

            async def drained() -> tuple[bool, Any]:
                counts = await admin.counts(services)
                return counts["pending"] == 0, counts

            await poll_until(drained, 60, "the outbox drained", interval=0.2)
            found = await rpc.ok("cstp.queryDecisions", {"query": TEXTS[0], "limit": 3})
            assert ids[0] in [d["id"] for d in found["decisions"]]

    chroma_requests = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("httpx") and chroma_server.url in r.getMessage()
    ]
    assert chroma_requests == [], chroma_requests[:3]
    index_lines = [r for r in caplog.records if r.name == "app.search.chroma"]
    assert [r.levelname for r in index_lines] == ["WARNING", "WARNING"], [
        r.getMessage() for r in index_lines[:5]
    ]
    down, back = (r.getMessage() for r in index_lines)
    assert "cannot be reached" in down, down
    failed_calls = re.search(r"answers again after (\d+) failed call", back)
    assert failed_calls and int(failed_calls[1]) >= len(TEXTS) + QUERIES, back
    outbox_lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "cstp.outbox" and r.levelno >= logging.WARNING
    ]
    assert len(outbox_lines) == 2, outbox_lines[:5]
    assert outbox_lines[0].startswith("outbox: index events wait"), outbox_lines
    attempts = re.search(r"index works again after (\d+) failed attempt", outbox_lines[1])
    assert attempts and int(attempts[1]) >= 3 * len(ids), outbox_lines[1]
