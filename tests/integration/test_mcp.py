"""The MCP face, driven by the official SDK's clients against a real ``cstp serve``: over
Streamable HTTP at /mcp, and through ``cstp mcp`` spawned as a stdio server. The agent is
always the token's; rate limits, audit rows and errors are those of /cstp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from app.asgi import build_registry
from app.rpc.discover import build_document
from support.databases import run_sql
from support.processes import wait_until_up

# Slow: a real `cstp serve` per test, driven by the MCP SDK's clients:
# the fast loop (-m "not slow") leaves it out.
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TOOLS = [
    "announce_intent",
    "check_drift",
    "check_guardrails",
    "decide_approval",
    "get_approval",
    "get_calibration",
    "get_decision",
    "get_session_context",
    "list_approvals",
    "list_decisions",
    "list_guardrails",
    "query_decisions",
    "ready",
    "record_decision",
    "review_decision",
]
ANNOUNCE_BUDGET = 4


@dataclass
class Server:
    url: str
    log: Path

    @property
    def mcp(self) -> str:
        return f"{self.url}/mcp"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """``cstp serve`` in a process of its own, two agents' tokens, a small announce budget."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    env.update(
        CSTP_DATABASE_URL=database_url,
        CSTP_DATA_DIR=str(tmp_path / "data"),
        CSTP_DECISIONS_DIR=str(tmp_path / "decisions"),
        CSTP_AUTH_TOKENS="alice:token-alice,bob:token-bob",
        CSTP_RATE_LIMITS=f"default=1000/60,cstp.announceIntent={ANNOUNCE_BUDGET}/600",
        CSTP_LOG_LEVEL="WARNING",
    )
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "cstp"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        wait_until_up(proc, f"http://127.0.0.1:{port}/ready", 120, lambda: log.read_text()[-3000:])
        yield Server(f"http://127.0.0.1:{port}", log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@asynccontextmanager
async def http_session(server: Server, token: str) -> AsyncIterator[ClientSession]:
    client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120)
    )
    async with (
        client,
        streamable_http_client(server.mcp, http_client=client) as (r, w),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(
    server: Server, token: str, transcript: Path | None = None
) -> AsyncIterator[ClientSession]:
    """``cstp mcp`` spawned by the SDK's stdio client; with ``transcript``, a copy of all it
    writes on stdout (through ``tee``), for the test to read afterwards."""
    cstp = str(BIN / "cstp")
    if transcript is None:
        command, args = cstp, ["mcp"]
    else:
        command, args = "sh", ["-c", f'"{cstp}" mcp | tee "{transcript}"']
    params = StdioServerParameters(
        command=command,
        args=args,
        env={"CSTP_URL": server.url, "CSTP_TOKEN": token, "PATH": os.environ["PATH"]},
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result
    assert result.structured_content is not None
    assert result.content and result.content[0].type == "text"
    return dict(result.structured_content)


async def error_of(session: ClientSession, tool: str, arguments: dict[str, Any]) -> Any:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    assert result.structured_content is not None
    error = result.structured_content["error"]
    assert result.content[0].text.startswith(f"Error {error['code']} ")  # type: ignore[union-attr]  # a text block
    return error


async def the_same_calls(
    session: ClientSession,
    server: Server,
    database_url: str,
    correlation_id: str,
    listed: list[str],
) -> None:
    """List the tools, announce, record with the correlationId, find it, check the rows."""
    tools = (await session.list_tools()).tools
    assert sorted(t.name for t in tools) == listed
    document = build_document(build_registry())
    discover = {m["name"]: m for m in document.methods}
    by_name = {t.name: t for t in tools}
    record = by_name["record_decision"]
    assert set(record.input_schema["required"]) == {"decision", "confidence", "category"}
    assert set(record.input_schema["properties"]) == {
        p["name"] for p in discover["cstp.recordDecision"]["params"]
    }
    assert record.description and "confidence" in record.description
    assert by_name["announce_intent"].output_schema is not None

    announced = await call(
        session,
        "announce_intent",
        {
            "intent": "Deploy the billing service to production",
            "stakes": "high",
            "confidence": 0.8,
            "correlationId": correlation_id,
            "agent": {"id": "bob"},  # informational: the token's agent is the one recorded
        },
    )
    assert announced["correlationId"] == correlation_id
    assert announced["guardrailStatus"]["evaluated"] >= 1
    recorded = await call(
        session,
        "record_decision",
        {
            "decision": "Deploy billing on Tuesday behind a feature flag",
            "confidence": 0.8,
            "category": "architecture",
            "correlationId": correlation_id,
            "agent": "bob",
        },
    )
    assert recorded["indexed"] is True
    found = await call(session, "query_decisions", {"query": "deploy billing feature flag"})
    assert recorded["id"] in [d["id"] for d in found["decisions"]]
    assert found["agent"] == "alice"

    intents = await run_sql(
        database_url, "SELECT agent FROM intents WHERE correlation_id = :c", c=correlation_id
    )
    assert intents == [{"agent": "alice"}]
    decisions = await run_sql(
        database_url,
        "SELECT recorded_by, correlation_id FROM decisions WHERE id = :id",
        id=recorded["id"],
    )
    assert decisions == [{"recorded_by": "alice", "correlation_id": correlation_id}]

    invalid = await error_of(
        session, "record_decision", {"decision": "x", "confidence": 1.5, "category": "architecture"}
    )
    assert invalid == {
        "code": -32602,
        "message": "Invalid params",
        "data": {"field": "confidence", "error": "must be between 0.0 and 1.0"},
    }
    missing = await error_of(session, "get_decision", {"id": "0badcafe"})
    assert missing["code"] == -32007 and missing["data"] == {"id": "0badcafe"}
    conflict = await error_of(
        session, "announce_intent", {"intent": "Something else", "correlationId": correlation_id}
    )
    assert conflict["code"] == -32008 and conflict["data"] == {"correlationId": correlation_id}


async def test_mcp_over_streamable_http(server: Server, database_url: str) -> None:
    async with http_session(server, "token-alice") as session:
        # over HTTP, only the tools an agent's token may call (no approver's tools)
        agents = [t for t in TOOLS if t not in ("decide_approval", "list_approvals")]
        await the_same_calls(session, server, database_url, "mcp-http-1", agents)


async def test_mcp_over_stdio_forwards_to_the_running_server(
    server: Server, database_url: str, tmp_path: Path
) -> None:
    transcript = tmp_path / "stdout.jsonl"
    async with stdio_session(server, "token-alice", transcript) as session:
        # stdio lists every tool; the server it forwards to checks each call's scope
        await the_same_calls(session, server, database_url, "mcp-stdio-1", TOOLS)
        # the session brief prompt, forwarded: the brief the server stored is what came back
        prompt = await session.get_prompt("session_brief", {"task": "Pick a queue"})
        text = prompt.messages[0].content.text  # type: ignore[union-attr]  # a text block
        assert text.startswith("# Session brief for alice\nTask: Pick a queue")
        stored = await run_sql(database_url, "SELECT content FROM session_briefs")
        assert [r["content"] for r in stored] == [text]
    # Nothing but protocol on stdout: every line a JSON-RPC message (the SDK's client would
    # skip a stray line and go on, so it is checked here).
    lines = transcript.read_text().splitlines()
    assert len(lines) >= 8, lines
    for line in lines:
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", line


async def test_mcp_refuses_a_body_over_the_cap_as_cstp_does(server: Server) -> None:
    """The same body cap on both faces (CSTP_MAX_BODY_BYTES, 1 MiB by default): 413."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "announce_intent", "arguments": {"intent": "x" * (1 << 20)}},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": "Bearer token-alice",
    }
    async with httpx.AsyncClient(timeout=60) as client:
        mcp = await client.post(server.mcp, json=body, headers=headers)
        cstp = await client.post(f"{server.url}/cstp", json=body, headers=headers)
    assert mcp.status_code == cstp.status_code == 413, (mcp.text, cstp.text)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
async def test_a_number_json_cannot_hold_is_refused_over_mcp_too(
    server: Server, database_url: str, number: str
) -> None:
    """/cstp refuses NaN and Infinity as invalid JSON (-32700); the MCP SDK's parser reads
    them (and 1e400 as infinity), so the tools refuse them as params (-32602), and the failed
    announcement's audit row holds the number's name as text (a json column takes no NaN)."""
    body = (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
        '"announce_intent", "arguments": {"intent": "Tune the cache", "metadata": {"load": '
        f"{number}}}}}}}}}"
    )
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": "Bearer token-alice",
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(server.mcp, content=body, headers=headers)
    assert response.status_code == 200, response.text
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    answer = json.loads(data[0] if data else response.text)
    result = answer["result"]
    assert result["isError"] is True, answer
    error = result["structuredContent"]["error"]
    assert error["code"] == -32602, error
    assert error["data"] == {
        "field": "metadata.load",
        "error": "holds a number that is not finite (NaN or Infinity)",
    }
    (row,) = await run_sql(
        database_url, "SELECT outcome, error_code, metadata FROM intents WHERE agent = 'alice'"
    )
    metadata = row["metadata"] if isinstance(row["metadata"], dict) else json.loads(row["metadata"])
    assert (row["outcome"], row["error_code"]) == ("failed", -32602)
    assert metadata == {"load": "NaN" if number == "NaN" else "Infinity"}


async def test_mcp_without_a_valid_token_is_401_as_cstp_is(server: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as client:
        for auth in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "token-alice"}):
            mcp = await client.post(server.mcp, json=body, headers={**headers, **auth})
            cstp = await client.post(f"{server.url}/cstp", json=body, headers={**headers, **auth})
            assert mcp.status_code == cstp.status_code == 401, auth
            assert mcp.headers["www-authenticate"] == cstp.headers["www-authenticate"]
            assert mcp.json() == cstp.json()


async def test_mcp_refuses_a_host_it_does_not_serve(server: Server) -> None:
    """DNS-rebinding protection: a page in a browser cannot reach /mcp through a name that
    resolves to this machine; the names it serves are CSTP_MCP_ALLOWED_HOSTS."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": "Bearer token-alice",
    }
    async with httpx.AsyncClient() as client:
        evil = await client.post(server.mcp, json=body, headers={**headers, "Host": "evil.example"})
        assert evil.status_code == 421
        local = await client.post(server.mcp, json=body, headers=headers)
        assert local.status_code == 200, local.text


async def test_one_announce_budget_across_cstp_and_mcp(server: Server) -> None:
    async def over_cstp(n: int) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{server.url}/cstp",
                headers={"Authorization": "Bearer token-alice"},
                json={
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "cstp.announceIntent",
                    "params": {"intent": f"Add cache number {n}"},
                },
            )
        answer: dict[str, Any] = response.json()
        return answer

    async with http_session(server, "token-alice") as session:
        for n in range(ANNOUNCE_BUDGET):
            if n % 2:
                assert "result" in await over_cstp(n)
            else:
                await call(session, "announce_intent", {"intent": f"Add cache number {n}"})
        limited = await error_of(session, "announce_intent", {"intent": "One more"})
        assert limited["code"] == -32002 and limited["data"]["retryAfterMs"] > 0
        assert (await over_cstp(99))["error"]["code"] == -32002
    async with http_session(server, "token-bob") as session:  # bob has a budget of his own
        await call(session, "announce_intent", {"intent": "Bob's own cache"})


