"""Shared fixtures: a fresh migrated database per test (SQLite file or Postgres database, by
CSTP_TEST_DATABASE_URL), the real embedder loaded once, and an async client on the real app."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from app.asgi import create_app
from app.config import Settings
from app.db import migrate
from app.search.embedder import Embedder, load_default_embedder
from support.app import SEED_DECISION, AppClient, Rpc, serve_app, settings_in
from support.databases import PG_URL, USE_PG, copy_database, pg_admin_dsn, with_db
from support.processes import ChromaServer


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return load_default_embedder()


@pytest.fixture
def commands_share_the_model(monkeypatch: pytest.MonkeyPatch, embedder: Embedder) -> None:
    """A ``cstp`` command run in this process (click's CliRunner) builds its services with
    the session's embedding model instead of loading a copy of its own: the same packaged
    model, loaded the same way, and the load was half a second of every command. (Loading
    it is tested in test_embedder, and by the commands run as processes.)"""
    monkeypatch.setattr("app.services.load_default_embedder", lambda **_: embedder)


@pytest.fixture(scope="session")
async def template_db(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A migrated database that each test copies: a SQLite file, or a Postgres template."""
    if USE_PG:
        name = f"cstp_tpl_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        url = with_db(PG_URL, name)
        await migrate.upgrade(url)
        yield name
        conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
    else:
        path = tmp_path_factory.mktemp("template") / "template.db"
        await migrate.upgrade(f"sqlite+aiosqlite:///{path}")
        yield str(path)


@pytest.fixture
async def database_url(template_db: str, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh database at the newest migration, dropped after the test."""
    async with copy_database(template_db, tmp_path) as url:
        yield url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return settings_in(tmp_path, database_url)


@pytest.fixture
async def client(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as http:
        yield http


@pytest.fixture
def rpc(client: AppClient) -> Rpc:
    return Rpc(client)


# One app for a whole module, for the tests that need no fresh database: each of them
# passes whatever the module's other tests wrote before it (they count nothing, list nothing
# they did not write themselves) and leaves the app as it found it (no registry, setting or
# service changed). A test that counts rows, or changes the app, takes ``client``/``rpc``.


@pytest.fixture(scope="module")
async def shared_settings(
    template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Settings]:
    folder = tmp_path_factory.mktemp("shared")
    async with copy_database(template_db, folder) as url:
        yield settings_in(folder, url)


@pytest.fixture(scope="module")
async def shared_client(shared_settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    app = create_app(shared_settings, embedder=embedder)
    async with serve_app(app) as http:
        yield http


@pytest.fixture(scope="module")
def shared_rpc(shared_client: AppClient) -> Rpc:
    return Rpc(shared_client)


@pytest.fixture(scope="module")
def shared_services(shared_client: AppClient) -> Any:
    return shared_client.app.state.services


@pytest.fixture
def services(client: AppClient) -> Any:
    return client.app.state.services


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


@pytest.fixture
def chroma_server(tmp_path: Path, free_port: int) -> Iterator[ChromaServer]:
    """A Chroma server for the test (not started: call ``start()``); always killed after."""
    server = ChromaServer(tmp_path / "chroma-server", free_port)
    try:
        yield server
    finally:
        server.stop()


# What a test needs, by the fixtures it uses: the markers say what it costs, so a run can
# choose (`-m "not slow"`, `-m "not postgres"`), and tests/unit stays free of all of them.
COSTLY_FIXTURES = {
    "embedder": "model",  # the real embedding model
    "chroma_server": "chroma",  # a Chroma server process
    "template_db": "postgres" if USE_PG else None,  # a database server
}
UNIT_FORBIDDEN = {
    "embedder",
    "chroma_server",
    "template_db",
    "client",
    "shared_client",
    "free_port",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, marker in COSTLY_FIXTURES.items():
            if marker and fixture in fixtures:
                item.add_marker(marker)
        if item.nodeid.startswith("tests/unit/") and fixtures & UNIT_FORBIDDEN:
            raise pytest.UsageError(
                f"{item.nodeid} is a unit test but uses {sorted(fixtures & UNIT_FORBIDDEN)}: "
                "move it to tests/integration (unit tests need no server, model, database "
                "server or subprocess)"
            )
