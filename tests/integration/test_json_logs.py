"""CSTP_LOG_FORMAT=json read as a log pipeline reads a real ``cstp serve``: every line of the
process — ours, uvicorn's, Alembic's, start-up's and a failure to start — is one JSON object;
a call's line holds its fields as keys (not a JSON string inside the message) and, with
tracing on, the trace id of its call."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.app import SEED_DECISION
from support.processes import CSTP, ChromaServer, cstp_servers
from support.receiver import Receiver

pytestmark = pytest.mark.slow

KEYS = {"time", "level", "logger", "message"}
# A W3C traceparent an agent sends: its trace id is what the server's lines must carry.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a log, parsed; a line that is not one JSON object fails the test."""
    parsed = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line[:300]!r}") from None
        assert isinstance(value, dict) and value.keys() >= KEYS, (number, line[:300])
        parsed.append(value)
    return parsed


def server_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """A server on a new SQLite file (its migrations are logged), with no tokens set (it makes
    one and says so), logging JSON."""
    return {
        "CSTP_LOG_FORMAT": "json",
        "CSTP_LOG_LEVEL": "INFO",
        "CSTP_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'new' / 'cstp.db'}",
        "CSTP_DATA_DIR": str(tmp_path / "data"),
        "CSTP_DECISIONS_DIR": str(tmp_path / "decisions"),
        "CSTP_AUTH_TOKENS": "",
        "CSTP_TOKENS_FILE": "",
        "CSTP_RATE_LIMITS": "default=100000/1",
        **more,
    }


def rpc(base: str, token: str, method: str, params: Any, **headers: str) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = httpx.post(
        f"{base}/cstp",
        json=body,
        headers={"Authorization": f"Bearer {token}", **headers},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def mcp_call(base: str, token: str) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "list_decisions", "arguments": {"limit": 1}},
    }
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    answer = httpx.post(f"{base}/mcp", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text


def calls(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["logger"] == "cstp.rpc" and line.get("event") == "rpc"]


def test_every_line_of_a_json_log_is_a_json_object(tmp_path: Path) -> None:
    with cstp_servers(tmp_path, [server_env(tmp_path)]) as (base,):
        token = (tmp_path / "data" / "local-token").read_text().strip()
        assert "result" in rpc(base, token, "cstp.recordDecision", SEED_DECISION)
        assert "result" in rpc(base, token, "cstp.queryDecisions", {"query": "agent memory"})
        assert rpc(base, token, "cstp.recordDecision", {"decision": 1})["error"]["code"] == -32602
        assert rpc(base, token, "cstp.nope", {})["error"]["code"] == -32601
        mcp_call(base, token)
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    lines = json_lines((tmp_path / "server0.log").read_text())

    made = [(c["face"], c["method"], c["outcome"]) for c in calls(lines)]
    assert made == [
        ("jsonrpc", "cstp.recordDecision", "ok"),
        ("jsonrpc", "cstp.queryDecisions", "ok"),
        ("jsonrpc", "cstp.recordDecision", "-32602"),
        ("jsonrpc", "cstp.nope", "-32601"),
        ("mcp", "cstp.listDecisions", "ok"),
    ], made
    first = calls(lines)[0]
    assert first["message"] == "cstp.recordDecision ok"  # not the fields again, as a string
    assert first["agent"] == "local" and first["workspace"] == "default"
    assert isinstance(first["durationMs"], float) and first["level"] == "INFO"

    told = {
        (line["level"], line["message"].split(":")[0])
        for line in lines
        if line["logger"] == "cstp.serve"
    }
    assert ("WARNING", "No CSTP_AUTH_TOKENS set") in told, told  # the token it made
    assert ("INFO", "created the tables of a new database in sqlite+aiosqlite") in told, told
    assert ("INFO", "database") in told, told  # the banner: database, ..., listening on
    assert _messages(lines, "alembic.runtime.migration"), "Alembic's lines are missing"
    uvicorn = _messages(lines, "uvicorn.error")
    assert "Application startup complete." in uvicorn and "Shutting down" in uvicorn, uvicorn


def _messages(lines: list[dict[str, Any]], logger: str) -> list[str]:
    return [line["message"] for line in lines if line["logger"] == logger]


@pytest.fixture
def otlp_receiver() -> Iterator[Receiver]:
    """Where the server exports its spans (OTLP over HTTP): kept, never read."""
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


def test_a_calls_line_carries_the_trace_id_of_its_call(
    tmp_path: Path, otlp_receiver: Receiver
) -> None:
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        pytest.skip("OpenTelemetry is not installed (pip install 'cstp-server[otel]')")
    if importlib.util.find_spec("app.observability.tracing") is None:
        pytest.skip("this build has no tracing (app/observability/tracing.py)")
    env = server_env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{otlp_receiver.port}")
    with cstp_servers(tmp_path, [env]) as (base,):
        token = (tmp_path / "data" / "local-token").read_text().strip()
        params = {"query": "agent memory"}
        assert "result" in rpc(base, token, "cstp.queryDecisions", params, traceparent=TRACEPARENT)
        assert "result" in rpc(base, token, "cstp.queryDecisions", params)
    continued, own = calls(json_lines((tmp_path / "server0.log").read_text()))
    assert continued["trace_id"] == TRACE_ID, continued
    assert len(continued["span_id"]) == 16 and continued["span_id"] != TRACEPARENT[36:52]
    # a call without a traceparent starts a trace of its own, and its line names that one
    assert len(own["trace_id"]) == 32 and own["trace_id"] != TRACE_ID, own


def test_a_server_that_cannot_start_says_why_in_one_json_line(tmp_path: Path) -> None:
    env = {**os.environ, **server_env(tmp_path, CSTP_RATE_LIMITS="cstp.nope=1/60")}
    done = subprocess.run([str(CSTP), "serve"], env=env, capture_output=True, timeout=120)
    assert done.returncode == 1, done
    lines = json_lines(done.stdout.decode() + done.stderr.decode())
    assert [(line["level"], line["logger"]) for line in lines] == [("ERROR", "cstp.serve")], lines
    assert "CSTP_RATE_LIMITS" in lines[0]["message"] and "cstp.nope" in lines[0]["message"]


def test_every_worker_process_writes_json_lines(
    tmp_path: Path, chroma_server: ChromaServer
) -> None:
    """Worker processes (``--workers 2``) are started afresh by uvicorn: they log through the
    same configuration, so their calls' lines are there, as JSON."""
    chroma_server.start()
    env = server_env(tmp_path, CSTP_CHROMA_URL=chroma_server.url)
    with cstp_servers(tmp_path, [env], args=["--workers", "2"]) as (base,):
        token = (tmp_path / "data" / "local-token").read_text().strip()
        for n in range(6):
            assert "result" in rpc(base, token, "cstp.queryDecisions", {"query": f"memory {n}"})
    lines = json_lines((tmp_path / "server0.log").read_text())
    assert len(calls(lines)) == 6, [line["message"] for line in lines]
    started = [m for m in _messages(lines, "uvicorn.error") if m.startswith("Started server")]
    assert len(started) == 2, started
