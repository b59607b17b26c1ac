"""Approvals on real ``cstp serve`` processes: the whole escalation over MCP with the official
SDK's client, the approver's command line (``cstp approvals``), and two server processes on
one Postgres database sharing every approval. Slow: real processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from click.testing import CliRunner, Result
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from test_approvals import MIGRATION, RULES

from app.cli import main
from support.databases import USE_PG
from support.processes import cstp_servers

pytestmark = pytest.mark.slow


async def cli(*args: str, env: dict[str, str | None]) -> Result:
    base = {"CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env={**base, **env})


async def token(database_url: str, agent: str, *options: str) -> str:
    made = await cli(
        "tokens",
        "create",
        "--agent",
        agent,
        *options,
        "--json",
        env={"CSTP_DATABASE_URL": database_url},
    )
    assert made.exit_code == 0, made.output
    secret: str = json.loads(made.stdout)["token"]
    return secret


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "approvals.yaml").write_text(RULES, encoding="utf-8")
    return folder


def server_settings(database_url: str, tmp_path: Path, rules: Path, n: int) -> dict[str, str]:
    return {
        "CSTP_DATABASE_URL": database_url,
        "CSTP_AUTH_TOKENS": "alice:token-alice",
        "CSTP_RATE_LIMITS": "default=100000/1",
        "CSTP_DATA_DIR": str(tmp_path / f"data{n}"),
        "CSTP_DECISIONS_DIR": str(tmp_path / f"decisions{n}"),
        "CSTP_GUARDRAILS_DIR": str(rules),
        "CSTP_LOG_LEVEL": "WARNING",
        "CSTP_AUDIT_KEY": "",
    }


@pytest.fixture
def one_server(database_url: str, tmp_path: Path, rules: Path) -> Iterator[str]:
    with cstp_servers(tmp_path, [server_settings(database_url, tmp_path, rules, 0)]) as bases:
        yield bases[0]


@asynccontextmanager
async def mcp_session(base: str, bearer: str) -> AsyncIterator[ClientSession]:
    client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {bearer}"}, timeout=httpx2.Timeout(60, read=120)
    )
    async with (
        client,
        streamable_http_client(f"{base}/mcp", http_client=client) as (r, w),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        yield session


async def tool(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


async def tool_error(session: ClientSession, name: str, arguments: dict[str, Any]) -> Any:
    result = await session.call_tool(name, arguments)
    assert result.is_error and result.structured_content is not None, result
    return result.structured_content["error"]


async def test_the_whole_escalation_over_mcp_and_the_approvers_command_line(
    one_server: str, database_url: str
) -> None:
    # alice may approve too, so that only the four-eyes rule stops her own decision
    alice = await token(database_url, "alice", "--scopes", "read,announce,record,approve")
    carol = await token(database_url, "carol", "--role", "approver")
    async with mcp_session(one_server, alice) as mine, mcp_session(one_server, carol) as theirs:
        first = await tool(mine, "announce_intent", MIGRATION)
        escalation = first["guardrailStatus"]["escalation"]
        assert first["guardrailStatus"]["allowed"] is False
        assert escalation["status"] == "pending"
        approval_id = escalation["approvalId"]
        own = await tool_error(mine, "decide_approval", {"id": approval_id, "verdict": "approve"})
        assert own["code"] == -32010
        listed = await tool(theirs, "list_approvals", {"status": "pending"})
        assert [a["id"] for a in listed["approvals"]] == [approval_id]
        decided = await tool(
            theirs, "decide_approval", {"id": approval_id, "verdict": "approve", "reason": "ok"}
        )
        assert decided["approval"]["status"] == "approved"
        again = await tool(mine, "announce_intent", MIGRATION)
        assert again["guardrailStatus"]["allowed"] is True
        assert again["guardrailStatus"]["escalation"]["status"] == "approved"
        twice = await tool_error(theirs, "decide_approval", {"id": approval_id, "verdict": "deny"})
        assert twice["code"] == -32008

        quick = {**MIGRATION, "correlationId": "quick-mcp", "metadata": {"quick": True}}
        asked = await tool(mine, "announce_intent", quick)
        quick_id = asked["guardrailStatus"]["escalation"]["approvalId"]
        await asyncio.sleep(1.2)
        got = await tool(mine, "get_approval", {"id": quick_id})
        assert got["approval"]["status"] == "expired"
        late = await tool(mine, "announce_intent", quick)
        assert late["guardrailStatus"]["allowed"] is False
        assert late["guardrailStatus"]["escalation"]["status"] == "expired"

        # the approver's command line: the same calls
        pending = {**MIGRATION, "correlationId": "cli-1"}
        cli_id = (await tool(mine, "announce_intent", pending))["guardrailStatus"]["escalation"][
            "approvalId"
        ]
    as_carol = {"CSTP_URL": one_server, "CSTP_TOKEN": carol}
    shown = await cli("approvals", "list", "--status", "pending", env=as_carol)
    assert shown.exit_code == 0, shown.output
    assert cli_id in shown.output and "1 of 1 approval(s)" in shown.output
    shown = await cli("approvals", "show", cli_id, env=as_carol)
    assert "status:" in shown.output and "pending" in shown.output
    denied = await cli("approvals", "deny", cli_id, "--reason", "Not now", env=as_carol)
    assert denied.exit_code == 0, denied.output
    assert "denied" in denied.output and "Not now" in denied.output
    again_cli = await cli("approvals", "approve", cli_id, env=as_carol)
    assert again_cli.exit_code != 0
    assert again_cli.output.count("\n") == 1 and "-32008" in again_cli.output
    own_cli = await cli(
        "approvals", "approve", cli_id, env={"CSTP_URL": one_server, "CSTP_TOKEN": alice}
    )
    assert own_cli.exit_code != 0 and "-32010" in own_cli.output


async def test_two_server_processes_share_every_approval(
    database_url: str, tmp_path: Path, rules: Path
) -> None:
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    carol = await token(database_url, "carol", "--role", "approver")
    settings = [server_settings(database_url, tmp_path, rules, n) for n in range(2)]
    with cstp_servers(tmp_path, settings) as (one, other):
        async with httpx.AsyncClient(timeout=60) as http:

            async def call(base: str, bearer: str, method: str, params: Any) -> Any:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                answer = await http.post(
                    f"{base}/cstp", json=body, headers={"Authorization": f"Bearer {bearer}"}
                )
                return answer.json()

            asked = await call(one, "token-alice", "cstp.announceIntent", MIGRATION)
            approval_id = asked["result"]["guardrailStatus"]["escalation"]["approvalId"]
            pending = await call(other, "token-alice", "cstp.announceIntent", MIGRATION)
            assert pending["result"]["guardrailStatus"]["escalation"]["status"] == "pending"
            decided = await call(
                other, carol, "cstp.decideApproval", {"id": approval_id, "verdict": "approve"}
            )
            assert decided["result"]["approval"]["status"] == "approved"
            twice = await call(
                one, carol, "cstp.decideApproval", {"id": approval_id, "verdict": "deny"}
            )
            assert twice["error"]["code"] == -32008
            for base in (one, other):
                again = await call(base, "token-alice", "cstp.announceIntent", MIGRATION)
                status = again["result"]["guardrailStatus"]
                assert status["allowed"] is True and status["escalation"]["status"] == "approved"