def test_cstp_mcp_with_a_refused_token_says_so_in_one_line(server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    done = subprocess.run(
        [str(BIN / "cstp"), "mcp"],
        env={**env, "CSTP_URL": server.url, "CSTP_TOKEN": "nope"},
        input=b"",
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == b""
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "refused the token" in lines[0], lines


def test_tools_match_the_operation_table() -> None:
    """Without a server: every operation but rpc.discover is a tool, with its description."""
    from app.mcp.tools import tool_list

    registry = build_registry()
    tools = tool_list(registry)
    assert sorted(t.name for t in tools) == TOOLS
    assert all(t.description and len(t.description) > 80 for t in tools)
    # Each input schema is rpc.discover's params schema (the same JSON Schema, refs aside), but
    # for announce_intent's informational agent: on MCP the agent is never an argument.
    document = build_document(registry)
    components = document.components["schemas"]
    discover = {m["name"]: m for m in document.methods}
    by_tool = {op.tool: op for op in registry.tools()}

    def inlined(schema: Any, defs: dict[str, Any]) -> Any:
        """``schema`` with every ref replaced by what it names (none of ours recurse)."""
        if isinstance(schema, list):
            return [inlined(item, defs) for item in schema]
        if not isinstance(schema, dict):
            return schema
        if "$ref" in schema:
            return inlined(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: inlined(v, defs) for k, v in schema.items() if k != "$defs"}

    for tool in tools:
        method = discover[by_tool[tool.name].name]
        offered = inlined(tool.input_schema, tool.input_schema.get("$defs", {}))
        published = {p["name"]: inlined(p["schema"], components) for p in method["params"]}
        left_out = {"agent"} if tool.name == "announce_intent" else set()
        assert offered["properties"] == {k: v for k, v in published.items() if k not in left_out}, (
            tool.name
        )
        required = {p["name"] for p in method["params"] if p.get("required")}
        assert set(offered.get("required", [])) == required, tool.name
        assert inlined(tool.output_schema, (tool.output_schema or {}).get("$defs", {})) == (
            inlined(method["result"]["schema"], components)
        ), tool.name
    announce = next(t for t in tools if t.name == "announce_intent")
    assert "agent" not in announce.input_schema["properties"]
    assert "agent" in {p["name"] for p in discover["cstp.announceIntent"]["params"]}
