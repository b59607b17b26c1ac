"""Auth, health, readiness, the agent card, tokens at start-up, and migrations."""

from __future__ import annotations

import gc
import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.asgi import create_app, serving_app
from app.config import ConfigError, Settings
from app.db import migrate
from app.outbox import admin
from support.app import serve_app

BODY = {"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": 1}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dG9rZW4tYWxpY2U="},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "token-alice"},
    ],
)
async def test_bad_or_missing_token_is_401_before_the_body(
    shared_client: Any, headers: dict[str, str]
) -> None:
    response = await shared_client.post("/cstp", content=b"not even json", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"] == "unauthorized"


async def test_each_token_maps_to_its_agent(shared_rpc: Any, seed_decision: dict[str, Any]) -> None:
    seed_decision["agent"] = {"id": "mallory"}  # informational, never trusted
    first = await shared_rpc.ok("cstp.recordDecision", seed_decision, token="token-bob")
    found = await shared_rpc.ok("cstp.getDecision", {"id": first["id"]})
    assert found["decision"]["recordedBy"] == "bob"


async def test_health(shared_client: Any) -> None:
    response = await shared_client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "healthy" and body["version"] and body["uptimeSeconds"] >= 0


async def test_ready_when_everything_is_up(client: Any) -> None:
    response = await client.get("/ready")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == "ok" and body["checks"]["schema"] == "ok"
    assert body["checks"]["outbox"]["pending"] == 0


async def test_ready_is_degraded_not_unready_while_an_event_is_dead(
    client: Any, rpc: Any, services: Any, seed_decision: dict[str, Any]
) -> None:
    """A dead outbox event is one decision's YAML file or index entry that can never be made
    as the row stands: 200 "degraded", so a load balancer keeps the server in rotation (every
    replica shares the table; all would go), while monitoring sees it."""
    from sqlalchemy import update

    from app.db.outbox import OutboxEvent

    recorded = await rpc.ok("cstp.recordDecision", seed_decision)
    await services.relay.flush()
    async with services.db.transaction(write=True) as session:
        await session.execute(
            update(OutboxEvent)
            .where(OutboxEvent.decision_id == recorded["id"], OutboxEvent.kind == "export")
            .values(status="dead", last_error="decision not found")
        )
    response = await client.get("/ready")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "degraded" and body["degraded"] == ["outbox"]
    assert body["checks"]["outbox"]["dead"] == 1 and "failing" not in body
    assert await admin.retry_dead(services) == 1
    await services.relay.drain()
    response = await client.get("/ready")
    assert response.json()["status"] == "ready" and "degraded" not in response.json()


@pytest.mark.parametrize(
    ("setting", "url", "part", "a_call_gets"),
    [
        # A search needs the index; listing decisions does not.
        ("chroma_url", "http://127.0.0.1:{port}", "vectorIndex", "result"),
        # With CSTP_REDIS_URL every call needs Redis for its budget: a worker that cannot reach
        # it refuses every call, so it must not say it is ready.
        ("redis_url", "redis://127.0.0.1:{port}/0", "rateLimits", "error"),
    ],
)
async def test_ready_names_an_unreachable_part(
    settings: Settings,
    embedder: Any,
    free_port: int,
    setting: str,
    url: str,
    part: str,
    a_call_gets: str,
) -> None:
    app = create_app(replace(settings, **{setting: url.format(port=free_port)}), embedder=embedder)
    async with serve_app(app) as client:
        response = await client.get("/ready")
        assert response.status_code == 503
        assert response.json()["failing"] == [part]
        assert response.json()["checks"][part] == "unreachable"
        call = (
            await client.post("/cstp", json=BODY, headers={"Authorization": "Bearer token-alice"})
        ).json()
    assert a_call_gets in call, call
    if a_call_gets == "error":
        assert call["error"]["code"] == -32006


async def test_an_unreachable_postgres_is_a_storage_error_not_a_bug(
    settings: Settings, embedder: Any, free_port: int
) -> None:
    """asyncpg raises ConnectionRefusedError (an OSError) unwrapped: each call must still
    be -32005, which SPEC gives to "the database could not be written or read"."""
    down = replace(settings, database_url=f"postgresql+asyncpg://postgres@127.0.0.1:{free_port}/x")
    app = create_app(down, embedder=embedder)
    calls = {
        "cstp.listDecisions": {},
        "cstp.getDecision": {"id": "0000abcd"},
        "cstp.recordDecision": {
            "decision": "Use Redis for caching",
            "confidence": 0.8,
            "category": "architecture",
        },
        "cstp.reviewDecision": {"id": "0000abcd", "outcome": "success"},
        "cstp.checkGuardrails": {"action": {"description": "Add a cache"}},
        "cstp.announceIntent": {"intent": "Add a cache"},
        "cstp.getCalibration": {},
    }
    async with serve_app(app) as client:
        for method, params in calls.items():
            response = await client.post(
                "/cstp",
                headers={"Authorization": "Bearer token-alice"},
                json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
            )
            assert response.json()["error"]["code"] == -32005, (method, response.text)


async def test_ready_names_a_schema_behind_head(settings: Settings, embedder: Any) -> None:
    await migrate.downgrade(settings.database_url, "0001")
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    assert "schema" in response.json()["failing"]
    assert response.json()["checks"]["schema"] == f"at 0001, expected {migrate.head_revision()}"


async def test_the_served_app_freezes_its_heap_once_started(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cstp serve`` runs ``serving_app``: once started, what the process holds is out of the
    garbage collector's sight (gc.freeze), so a full collection does not walk it while calls
    wait; an app made for a test or a command leaves the collector as it was."""
    gc.unfreeze()
    for name, value in {
        "CSTP_DATA_DIR": settings.data_dir,
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DECISIONS_DIR": settings.decisions_dir,
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }.items():
        monkeypatch.setenv(name, str(value))
    try:
        async with serve_app(create_app()) as client:
            assert (await client.get("/health")).status_code == 200
            assert gc.get_freeze_count() == 0
        async with serve_app(serving_app()) as client:
            assert (await client.get("/health")).status_code == 200
            assert gc.get_freeze_count() > 10_000  # the model, the engines, the code
    finally:
        gc.unfreeze()


async def test_agent_card_lists_every_registered_method(shared_client: Any) -> None:
    card = (await shared_client.get("/.well-known/agent.json")).json()
    methods = card["capabilities"]["cstp"]["methods"]
    assert methods == shared_client.app.state.registry.names()
    for name in ("cstp.recordDecision", "cstp.getDecision", "cstp.listDecisions"):
        assert name in methods
    assert card["authentication"]["schemes"] == ["bearer"]
    assert card["name"] == "cognition-engines"
    assert card["url"].endswith("/cstp") and card["version"]
    assert card["capabilities"]["cstp"]["version"]


def test_an_empty_token_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="non-empty"):
        Settings.from_env({"CSTP_AUTH_TOKENS": "alice:"})
    with pytest.raises(ConfigError):
        Settings.from_env({"CSTP_AUTH_TOKENS": ":secret"})


async def test_a_commented_out_line_of_the_tokens_file_grants_nothing(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("# revoked: mallory:abc123, eve:def456\nalice:tok-alice\n")
    app = create_app(replace(settings, auth_tokens={}, tokens_file=tokens_file), embedder=embedder)
    async with serve_app(app) as client:
        for revoked in ("abc123", "def456"):
            denied = await client.post(
                "/cstp", json=BODY, headers={"Authorization": f"Bearer {revoked}"}
            )
            assert denied.status_code == 401
        allowed = await client.post(
            "/cstp", json=BODY, headers={"Authorization": "Bearer tok-alice"}
        )
        assert allowed.status_code == 200 and "result" in allowed.json()


def test_a_token_given_to_two_agents_across_env_and_file_stops_start_up(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("bob:shared-token\n")
    clash = replace(settings, auth_tokens={"shared-token": "alice"}, tokens_file=tokens_file)
    with pytest.raises(ConfigError, match="same token is given to two agents"):
        create_app(clash, embedder=embedder)
    same = replace(settings, auth_tokens={"shared-token": "bob"}, tokens_file=tokens_file)
    create_app(same, embedder=embedder)  # the same pair twice is no conflict


def test_a_token_no_client_could_send_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        Settings.from_env({"CSTP_AUTH_TOKENS": "carol:t\u00f6k\u00e9n"})
    with pytest.raises(ConfigError, match="printable ASCII"):
        Settings.from_env({"CSTP_AUTH_TOKENS": "carol:tok\ten"})


async def test_without_tokens_a_local_token_is_kept_and_reused(
    settings: Settings, embedder: Any
) -> None:
    local = replace(settings, auth_tokens={})
    app = create_app(local, embedder=embedder)
    token_file = local.data_dir / "local-token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    async with serve_app(app) as client:
        denied = await client.post("/cstp", json=BODY)
        assert denied.status_code == 401
        allowed = await client.post(
            "/cstp", json=BODY, headers={"Authorization": f"Bearer {token}"}
        )
        assert allowed.status_code == 200 and "result" in allowed.json()
    create_app(local, embedder=embedder)
    assert token_file.read_text().strip() == token


async def test_migrations_run_down_and_up_and_models_do_not_drift(database_url: str) -> None:
    assert await migrate.current(database_url) == migrate.head_revision()
    assert await migrate.drift(database_url) == []
    await migrate.downgrade(database_url, "base")
    assert await migrate.current(database_url) is None
    await migrate.upgrade(database_url)
    assert await migrate.current(database_url) == migrate.head_revision()
    assert await migrate.drift(database_url) == []


def test_settings_read_from_environment(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "CSTP_DATA_DIR": str(tmp_path),
            "CSTP_PORT": "1234",
            "CSTP_AGENT_NAME": "x",
            "CSTP_AUTH_TOKENS": "a:1,b:2",
            "CSTP_RATE_LIMITS": "default=5/1,cstp.announceIntent=2/10",
        }
    )
    assert s.database_url == f"sqlite+aiosqlite:///{tmp_path.absolute() / 'cstp.db'}"
    assert s.port == 1234 and s.agent_name == "x"
    assert s.auth_tokens == {"1": "a", "2": "b"}
    assert s.rate_limits["cstp.announceIntent"].count == 2
    with pytest.raises(ConfigError, match="CSTP_PORT"):
        Settings.from_env({"CSTP_PORT": "http"})
    with pytest.raises(ConfigError, match="CSTP_DATABASE_URL"):
        Settings.from_env({"CSTP_DATABASE_URL": "mysql://x"})


# ---------------------------------------------------------------- the route tables

ROOT = Path(__file__).resolve().parents[2]


def documented_routes(doc: Path) -> set[str]:
    """The paths the "Routes" table of ``doc`` names (``GET /console/…`` as ``/console/…``)."""
    section = doc.read_text(encoding="utf-8").split("## Routes", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {path for cell in cells for path in re.findall(r"`(?:[A-Z]+ )?(/[^`\s]*)`", cell)}


def is_documented(path: str, documented: set[str]) -> bool:
    plain = re.sub(r"\{(\w+)(?::\w+)?\}", r"<\1>", path)  # /hooks/ci/{workspace:str}
    return any(
        plain == doc or (doc.endswith("…") and plain.startswith(doc[:-1].rstrip("/")))
        for doc in documented
    )


@pytest.mark.parametrize("doc", ["README.md", "docs/PROTOCOL.md"])
async def test_every_route_served_is_in_the_route_tables(shared_client: Any, doc: str) -> None:
    documented = documented_routes(ROOT / doc)
    served = {route.path for route in shared_client.app.routes}
    assert {"/cstp", "/metrics", "/health"} <= served
    assert {p for p in served if not is_documented(p, documented)} == set(), documented
