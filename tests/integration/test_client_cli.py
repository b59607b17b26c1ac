"""The terminal client (``cstp query|record|review|get|list|check|announce|calibration|
guardrails``) against a REAL server process: ``cstp serve`` started once for this module on a
free port (SQLite by default, a fresh Postgres database when CSTP_TEST_DATABASE_URL names one),
driven through click's CliRunner exactly as a user would, human output and ``--json`` both.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from support.processes import wait_until_up

# Slow: a `cstp serve` process for the module (its pure helpers are tested in
# tests/unit/test_client_helpers.py).
pytestmark = pytest.mark.slow

PG_URL = os.environ.get("CSTP_TEST_DATABASE_URL", "")
USE_PG = PG_URL.startswith("postgresql")
TOKEN = "secret-token"
CSTP = Path(sys.executable).with_name("cstp")
START_TIMEOUT = 45.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg(sql: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(PG_URL.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    loop = asyncio.new_event_loop()  # its own loop: the test session's loop is left alone
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start ``cstp serve`` on a free port, wait for /health (bounded), always stop it."""
    root = tmp_path_factory.mktemp("client-cli")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    env.update(
        {
            "CSTP_DATA_DIR": str(root / "data"),
            "CSTP_DECISIONS_DIR": str(root / "decisions"),
            "CSTP_AUTH_TOKENS": f"alice:{TOKEN}",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_LOG_LEVEL": "WARNING",
        }
    )
    db_name = None
    if USE_PG:
        db_name = f"cstp_cli_{uuid.uuid4().hex[:12]}"
        _pg(f'CREATE DATABASE "{db_name}"')
        env["CSTP_DATABASE_URL"] = f"{PG_URL.rpartition('/')[0]}/{db_name}"
    log_path = root / "server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(CSTP), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(
            proc, f"{base}/health", START_TIMEOUT, lambda: log_path.read_text(errors="replace")
        )
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        if db_name:
            _pg(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def cli(server: str) -> Any:
    """``cli("list", "--limit", "5")`` -> click Result, with CSTP_URL and CSTP_TOKEN set."""
    runner = CliRunner()

    def run(*args: str, url: str | None = None, token: str | None = TOKEN) -> Result:
        env = {"CSTP_URL": url or server, "CSTP_TOKEN": token}
        return runner.invoke(main, list(args), env=env, catch_exceptions=False)

    return run


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    assert result.stderr == ""
    return result.stdout


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def fails(result: Result) -> str:
    """Exit 1, nothing on stdout, exactly one line on stderr, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def rows(text: str) -> dict[str, list[str]]:
    """The aligned table's rows keyed by their first column (the id)."""
    lines = text.splitlines()
    return {line.split()[0]: line.split() for line in lines[1:] if line and line[0] != " "}


def field(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {key!r} line in:\n{text}")


# ------------------------------------------------------------------------- the flow


def test_record_get_list_query_check_announce_review(cli: Any) -> None:
    # record: human output, then --json
    out = ok(
        cli(
            "record",
            "Use PostgreSQL for agent memory storage",
            "--confidence",
            "0.85",
            "--category",
            "architecture",
            "--stakes",
            "high",
            "--context",
            "Choosing database for long-term agent memory",
            "--reason",
            "analysis:ACID compliance needed",
            "--reason",
            "pattern:worked: before",
            "--tag",
            "database",
            "--tag",
            "infra",
            "--review-in",
            "30d",
            "--project",
            "memory",
        )
    )
    pg_id = field(out, "recorded")
    assert len(pg_id) == 8 and field(out, "indexed") == "yes"
    assert field(out, "path").endswith(f"decision-{pg_id}.yaml")
    recorded = as_json(
        cli(
            "record",
            "Adopt ruff as the only linter — «fast»",
            "--confidence",
            "0",
            "--category",
            "tooling",
            "--stakes",
            "low",
            "--json",
        )
    )
    assert recorded["success"] is True and recorded["indexed"] is True
    ruff_id = recorded["id"]

    # get: key: value lines, reasons, reviews; --json is the whole result
    out = ok(cli("get", pg_id))
    assert field(out, "id") == pg_id
    assert field(out, "title") == "Use PostgreSQL for agent memory storage"
    assert field(out, "confidence") == "0.85" and field(out, "stakes") == "high"
    assert field(out, "status") == "pending" and field(out, "recordedBy") == "alice"
    assert field(out, "tags") == "database, infra" and field(out, "project") == "memory"
    assert "  - analysis (0.8): ACID compliance needed" in out
    assert "  - pattern (0.8): worked: before" in out
    assert field(out, "reviews") == "0"
    got = as_json(cli("get", ruff_id, "--json"))
    assert got["found"] is True
    assert got["decision"]["title"] == "Adopt ruff as the only linter — «fast»"
    assert got["decision"]["confidence"] == 0.0

    # list: aligned columns, newest first; UTF-8 intact in --json
    out = ok(cli("list"))
    header, first, second = out.splitlines()[:3]
    assert header.split() == ["ID", "TITLE", "CATEGORY", "CONF", "STAKES", "STATUS"]
    assert first.startswith(ruff_id) and second.startswith(pg_id)
    assert header.index("CATEGORY") == first.index("tooling") == second.index("architecture")
    assert rows(out)[pg_id][-4:] == ["architecture", "0.85", "high", "pending"]
    assert "1-2 of 2 decision(s)" in out
    listed = as_json(cli("list", "--category", "architecture", "--tag", "database", "--json"))
    assert [d["id"] for d in listed["decisions"]] == [pg_id] and listed["total"] == 1
    assert "«fast»" in ok(cli("list", "--category", "tooling", "--json"))

    # query: best match first, score and distance columns, reasons on demand, filters applied
    out = ok(cli("query", "which database should store agent memory", "--reasons"))
    header = out.splitlines()[0]
    assert header.split()[-2:] == ["SCORE", "DISTANCE"]
    assert out.splitlines()[1].startswith(pg_id)
    table_lines = [line for line in out.splitlines()[1:-1] if not line.startswith(" ")]
    scores = [float(line.split()[-2]) for line in table_lines]
    assert len(scores) >= 2 and scores == sorted(scores, reverse=True)
    assert "decision(s), best match first" in out
    assert "    - analysis (0.8): ACID compliance needed" in out
    found = as_json(
        cli(
            "query",
            "database for agent memory",
            "--category",
            "architecture",
            "--stakes",
            "high",
            "--stakes",
            "critical",
            "--min-confidence",
            "0.5",
            "--tag",
            "database",
            "--no-outcome",
            "--json",
        )
    )
    assert [d["id"] for d in found["decisions"]] == [pg_id]
    assert 0 <= found["decisions"][0]["distance"] < 1
    out = ok(cli("query", "database for agent memory", "--has-outcome"))
    assert out.startswith("no decisions match")

    # check: verdict, violations with suggestions, warnings; facts parsed as JSON values
    out = ok(
        cli(
            "check",
            "Deploy authentication service to production",
            "--stakes",
            "high",
            "--confidence",
            "0.85",
            "--context",
            "affects_production=true",
            "--context",
            "code_review=false",
        )
    )
    assert field(out, "allowed") == "no"
    assert field(out, "violations") == "1"
    assert "  - [block] production-needs-code-review: " in out
    assert "    suggestion: Get the change reviewed first" in out
    assert "  - [warn] prefer-staged-rollout: " in out
    verdict = as_json(
        cli(
            "check",
            "Deploy authentication service to production",
            "--stakes",
            "high",
            "--confidence",
            "0.85",
            "--context",
            "affects_production=true",
            "--context",
            "code_review=true",
            "--json",
        )
    )
    assert verdict["allowed"] is True and verdict["violations"] == []
    assert [w["guardrailId"] for w in verdict["warnings"]] == ["prefer-staged-rollout"]

    # announce: similar decisions, the guardrail verdict, suggestions
    out = ok(
        cli(
            "announce",
            "Choose a database for agent memory",
            "--category",
            "architecture",
            "--stakes",
            "high",
            "--confidence",
            "0.8",
            "--correlation-id",
            "intent-cli-1",
            "--context",
            "long-term memory",
            "--meta",
            "affects_production=true",
            "--meta",
            "code_review=true",
        )
    )
    assert field(out, "correlationId") == "intent-cli-1"
    assert field(out, "allowed") == "yes" and field(out, "violations") == "0"
    assert field(out, "similar decisions") == "1"
    assert f"  {pg_id}  Use PostgreSQL for agent memory storage" in out
    assert "suggestions:" in out and field(out, "respondingAgent")
    again = as_json(
        cli(
            "announce",
            "Choose a database for agent memory",
            "--category",
            "architecture",
            "--stakes",
            "high",
            "--confidence",
            "0.8",
            "--correlation-id",
            "intent-cli-1",
            "--context",
            "long-term memory",
            "--meta",
            "affects_production=true",
            "--meta",
            "code_review=true",
            "--json",
        )
    )
    assert again["correlationId"] == "intent-cli-1"
    assert again["similarDecisions"][0]["id"] == pg_id

    # review, then the decision shows it
    out = ok(
        cli(
            "review",
            pg_id,
            "failure",
            "--result",
            "Connection pool exhausted",
            "--lessons",
            "Size the pool for peak load",
            "--notes",
            "Rolled back",
            "--kpi",
            "latency=+40%",
        )
    )
    assert field(out, "reviewed") == pg_id and field(out, "status") == "reviewed"
    assert field(out, "outcome") == "failure"
    reviewed = as_json(cli("review", ruff_id, "success", "--json"))
    assert reviewed["status"] == "reviewed" and reviewed["id"] == ruff_id
    out = ok(cli("get", pg_id))
    assert field(out, "status") == "reviewed" and field(out, "outcome") == "failure"
    assert field(out, "reviews") == "1"
    assert "    lessons: Size the pool for peak load" in out
    assert (
        rows(ok(cli("list", "--status", "reviewed", "--sort", "confidence", "--order", "asc")))[
            pg_id
        ][-1]
        == "failure"
    )
    announced = as_json(
        cli("announce", "Pick storage for agent memory", "--category", "architecture", "--json")
    )
    assert announced["similarDecisions"][0]["notes"] == "Size the pool for peak load"


def test_calibration_worked_example(cli: Any) -> None:
    """SPEC's example: six at 0.75, four successes, two failures."""
    for index, outcome in enumerate(["success"] * 4 + ["failure"] * 2):
        decision = f"Calibration sample {index}: pick a process for release notes"
        made = as_json(
            cli("record", decision, "--confidence", "0.75", "--category", "process", "--json")
        )
        ok(cli("review", made["id"], outcome))
    out = ok(cli("calibration", "--category", "process", "--group-by", "category"))
    assert field(out, "brierScore") == "0.229"
    assert field(out, "accuracy") == "0.667"
    assert field(out, "calibrationGap") == "-0.083"
    assert field(out, "interpretation") == "slightly_overconfident"
    assert field(out, "decisions").startswith("6 scored")
    assert "  0.7-0.8  6 " in out and "recommendations:" in out
    assert "  process " in out.split("by category:")[1]
    data = as_json(
        cli(
            "calibration",
            "--category",
            "process",
            "--agent",
            "alice",
            "--min-decisions",
            "6",
            "--json",
        )
    )
    assert data["brierScore"] == 0.229 and data["interpretation"] == "slightly_overconfident"
    few = as_json(cli("calibration", "--category", "process", "--min-decisions", "7", "--json"))
    assert few["interpretation"] == "insufficient_data"


def test_ready_and_drift(cli: Any) -> None:
    """The learning loop's two questions: a table, and the same answer as JSON."""
    data = as_json(cli("ready", "--json"))
    assert set(data) == {"items", "total"}
    out = ok(cli("ready", "--limit", "5"))
    assert out.splitlines()[0].split() == ["PRIORITY", "KIND", "WHAT", "SINCE", "REASON"]
    assert f"of {data['total']} item(s)" in out
    drift = as_json(cli("drift", "--category", "process", "--min-decisions", "1", "--json"))
    assert all(g["category"] == "process" for g in drift["groups"])
    table = ok(cli("drift", "--category", "process"))
    assert table.splitlines()[0].split() == ["AGENT", "CATEGORY", "DRIFT", "RECENT", "BASELINE"]
    refused = fails(cli("ready", "--agent", "somebody-else"))
    assert "-32010" in refused and len(refused.strip().splitlines()) == 1


def test_guardrails(cli: Any) -> None:
    out = ok(cli("guardrails"))
    assert out.splitlines()[0].split() == ["ID", "ACTION", "SCOPE", "DESCRIPTION"]
    table = rows(out)
    assert table["production-needs-code-review"][1:3] == ["block", "all"]
    assert table["prefer-staged-rollout"][1] == "warn"
    data = as_json(cli("guardrails", "--scope", "payments", "--json"))
    assert data["count"] == len(data["guardrails"]) >= 1
    assert f"{data['count']} guardrail(s)" in ok(cli("guardrails", "--scope", "payments"))


# ------------------------------------------------------------------------- errors


def test_unreachable_server_is_one_line(cli: Any) -> None:
    port = _free_port()  # nothing listens there
    line = fails(cli("list", url=f"http://127.0.0.1:{port}"))
    assert line == (
        f"cannot reach the CSTP server at http://127.0.0.1:{port}/cstp: connection refused"
    )


def test_wrong_or_missing_token(cli: Any) -> None:
    line = fails(cli("list", token="wrong-token"))
    assert line.startswith("the server refused the token: set CSTP_TOKEN")
    line = fails(cli("query", "anything", token=None))
    assert "set CSTP_TOKEN" in line and line.startswith("no token")
    ok(cli("list", "--token", TOKEN, token="wrong-token"))  # --token wins over the env


def test_invalid_params_name_the_field(cli: Any) -> None:
    line = fails(cli("record", "Too sure", "--confidence", "2", "--category", "process"))
    assert line == "error -32602 Invalid params: confidence must be between 0.0 and 1.0"
    line = fails(cli("query", "x", "--limit", "51"))
    assert line.startswith("error -32602 Invalid params: limit")
    assert fails(cli("get", "nothex!")).startswith("error -32602 Invalid params: id")
    assert fails(cli("get", "00000000")) == "error -32007 Decision not found: no decision 00000000"
    line = fails(
        cli(
            "record",
            "x",
            "--confidence",
            "0.5",
            "--category",
            "process",
            "--reason",
            "hunch:felt right",
        )
    )
    assert line.startswith("error -32602 Invalid params: reasons[0].type")


def test_url_with_or_without_cstp_suffix(cli: Any, server: str) -> None:
    assert as_json(cli("guardrails", "--json", url=f"{server}/cstp/"))["count"] >= 1
    assert as_json(cli("guardrails", "--json", url=server.removeprefix("http://")))["count"] >= 1
    assert fails(cli("list", url=f"{server}/elsewhere/")).endswith("check CSTP_URL")


def test_usage_errors_before_any_request(cli: Any) -> None:
    result = cli("check", "Deploy", "--context", "no-equals-sign")
    assert result.exit_code == 2 and "key=value" in result.output
    result = cli("record", "x", "--category", "process")  # --confidence is required
    assert result.exit_code == 2 and "--confidence" in result.output
