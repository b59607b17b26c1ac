"""The real app in the test's own event loop: an HTTP client wired into it, its lifespan run
around the client, and a JSON-RPC caller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from litestar import Litestar

from app.config import Settings, parse_rate_limits
from app.scopes import ROLES, Principal

TOKENS = {"token-alice": "alice", "token-bob": "bob"}


def settings_in(folder: Path, database_url: str) -> Settings:
    """The tests' settings: data and decision files under ``folder``, the test tokens, a
    budget no test reaches, a quick relay loop."""
    return Settings(
        data_dir=folder / "data",
        database_url=database_url,
        decisions_dir=folder / "decisions",
        auth_tokens=TOKENS,
        rate_limits=parse_rate_limits("default=100000/1"),
        outbox_poll_seconds=0.2,
    )


class AppClient(httpx.AsyncClient):
    """An HTTP client wired straight into the app, in the test's own event loop.

    Litestar's AsyncTestClient runs the app's lifespan in a second event loop (a blocking
    portal thread); asyncpg connections are bound to one loop, so tests that also use the
    app's services directly would mix loops. This client runs everything in one loop.
    """

    def __init__(self, app: Litestar) -> None:
        super().__init__(transport=httpx.ASGITransport(app=app), base_url="http://testserver.local")
        self.app = app


@asynccontextmanager
async def serve_app(app: Litestar) -> AsyncIterator[AppClient]:
    """Run ``app``'s lifespan (relay loop, shutdown) around a client for it.

    The lifespan lives in a task of its own: its cancel scope must be entered and left by
    the same task, which a fixture's setup and teardown are not.
    """
    started, stop = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    task = asyncio.create_task(run())
    await asyncio.wait(
        [task, asyncio.create_task(started.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    try:
        async with AppClient(app) as http:
            yield http
    finally:
        stop.set()
        await task


@dataclass
class Rpc:
    """A JSON-RPC caller over the real HTTP app."""

    client: AppClient
    token: str = "token-alice"

    async def raw(self, body: Any, token: str | None = None) -> Any:
        response = await self.client.post(
            "/cstp", json=body, headers={"Authorization": f"Bearer {token or self.token}"}
        )
        return response

    async def call(self, method: str, params: Any = None, token: str | None = None) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": 1}
        if params is not None:
            body["params"] = params
        response = await self.raw(body, token)
        assert response.status_code == 200, response.text
        return response.json()

    async def ok(self, method: str, params: Any = None, token: str | None = None) -> Any:
        answer = await self.call(method, params, token)
        assert "result" in answer, answer
        return answer["result"]

    async def error(self, method: str, params: Any = None, token: str | None = None) -> Any:
        answer = await self.call(method, params, token)
        assert "error" in answer, answer
        return answer["error"]


SEED_DECISION: dict[str, Any] = {
    "decision": "Use PostgreSQL for agent memory storage",
    "confidence": 0.85,
    "category": "architecture",
    "stakes": "high",
    "context": "Choosing database for long-term agent memory",
    "reasons": [
        {"type": "analysis", "text": "ACID compliance needed for consistency", "strength": 0.9},
        {"type": "pattern", "text": "Similar to prior successful database choice", "strength": 0.7},
    ],
    "kpiIndicators": ["latency", "consistency"],
    "mentalState": "deliberate",
    "reviewIn": "30d",
    "tags": ["database", "infrastructure"],
    "preDecision": {
        "queryRun": True,
        "similarFound": 2,
        "guardrailsChecked": True,
        "guardrailsPassed": True,
    },
}


def add_token(
    client: AppClient, token: str, agent: str, role: str, workspace: str = "default"
) -> str:
    """Let ``token`` into ``client``'s app as ``agent`` of ``workspace`` with ``role``'s
    scopes (the configuration's tokens are all role ``agent`` in ``default``); returns the
    token."""
    principal = Principal(agent, workspace=workspace, role=role, scopes=ROLES[role])
    client.app.state.tokens.add(token, principal)
    return token
