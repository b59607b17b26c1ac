"""Per-agent, per-method rate limits (-32002 with ``retryAfterMs``), in memory and in a real
Redis, including two real ``cstp serve`` processes sharing one Redis budget.

Redis comes from ``CSTP_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``). The Redis
tests are skipped only when Redis is unreachable and ``CI`` is not set; in CI they must run.
Every test uses agent names of its own, so its rate-limit keys (``cstp:rl:<method>:<agent>``)
never meet another test's, and removes those keys afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.asgi import create_app
from app.config import RateLimit, Settings, parse_rate_limits
from app.errors import CstpError
from app.operations.ratelimit import MemoryRateLimiter, RedisRateLimiter
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.processes import wait_until_up
from support.waiting import wait_until

REDIS_URL = os.environ.get("CSTP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
ANNOUNCE = "cstp.announceIntent"
LIMITS = "default=1000/60,cstp.announceIntent=3/60"


def redis_available() -> bool:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def require_redis() -> None:
    if redis_available():
        return
    if os.environ.get("CI"):
        pytest.fail(f"Redis at {REDIS_URL} is unreachable, and CI must run the Redis tests")
    pytest.skip(f"Redis at {REDIS_URL} is unreachable (set CI to make this a failure)")


def forget_keys(pattern: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()


@dataclass(frozen=True)
class Agents:
    alice: str
    bob: str


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        require_redis()
    yield request.param


@pytest.fixture
def agents() -> Iterator[Agents]:
    suffix = uuid.uuid4().hex[:12]
    names = Agents(f"alice-{suffix}", f"bob-{suffix}")
    yield names
    forget_keys(f"cstp:rl:*:*-{suffix}")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


@asynccontextmanager
async def limited_app(
    settings: Settings, embedder: Embedder, backend: str, agents: Agents, limits: str
) -> AsyncIterator[Rpc]:
    limited = replace(
        settings,
        rate_limits=parse_rate_limits(limits),
        redis_url=REDIS_URL if backend == "redis" else None,
        auth_tokens={"token-alice": agents.alice, "token-bob": agents.bob},
    )
    async with serve_app(create_app(limited, embedder=embedder)) as client:
        yield Rpc(client)


def announcement(n: int) -> dict[str, Any]:
    return {
        "intent": f"Add a cache in front of search API number {n}",
        "correlationId": f"rl-{n}",
        "category": "architecture",
    }


def assert_rate_limited(error: dict[str, Any], budget: RateLimit) -> int:
    assert error["code"] == -32002, error
    retry = error["data"]["retryAfterMs"]
    assert isinstance(retry, int) and not isinstance(retry, bool)
    assert 0 < retry <= budget.seconds * 1000 / budget.count
    return retry


async def test_over_budget_is_32002_per_agent_and_audited(
    settings: Settings, embedder: Embedder, backend: str, agents: Agents, db: AsyncEngine
) -> None:
    async with limited_app(settings, embedder, backend, agents, LIMITS) as rpc:
        for n in range(3):
            await rpc.ok(ANNOUNCE, announcement(n))
        error = await rpc.error(ANNOUNCE, announcement(3))
        assert_rate_limited(error, RateLimit(3, 60))
        # a retry of an announcement that was answered is still a call: it is limited too
        assert (await rpc.error(ANNOUNCE, announcement(0)))["code"] == -32002

        # another agent has a budget of its own
        for n in range(3):
            await rpc.ok(ANNOUNCE, announcement(n), token="token-bob")
        assert (await rpc.error(ANNOUNCE, announcement(9), token="token-bob"))["code"] == -32002

        # other methods use the default budget, untouched by the announcements
        await rpc.ok("cstp.listDecisions", {"limit": 1})
        await rpc.ok("cstp.checkGuardrails", {"action": {"description": "Add a cache"}})

    async with db.connect() as conn:
        found = (
            await conn.execute(
                text(
                    "SELECT agent, correlation_id, outcome, error_code, intent FROM intents "
                    "WHERE outcome <> 'ok' ORDER BY agent, correlation_id"
                )
            )
        ).all()
        ok = (
            await conn.execute(
                text(
                    "SELECT agent, COUNT(*) FROM intents WHERE outcome = 'ok' "
                    "GROUP BY agent ORDER BY agent"
                )
            )
        ).all()
    assert [tuple(r) for r in found] == [
        (agents.alice, "rl-0", "rate_limited", -32002, announcement(0)["intent"]),
        (agents.alice, "rl-3", "rate_limited", -32002, announcement(3)["intent"]),
        (agents.bob, "rl-9", "rate_limited", -32002, announcement(9)["intent"]),
    ]
    assert [tuple(r) for r in ok] == [(agents.alice, 3), (agents.bob, 3)]


async def test_ready_reports_the_rate_limit_store(
    settings: Settings, embedder: Embedder, backend: str, agents: Agents
) -> None:
    async with limited_app(settings, embedder, backend, agents, LIMITS) as rpc:
        response = await rpc.client.get("/ready")
    assert response.status_code == 200, response.text
    checks = response.json()["checks"]
    if backend == "redis":
        assert checks["rateLimits"] == "ok"
    else:  # in memory: nothing to reach
        assert "rateLimits" not in checks


async def test_other_methods_share_the_default_budget_one_bucket_per_method(
    settings: Settings, embedder: Embedder, backend: str, agents: Agents
) -> None:
    limits = "default=2/60,cstp.announceIntent=3/60"
    async with limited_app(settings, embedder, backend, agents, limits) as rpc:
        for method, params in (
            ("cstp.listDecisions", {"limit": 1}),
            ("cstp.checkGuardrails", {"action": {"description": "Add a cache"}}),
        ):
            await rpc.ok(method, params)
            await rpc.ok(method, params)
            assert_rate_limited(await rpc.error(method, params), RateLimit(2, 60))
        for n in range(3):
            await rpc.ok(ANNOUNCE, announcement(n))
        assert (await rpc.error(ANNOUNCE, announcement(3)))["code"] == -32002
        # an unknown method is -32601, not a draw on any budget
        assert (await rpc.error("cstp.noSuchMethod"))["code"] == -32601


async def test_each_item_of_a_batch_draws_on_the_budget(
    settings: Settings, embedder: Embedder, backend: str, agents: Agents
) -> None:
    async with limited_app(settings, embedder, backend, agents, LIMITS) as rpc:
        batch = [
            {"jsonrpc": "2.0", "method": ANNOUNCE, "params": announcement(n), "id": n}
            for n in range(5)
        ]
        answers = (await rpc.raw(batch)).json()
        assert [a["id"] for a in answers] == list(range(5))
        assert ["result" in a for a in answers] == [True, True, True, False, False]
        assert {a["error"]["code"] for a in answers[3:]} == {-32002}


# ---------------------------------------------------------------- the limiters themselves


async def test_memory_limiter_refills_at_the_budget_rate() -> None:
    now = [1000.0]
    limiter = MemoryRateLimiter(parse_rate_limits("default=3/60"), clock=lambda: now[0])
    for _ in range(3):
        await limiter.check("default", "a", "m")
    with pytest.raises(CstpError) as info:
        await limiter.check("default", "a", "m")
    assert info.value.code == -32002 and info.value.data == {"retryAfterMs": 20000}
    now[0] += 5
    with pytest.raises(CstpError) as info:
        await limiter.check("default", "a", "m")
    assert info.value.data == {"retryAfterMs": 15000}
    now[0] += 15
    await limiter.check("default", "a", "m")  # one token came back after 60/3 seconds
    await limiter.check("default", "b", "m")  # another agent: a full bucket
    for _ in range(3):  # the same agent's name in another workspace: a budget of its own
        await limiter.check("team-b", "a", "m")


async def test_redis_limiter_is_atomic_across_tasks_and_connections() -> None:
    require_redis()
    prefix = f"cstp-test:{uuid.uuid4().hex}"
    limits = parse_rate_limits("default=10/60")
    limiters = [RedisRateLimiter(REDIS_URL, limits, prefix=prefix) for _ in range(3)]

    async def attempt(n: int) -> int:
        try:
            await limiters[n % 3].check("default", "agent", "cstp.checkGuardrails")
        except CstpError as exc:
            assert exc.code == -32002
            retry = exc.data["retryAfterMs"]
            assert isinstance(retry, int) and 0 < retry <= 6000
            return 0
        return 1

    try:
        outcomes = await asyncio.gather(*(attempt(n) for n in range(60)))
        assert sum(outcomes) == 10
        await limiters[0].check("default", "agent", "other.method")  # its own bucket
        await limiters[1].check("default", "other-agent", "cstp.checkGuardrails")
    finally:
        for limiter in limiters:
            await limiter.close()
        forget_keys(f"{prefix}:*")


# ---------------------------------------------------------------- two server processes


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """Child processes in sessions of their own, always stopped (the whole group) at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return proc, log

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        yield procs
    finally:
        procs.stop_all()


