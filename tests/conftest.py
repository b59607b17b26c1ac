"""Shared fixtures: a fresh migrated database per test (SQLite file or Postgres database, by
CSTP_TEST_DATABASE_URL), the real embedder loaded once, and an async client on the real app."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from litestar import Litestar
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.db import migrate
from app.search.embedder import Embedder, load_default_embedder

PG_URL = os.environ.get("CSTP_TEST_DATABASE_URL", "")
USE_PG = PG_URL.startswith("postgresql")
TOKENS = {"token-alice": "alice", "token-bob": "bob"}


def _pg_admin_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return load_default_embedder()


@pytest.fixture(scope="session")
async def template_db(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A migrated database that each test copies: a SQLite file, or a Postgres template."""
    if USE_PG:
        name = f"cstp_tpl_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(_pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        url = _with_db(PG_URL, name)
        await migrate.upgrade(url)
        yield name
        conn = await asyncpg.connect(_pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
    else:
        path = tmp_path_factory.mktemp("template") / "template.db"
        await migrate.upgrade(f"sqlite+aiosqlite:///{path}")
        yield str(path)


@asynccontextmanager
async def copy_database(template_db: str, folder: Path) -> AsyncIterator[str]:
    """A fresh database copied from the migrated template (dropped afterwards on Postgres)."""
    if USE_PG:
        name = f"cstp_t_{uuid.uuid4().hex[:12]}"
        conn = await asyncpg.connect(_pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        finally:
            await conn.close()
        try:
            yield _with_db(PG_URL, name)
        finally:
            conn = await asyncpg.connect(_pg_admin_dsn(PG_URL))
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()
    else:
        path = folder / "cstp.db"
        shutil.copyfile(template_db, path)
        yield f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def database_url(template_db: str, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh database at the newest migration, dropped after the test."""
    async with copy_database(template_db, tmp_path) as url:
        yield url


async def run_sql(url: str, statement: str, **params: Any) -> list[dict[str, Any]]:
    """One statement on its own connection, as an auditor would run it."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement), params)
            return [dict(row._mapping) for row in result] if result.returns_rows else []
    finally:
        await engine.dispose()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        decisions_dir=tmp_path / "decisions",
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


@pytest.fixture
async def client(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as http:
        yield http


@pytest.fixture
def rpc(client: AppClient) -> Rpc:
    return Rpc(client)


@pytest.fixture
def services(client: AppClient) -> Any:
    return client.app.state.services


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


@pytest.fixture
def seed_decision() -> dict[str, Any]:
    return dict(SEED_DECISION)


@pytest.fixture
def free_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


def wait_until_up(
    proc: subprocess.Popen[bytes], url: str, timeout: float, log: Callable[[], str] = lambda: ""
) -> None:
    """Poll ``url`` until it answers 200. RuntimeError (with the tail of ``log()``) when
    ``proc`` exits first or ``timeout`` runs out; the caller stops ``proc``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}\n{log()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s\n{log()}")


class ChromaServer:
    """A ``chroma run`` child process on a loopback port, that tests kill (SIGKILL) and start
    again on the same path and port."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("chroma")),
                "run",
                "--path",
                str(self.path),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until_up(self.proc, f"{self.url}/api/v2/heartbeat", timeout)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGKILL to the server and its children (its own session)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def chroma_server(tmp_path: Path, free_port: int) -> Iterator[ChromaServer]:
    """A Chroma server for the test (not started: call ``start()``); always killed after."""
    server = ChromaServer(tmp_path / "chroma-server", free_port)
    try:
        yield server
    finally:
        server.stop()
