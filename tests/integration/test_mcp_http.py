"""/mcp at the HTTP level, on the real app: what a stateless server answers to a method other
than POST (405, not a stream that never ends), and which Host and Origin values it serves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

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


# ---------------------------------------------------------------- Host and Origin


async def post_with(client: AppClient, headers: dict[str, str]) -> int:
    async with asyncio.timeout(30):
        response = await client.post("/mcp", json=LIST_TOOLS, headers={**AUTH, **ACCEPT, **headers})
    return response.status_code


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:9401@evil.com",  # userinfo: a served name and port, then another host
        "localhost:abc",  # a port must be digits
        "localhost:",
        "localhost:80:80",
        "localhost:+80",
        "localhost.evil.com",
        "127.0.0.1.evil.com:9991",
        "[::1]evil:80",
        "evil.example",
        "",
    ],
)
async def test_a_host_that_is_not_a_served_name_and_port_is_421(
    mcp_client: AppClient, host: str
) -> None:
    assert await post_with(mcp_client, {"Host": host}) == 421, host


@pytest.mark.parametrize(
    "host", ["127.0.0.1:9991", "127.0.0.1", "localhost:80", "LocalHost:8080", "[::1]:9991"]
)
async def test_the_loopback_names_are_served_on_any_port(mcp_client: AppClient, host: str) -> None:
    assert await post_with(mcp_client, {"Host": host}) == 200, host


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://127.0.0.1:9991", 200),
        ("https://localhost", 200),
        ("http://localhost:abc", 403),
        ("http://127.0.0.1:9401@evil.com", 403),
        ("http://evil.example", 403),
        ("null", 403),
        ("ftp://localhost", 403),
    ],
)
async def test_an_origin_is_checked_as_strictly(
    mcp_client: AppClient, origin: str, status: int
) -> None:
    assert await post_with(mcp_client, {**HOST, "Origin": origin}) == status, origin


async def test_a_refused_host_is_421_before_the_method_is_looked_at(mcp_client: AppClient) -> None:
    response = await answer(mcp_client, "GET", {**AUTH, "Host": "localhost:abc"})
    assert response.status_code == 421


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("cstp.example.com:443", 200),
        ("cstp.example.com", 421),  # listed with a port: that port only
        ("cstp.example.com:8443", 421),
        ("10.0.0.5:8080", 200),  # listed as 10.0.0.5:*: any port
        ("10.0.0.5", 200),
        ("10.0.0.5:80x", 421),
        ("other.example:9991", 200),  # listed without a port: any port
        ("127.0.0.1:9991", 421),  # the list replaces the loopback names
    ],
)
async def test_configured_hosts(
    settings: Settings, embedder: Embedder, host: str, status: int
) -> None:
    hosts = ("cstp.example.com:443", "10.0.0.5:*", "other.example")
    app = create_app(replace(settings, mcp_allowed_hosts=hosts), embedder=embedder)
    async with serve_app(app) as client:
        assert await post_with(client, {"Host": host}) == status, host