# Slow: two `cstp serve` processes (the Redis budget's atomicity across connections stays in
# the fast loop, in-process).
@pytest.mark.slow
async def test_two_server_processes_share_one_redis_budget(
    database_url: str, tmp_path: Path, processes: Processes, agents: Agents, db: AsyncEngine
) -> None:
    require_redis()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}

    chroma_port = free_port()
    chroma, chroma_log = processes.start(
        "chroma",
        [
            str(BIN / "chroma"),
            "run",
            "--path",
            str(tmp_path / "chroma"),
            "--host",
            "127.0.0.1",
            "--port",
            str(chroma_port),
        ],
        base_env,
    )

    token = f"tok-{uuid.uuid4().hex}"
    ports = [free_port(), free_port()]
    servers = []
    for n, port in enumerate(ports):
        env = dict(
            base_env,
            CSTP_DATABASE_URL=database_url,  # migrated already (the fixture's template)
            CSTP_CHROMA_URL=f"http://127.0.0.1:{chroma_port}",
            CSTP_REDIS_URL=REDIS_URL,
            CSTP_AUTH_TOKENS=f"{agents.alice}:{token}",
            CSTP_RATE_LIMITS="default=1000/60,cstp.checkGuardrails=10/60",
            CSTP_DATA_DIR=str(tmp_path / f"data{n}"),
            CSTP_DECISIONS_DIR=str(tmp_path / f"decisions{n}"),
            CSTP_LOG_LEVEL="WARNING",
        )
        servers.append(
            processes.start(
                f"server{n}",
                [str(BIN / "cstp"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                env,
            )
        )

    await asyncio.to_thread(
        wait_until_up,
        chroma,
        f"http://127.0.0.1:{chroma_port}/api/v2/heartbeat",
        60,
        lambda: chroma_log.read_text()[-3000:],
    )
    for (proc, log), port in zip(servers, ports, strict=True):
        await asyncio.to_thread(
            wait_until_up,
            proc,
            f"http://127.0.0.1:{port}/health",
            90,
            lambda log=log: log.read_text()[-3000:],
        )

    async def check(client: httpx.AsyncClient, port: int, n: int) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "method": "cstp.checkGuardrails",
            "id": n,
            "params": {"action": {"description": f"Add cache number {n}"}},
        }
        response = await client.post(
            f"http://127.0.0.1:{port}/cstp", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(*(check(client, ports[n % 2], n) for n in range(30)))
    ok = [a for a in answers if "result" in a]
    limited = [a for a in answers if a.get("error", {}).get("code") == -32002]
    assert len(ok) == 10 and len(limited) == 20, answers
    for answer in limited:
        assert_rate_limited(answer["error"], RateLimit(10, 60))

    async with db.connect() as conn:
        stored = (
            await conn.execute(
                text(
                    "SELECT COUNT(*) FROM guardrail_evaluations WHERE agent = :agent "
                    "AND source = 'checkGuardrails'"
                ),
                {"agent": agents.alice},
            )
        ).scalar_one()
    assert stored == 10


class PrivateRedis:
    """A redis-server of this test's own on a free port, to stop and start at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        proc = self.proc

        def answers() -> tuple[bool, Any]:
            assert proc.poll() is None, "redis-server exited"
            return bool(client.ping()), None

        wait_until(answers, 20, "redis-server answering", not_yet=(redis.RedisError,))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def private_redis(free_port: int) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI must run the Redis outage test")
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(free_port)
    server.start()
    yield server
    server.stop()


async def test_a_redis_outage_is_32006_logged_once_and_over_without_a_restart(
    settings: Settings, embedder: Embedder, private_redis: PrivateRedis, caplog: Any
) -> None:
    shared = replace(settings, redis_url=private_redis.url)
    async with serve_app(create_app(shared, embedder=embedder)) as client:
        rpc = Rpc(client)
        assert (await rpc.ok("cstp.listDecisions"))["total"] == 0
        private_redis.stop()
        with caplog.at_level("INFO"):
            errors = [await rpc.error("cstp.listDecisions") for _ in range(3)]
            announced = await rpc.error("cstp.announceIntent", {"intent": "Add a cache"})
        for error in [*errors, announced]:
            assert error["code"] == -32006, error
            assert error["message"] == "Unavailable: the rate-limit store is unreachable"
            assert isinstance(error["data"]["retryAfterMs"], int)
            assert error["data"]["retryAfterMs"] > 0
        outage_lines = [r for r in caplog.records if r.name == "cstp.ratelimit"]
        assert len(outage_lines) == 1 and outage_lines[0].levelname == "ERROR"
        assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
        assert (await client.get("/ready")).json()["checks"]["rateLimits"] == "unreachable"

        private_redis.start()
        with caplog.at_level("INFO"):
            assert (await rpc.ok("cstp.listDecisions"))["total"] == 0
        assert (await client.get("/ready")).status_code == 200
        assert [r.levelname for r in caplog.records if r.name == "cstp.ratelimit"] == [
            "ERROR",
            "WARNING",
        ]
