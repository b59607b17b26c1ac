"""/mcp at the HTTP level, on the real app: what a stateless server answers to a method other
than POST (405, not a stream that never ends), and which Host and Origin values it serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from app.asgi import create_app
from app.config import Settings
from app.search.embedder import Embedder
from support.app import AppClient, serve_app

AUTH = {"Authorization": "Bearer token-alice"}
HOST = {"Host": "127.0.0.1:9991"}  # a name /mcp serves by default (loopback, any port)
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
async def mcp_client(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    async with serve_app(create_app(settings, embedder=embedder)) as http:
        yield http


async def answer(client: AppClient, method: str, headers: dict[str, str]) -> httpx.Response:
    """The whole answer, within a few seconds: an answer that does not end fails the test."""
    async with asyncio.timeout(10):
        return await client.request(method, "/mcp", headers=headers)


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT", "PATCH"])
async def test_a_method_other_than_post_is_405_at_once(mcp_client: AppClient, method: str) -> None:
    """GET asked for a server-to-client stream the server has nothing to send on: each held a
    socket and its memory for ever. The MCP specification lets a server that offers no stream
    answer 405; DELETE (ending a session) means nothing to a stateless server either."""
    headers = {**AUTH, **HOST, "Accept": "text/event-stream, application/json"}
    response = await answer(mcp_client, method, headers)
    assert response.status_code == 405, (method, response.status_code, response.text[:200])
    assert response.headers["allow"] == "POST"
    assert response.json()["error"] == "method_not_allowed"


async def test_get_without_a_token_is_still_401(mcp_client: AppClient) -> None:
    response = await answer(mcp_client, "GET", {**HOST, "Accept": "text/event-stream"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_post_still_answers_after_a_refused_get(mcp_client: AppClient) -> None:
    assert (await answer(mcp_client, "GET", {**AUTH, **HOST, **ACCEPT})).status_code == 405
    headers = {**AUTH, **HOST, **ACCEPT}
    async with asyncio.timeout(30):
        response = await mcp_client.post("/mcp", json=LIST_TOOLS, headers=headers)
    assert response.status_code == 200, response.text
    names = {tool["name"] for tool in response.json()["result"]["tools"]}
    assert "record_decision" in names
