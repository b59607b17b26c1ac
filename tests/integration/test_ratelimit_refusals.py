"""A shared rate-limit store that answers PING but refuses writes: a read-only replica
(READONLY) and a store full under ``maxmemory-policy noeviction`` (OOM). Every call needs its
budget updated, so every call is refused (-32006, "refuses writes"), and /ready must say so
(503, ``checks.rateLimits: "refuses writes"``) instead of "ok"; once the store takes writes
again, calls and /ready recover with no restart.

Each test runs a redis-server of its own on a free loopback port (the shared one is left
alone), started with the options that make it refuse writes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from app.asgi import create_app
from app.config import Settings
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.waiting import wait_until

Start = Callable[..., redis.Redis]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_redis() -> Iterator[Start]:
    """``start(*options)`` -> a client of a new redis-server on a free port, with ``options``;
    every server started is killed at the end."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI must run the Redis tests")
        pytest.skip("redis-server is not installed")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> redis.Redis:
        port = _free_port()
        proc = subprocess.Popen(
            [
                *("redis-server", "--bind", "127.0.0.1", "--port", str(port)),
                *("--save", "", "--appendonly", "no", *options),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=2)

        def answers() -> tuple[bool, Any]:
            assert proc.poll() is None, "redis-server exited"
            return bool(client.ping()), None

        wait_until(answers, 20, "redis-server answering", not_yet=(redis.RedisError,))
        return client

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def url_of(client: redis.Redis) -> str:
    port = client.connection_pool.connection_kwargs["port"]
    return f"redis://127.0.0.1:{port}/0"


def fill(client: redis.Redis) -> None:
    """Write until the store refuses (OOM under noeviction)."""
    with pytest.raises(redis.OutOfMemoryError):
        for n in range(10_000):
            client.set(f"filler:{n}", "x" * 10_000)


async def assert_refused_then_recovers(
    settings: Settings, embedder: Embedder, store: redis.Redis, heal: Callable[[], Any], caplog: Any
) -> None:
    shared = replace(settings, redis_url=url_of(store))
    async with serve_app(create_app(shared, embedder=embedder)) as client:
        rpc = Rpc(client)
        assert store.ping()  # it answers PING all along

        ready = await client.get("/ready")
        assert ready.status_code == 503, ready.text
        body = ready.json()
        assert body["status"] == "not_ready"
        assert body["checks"]["rateLimits"] == "refuses writes"
        assert body["failing"] == ["rateLimits"]

        with caplog.at_level("INFO"):
            errors = [await rpc.error("cstp.listDecisions") for _ in range(2)]
            errors.append(await rpc.error("cstp.announceIntent", {"intent": "Add a cache"}))
        for error in errors:
            assert error["code"] == -32006, error
            assert error["message"] == "Unavailable: the rate-limit store refuses writes"
            assert isinstance(error["data"]["retryAfterMs"], int)
            assert error["data"]["retryAfterMs"] > 0
        lines = [r for r in caplog.records if r.name == "cstp.ratelimit"]
        assert len(lines) == 1 and lines[0].levelname == "ERROR", lines
        assert "refuses writes" in lines[0].getMessage()
        assert not any(r.exc_info for r in caplog.records), "a traceback was logged"

        heal()
        with caplog.at_level("INFO"):
            assert (await rpc.ok("cstp.listDecisions"))["total"] == 0
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["rateLimits"] == "ok"
        assert [r.levelname for r in caplog.records if r.name == "cstp.ratelimit"] == [
            "ERROR",
            "WARNING",
        ]


async def test_a_read_only_replica_is_not_ready_and_refuses_calls(
    settings: Settings, embedder: Embedder, private_redis: Start, caplog: Any
) -> None:
    # A replica of a primary that is not there: it answers, serves reads, refuses writes.
    replica = private_redis("--replicaof", "127.0.0.1", str(_free_port()))
    with pytest.raises(redis.ReadOnlyError):
        replica.set("probe", "1")
    await assert_refused_then_recovers(
        settings,
        embedder,
        replica,
        lambda: replica.execute_command("REPLICAOF", "NO", "ONE"),
        caplog,
    )


async def test_a_full_store_under_noeviction_is_not_ready_and_refuses_calls(
    settings: Settings, embedder: Embedder, private_redis: Start, caplog: Any
) -> None:
    full = private_redis("--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
    fill(full)

    def raise_the_limit() -> None:  # what an operator does about it
        full.config_set("maxmemory", "0")

    await assert_refused_then_recovers(settings, embedder, full, raise_the_limit, caplog)
