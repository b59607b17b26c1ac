"""``GET /metrics`` (SPEC.md, section 11) on both databases, read with the Prometheus client's
own parser: the call counters and duration histograms match the calls made, by method, face
and result code; rate-limit refusals, guardrail verdicts and approvals by status count what
happened; the outbox, webhook, chain and dependency series match what ``cstp outbox``,
/ready and the database say; the chain verification's two series appear only once it has
run; the route takes a token with the ``metrics`` scope only. On Postgres, as server
processes: two servers' scrapes add up to the calls made, and one scrape of a server with
two workers counts both."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.outbox import admin
from app.runtime import Runtime
from app.search.embedder import Embedder
from support.app import SEED_DECISION, AppClient, Rpc, add_token, serve_app
from support.console import cstp, token
from support.databases import USE_PG, run_sql
from support.processes import ChromaServer, cstp_servers
from support.waiting import poll_until

MONITOR = "token-prom"
MCP_HEADERS = {"Host": "127.0.0.1:9991", "Accept": "application/json, text/event-stream"}
RULES = """
guardrails:
  - id: deploy-approval
    description: A deploy needs a person's approval
    action: escalate
    timeout: 30m
    conditions:
      - {field: deploy, operator: "==", value: true}
    message: A deploy needs approval
  - id: trial-payments
    description: Would block payments over a threshold (trial)
    action: block
    mode: shadow
    conditions:
      - {field: amount, operator: ">", value: 1000}
    message: A payment over 1000 would be blocked
"""


# ---- helpers ------------------------------------------------------------------------------------


async def scrape(client: httpx.AsyncClient, token: str = MONITOR) -> str:
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def series(text: str, sample: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The values of the samples named ``sample``, by the values of ``labels``."""
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample:
                key = tuple(s.labels[label] for label in labels)
                assert key not in found, (sample, key)  # one sample per label set
                found[key] = s.value
    return found


def names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def logged_calls(caplog: pytest.LogCaptureFixture) -> Counter[tuple[str, str, str]]:
    """The calls the runner logged: (method, face, outcome) -> how many."""
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "cstp.rpc" and r.getMessage().startswith("{")
    ]
    return Counter((c["method"], c["face"], c["outcome"]) for c in lines if c["event"] == "rpc")


@pytest.fixture
def monitored(client: AppClient) -> AppClient:
    add_token(client, MONITOR, "prom", "monitor")
    return client


async def console_page(client: AppClient, token: str, path: str) -> None:
    """Sign in to the console with ``token`` in a browser of its own and open ``path``."""
    http = AppClient(client.app)
    form = await http.get("/console/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None, form.text[:300]
    signed = await http.post("/console/login", data={"token": token, "csrf": found.group(1)})
    assert signed.status_code == 303, signed.text[:300]
    assert (await http.get(path)).status_code == 200


# ---- calls --------------------------------------------------------------------------------------


async def test_calls_and_durations_count_every_call_by_method_face_and_code(
    monitored: AppClient, rpc: Rpc, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            await rpc.ok("cstp.listDecisions", {})
        recorded = await rpc.ok("cstp.recordDecision", SEED_DECISION)
        await rpc.ok("cstp.getDecision", {"id": recorded["id"]})
        assert (await rpc.error("cstp.getDecision", {"id": "0000abcd"}))["code"] == -32007
        wrong = {**SEED_DECISION, "confidence": "high"}
        for _ in range(3):
            assert (await rpc.error("cstp.recordDecision", wrong))["code"] == -32602
        tool = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_decisions", "arguments": {"limit": 1}},
        }
        headers = {**MCP_HEADERS, "Authorization": "Bearer token-alice"}
        assert (await monitored.post("/mcp", json=tool, headers=headers)).status_code == 200
        await console_page(monitored, "token-alice", "/console/decisions")
    logged = logged_calls(caplog)
    text = await scrape(monitored)

    calls = series(text, "cstp_calls_total", "method", "face", "code")
    assert calls == {key: float(n) for key, n in logged.items()}
    assert calls[("cstp.listDecisions", "jsonrpc", "ok")] == 2
    assert calls[("cstp.recordDecision", "jsonrpc", "ok")] == 1
    assert calls[("cstp.getDecision", "jsonrpc", "ok")] == 1
    assert calls[("cstp.getDecision", "jsonrpc", "-32007")] == 1
    assert calls[("cstp.recordDecision", "jsonrpc", "-32602")] == 3
    assert calls[("cstp.listDecisions", "mcp", "ok")] == 1
    assert any(face == "console" for _, face, _ in calls)

    by_method: Counter[str] = Counter()
    for (method, _, _), n in logged.items():
        by_method[method] += n
    counts = series(text, "cstp_call_duration_seconds_count", "method")
    methods = set(monitored.app.state.registry.names())
    assert {m for (m,) in counts} == methods  # every method, called or not
    assert {m: n for (m,), n in counts.items() if n} == {m: float(n) for m, n in by_method.items()}
    buckets = series(text, "cstp_call_duration_seconds_bucket", "method", "le")
    sums = series(text, "cstp_call_duration_seconds_sum", "method")
    for (method,), n in counts.items():
        mine = sorted((float(le), value) for (m, le), value in buckets.items() if m == method)
        assert [le for le, _ in mine][:2] == [0.001, 0.002] and mine[-1][0] == float("inf")
        assert [v for _, v in mine] == sorted(v for _, v in mine)  # cumulative
        assert mine[-1][1] == n
        assert (sums[(method,)] > 0) == (n > 0)
    assert series(text, "cstp_rate_limit_refusals_total", "method") == {}


async def test_rate_limit_refusals_are_counted_by_method(
    settings: Settings, embedder: Embedder
) -> None:
    tight = dataclasses.replace(
        settings, rate_limits=parse_rate_limits("default=100000/1,cstp.listGuardrails=1/60")
    )
    async with serve_app(create_app(tight, embedder=embedder)) as client:
        add_token(client, MONITOR, "prom", "monitor")
        rpc = Rpc(client)
        await rpc.ok("cstp.listGuardrails", {})
        for _ in range(2):
            assert (await rpc.error("cstp.listGuardrails", {}))["code"] == -32002
        text = await scrape(client)
    assert series(text, "cstp_rate_limit_refusals_total", "method") == {
        ("cstp.listGuardrails",): 2.0
    }
    calls = series(text, "cstp_calls_total", "method", "face", "code")
    assert calls[("cstp.listGuardrails", "jsonrpc", "-32002")] == 2


async def test_each_app_counts_its_own_calls(
    monitored: AppClient, rpc: Rpc, settings: Settings, embedder: Embedder
) -> None:
    """Apps built in one process (the tests') keep a registry each."""
    await rpc.ok("cstp.listDecisions", {})
    async with serve_app(create_app(settings, embedder=embedder)) as other:
        add_token(other, MONITOR, "prom", "monitor")
        assert series(await scrape(other), "cstp_calls_total", "method", "face", "code") == {}
    assert series(await scrape(monitored), "cstp_calls_total", "method", "face", "code") == {
        ("cstp.listDecisions", "jsonrpc", "ok"): 1.0
    }


# ---- guardrails and approvals -------------------------------------------------------------------


@pytest.fixture
async def guarded(
    settings: Settings, embedder: Embedder, tmp_path: Path
) -> AsyncIterator[tuple[AppClient, dict[str, Any]]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "metrics.yaml").write_text(RULES, encoding="utf-8")
    clock = {"now": Runtime().now()}
    app = create_app(
        dataclasses.replace(settings, guardrails_dir=rules),
        runtime=Runtime(now=lambda: clock["now"]),
        embedder=embedder,
    )
    async with serve_app(app) as client:
        add_token(client, MONITOR, "prom", "monitor")
        add_token(client, "token-carol", "carol", "approver")
        yield client, clock


async def test_guardrail_verdicts_by_rule_mode_and_verdict_and_approvals_by_status(
    guarded: tuple[AppClient, dict[str, Any]],
) -> None:
    client, clock = guarded
    rpc = Rpc(client)
    risky = {"description": "Ship the risky change", "stakes": "high", "confidence": 0.3}
    for _ in range(2):
        answer = await rpc.ok("cstp.checkGuardrails", {"action": risky})
        assert answer["allowed"] is False
    pay = {"description": "Pay the supplier", "context": {"amount": 5000}}
    assert (await rpc.ok("cstp.checkGuardrails", {"action": pay}))["allowed"] is True

    async def escalate() -> str:
        deploy = {"description": "Deploy billing", "context": {"deploy": True}}
        answer = await rpc.ok("cstp.checkGuardrails", {"action": deploy})
        return str(answer["escalation"]["approvalId"])

    approved, expiring = await escalate(), await escalate()
    await rpc.ok("cstp.decideApproval", {"id": approved, "verdict": "approve"}, "token-carol")
    clock["now"] += timedelta(minutes=31)  # the second one's deadline has passed
    denied, pending = await escalate(), await escalate()
    await rpc.ok("cstp.decideApproval", {"id": denied, "verdict": "deny"}, "token-carol")

    text = await scrape(client)
    verdicts = series(text, "cstp_guardrail_verdicts_total", "rule", "mode", "verdict")
    assert verdicts == {
        ("no-high-stakes-low-confidence", "enforce", "block"): 2.0,
        ("prefer-staged-rollout", "enforce", "warn"): 2.0,
        ("trial-payments", "shadow", "block"): 1.0,
        ("deploy-approval", "enforce", "escalate"): 4.0,
    }
    approvals = series(text, "cstp_approvals", "status")
    assert approvals == {
        ("pending",): 1.0,
        ("approved",): 1.0,
        ("denied",): 1.0,
        ("expired",): 1.0,
    }
    for (status,), n in approvals.items():  # what listApprovals counts, status by status
        listed = await rpc.ok("cstp.listApprovals", {"status": status}, "token-carol")
        assert listed["total"] == n, status
    assert expiring and pending


# ---- what the database holds --------------------------------------------------------------------


async def test_outbox_webhook_chain_and_dependency_series_match_the_database(
    settings: Settings, embedder: Embedder, database_url: str
) -> None:
    # The background relay off: a pending event stays pending until the test looks.
    quiet = dataclasses.replace(settings, relay_enabled=False)
    async with serve_app(create_app(quiet, embedder=embedder)) as client:
        add_token(client, MONITOR, "prom", "monitor")
        rpc = Rpc(client)
        for n in range(3):
            await rpc.ok("cstp.recordDecision", {**SEED_DECISION, "decision": f"Choice {n}"})
        services = client.app.state.services
        await services.relay.flush()  # the inline passes' results recorded: all done
        assert await admin.counts(services) == {"pending": 0, "dead": 0, "done": 6}
        await run_sql(
            database_url,
            "UPDATE outbox_events SET status = 'dead', last_error = 'for the test' "
            "WHERE id = (SELECT min(id) FROM outbox_events)",
        )
        await run_sql(
            database_url,
            "UPDATE outbox_events SET status = 'pending' "
            "WHERE id = (SELECT max(id) FROM outbox_events)",
        )
        text = await scrape(client)
        totals = await admin.counts(services)  # what `cstp outbox` and /ready show
        ready = (await client.get("/ready")).json()

    events = series(text, "cstp_outbox_events", "kind", "status")
    rows = await run_sql(
        database_url, "SELECT kind, status, count(*) AS n FROM outbox_events GROUP BY kind, status"
    )
    assert {k: v for k, v in events.items() if v} == {
        (r["kind"], r["status"]): float(r["n"]) for r in rows
    }
    assert {(kind, status) for kind in ("export", "index") for status in totals} <= set(events)
    for status, n in totals.items():
        assert sum(v for (_, s), v in events.items() if s == status) == n, status
    assert (totals["dead"], totals["pending"]) == (1, 1)

    assert series(text, "cstp_webhook_deliveries", "status") == {
        (status,): float(n) for status, n in ready["checks"]["webhooks"].items()
    }
    head = await run_sql(database_url, "SELECT max(seq) AS seq FROM audit_chain")
    assert series(text, "cstp_audit_chain_head_seq") == {(): float(head[0]["seq"])}
    assert head[0]["seq"] >= 6  # three decisions and their evaluations
    assert series(text, "cstp_dependency_up", "dependency") == {
        ("database",): 1.0,
        ("index",): 1.0,  # no redis: the limits are in memory
    }


async def test_a_dependency_down_is_zero_and_the_database_series_are_left_out(
    monitored: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = monitored.app.state.services

    async def down() -> None:
        raise ConnectionRefusedError("the test took it down")

    monkeypatch.setattr(services.db, "ping", down)
    text = await scrape(monitored)
    assert series(text, "cstp_dependency_up", "dependency") == {
        ("database",): 0.0,
        ("index",): 1.0,
    }
    assert not names(text) & {"cstp_outbox_events", "cstp_approvals", "cstp_audit_chain_head_seq"}


# ---- the chain verification ---------------------------------------------------------------------


async def verified(client: AppClient) -> str:
    async def done() -> tuple[bool, Any]:
        text = await scrape(client)
        return "cstp_audit_chain_verified_timestamp_seconds" in names(text), text

    text: str = await poll_until(done, 60, "the chain verified at start", interval=0.1)
    return text


async def test_the_chain_series_appear_once_verified_and_count_its_problems(
    monitored: AppClient, settings: Settings, embedder: Embedder, database_url: str
) -> None:
    chain_series = {
        "cstp_audit_chain_problems",
        "cstp_audit_chain_verified_timestamp_seconds",
    }
    assert not names(await scrape(monitored)) & chain_series  # never verified: absent
    assert "cstp_audit_chain_head_seq" in names(await scrape(monitored))
    # ... and the server says it never will (so the alerts on them stay silent)
    interval = "cstp_audit_chain_verify_interval_seconds"
    assert series(await scrape(monitored), interval) == {(): 0.0}

    every_hour = dataclasses.replace(settings, audit_verify_seconds=3600)
    before = time.time()
    async with serve_app(create_app(every_hour, embedder=embedder)) as client:
        add_token(client, MONITOR, "prom", "monitor")
        text = await verified(client)
    assert series(text, "cstp_audit_chain_problems") == {(): 0.0}
    assert series(text, interval) == {(): 3600.0}
    (stamp,) = series(text, "cstp_audit_chain_verified_timestamp_seconds").values()
    assert before <= stamp <= time.time()

    # A token widened behind the server's back (its triggers dropped first): one problem.
    made = json.loads(await cstp(database_url, "tokens", "create", "--agent", "kim", "--json"))
    drops = (
        ["DROP TRIGGER IF EXISTS trg_api_tokens_no_update"]
        if database_url.startswith("sqlite")
        else ["DROP TRIGGER IF EXISTS trg_api_tokens_revoke_only ON api_tokens"]
    )
    for statement in (*drops, f"UPDATE api_tokens SET role = 'auditor' WHERE id = '{made['id']}'"):
        await run_sql(database_url, statement)
    async with serve_app(create_app(every_hour, embedder=embedder)) as client:
        add_token(client, MONITOR, "prom", "monitor")
        text = await verified(client)
    assert series(text, "cstp_audit_chain_problems") == {(): 1.0}


# ---- the route ----------------------------------------------------------------------------------


async def test_metrics_needs_a_token_with_the_metrics_scope(
    client: AppClient, database_url: str
) -> None:
    missing = await client.get("/metrics")
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert missing.json()["error"] == "unauthorized"
    unknown = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert unknown.status_code == 401
    agent = await client.get("/metrics", headers={"Authorization": "Bearer token-alice"})
    assert agent.status_code == 403 and agent.json()["error"] == "forbidden"
    assert "cstp_" not in agent.text

    prom = await token(database_url, "prom", "--role", "monitor")
    text = await scrape(client, prom)
    assert "cstp_dependency_up" in names(text)
    # the monitor's token reads the metrics and calls nothing
    denied = await Rpc(client).error("cstp.listDecisions", {}, token=prom)
    assert denied["code"] == -32010
    auditor = await token(database_url, "audra", "--role", "auditor")
    answer = await client.get("/metrics", headers={"Authorization": f"Bearer {auditor}"})
    assert answer.status_code == 403


# ---- several server processes (Postgres) --------------------------------------------------------


def server_settings(database_url: str, folder: Path, n: int, **more: str) -> dict[str, str]:
    return {
        "CSTP_DATABASE_URL": database_url,
        "CSTP_AUTH_TOKENS": "alice:token-alice",
        "CSTP_RATE_LIMITS": "default=100000/1",
        "CSTP_DATA_DIR": str(folder / f"data{n}"),
        "CSTP_DECISIONS_DIR": str(folder / f"decisions{n}"),
        "CSTP_LOG_LEVEL": "WARNING",
        "CSTP_AUDIT_KEY": "",
        **more,
    }


LIST = {"jsonrpc": "2.0", "id": 1, "method": "cstp.listDecisions", "params": {}}
ALICE = {"Authorization": "Bearer token-alice"}


@pytest.mark.slow
async def test_the_scrapes_of_two_servers_add_up_to_the_calls_made(
    database_url: str, tmp_path: Path
) -> None:
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    prom = await token(database_url, "prom", "--role", "monitor")
    settings = [server_settings(database_url, tmp_path, n) for n in range(2)]
    made = (3, 5)
    with cstp_servers(tmp_path, settings) as bases:
        async with httpx.AsyncClient(timeout=30) as http:
            for base, n in zip(bases, made, strict=True):
                for _ in range(n):
                    answer = await http.post(f"{base}/cstp", json=LIST, headers=ALICE)
                    assert "result" in answer.json(), answer.text
            texts = []
            for base in bases:
                answer = await http.get(
                    f"{base}/metrics", headers={"Authorization": f"Bearer {prom}"}
                )
                assert answer.status_code == 200, answer.text
                texts.append(answer.text)
    counted = [
        series(text, "cstp_calls_total", "method", "face", "code").get(
            ("cstp.listDecisions", "jsonrpc", "ok"), 0.0
        )
        for text in texts
    ]
    assert counted == [3.0, 5.0] and sum(counted) == sum(made)
    # what both read from the one database is the same, not added up
    heads = [series(text, "cstp_audit_chain_head_seq") for text in texts]
    assert heads[0] == heads[1]


@pytest.mark.slow
async def test_one_scrape_counts_every_worker_of_a_server(
    database_url: str, tmp_path: Path, chroma_server: ChromaServer
) -> None:
    """``cstp serve --workers 2``: a scrape, answered by either worker, counts the calls
    both served (the library's multiprocess mode, in the directory serve prepares), and
    the series read from the database once, not once per worker."""
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    chroma_server.start()
    prom = {"Authorization": f"Bearer {await token(database_url, 'prom', '--role', 'monitor')}"}
    own = server_settings(database_url, tmp_path, 0, CSTP_CHROMA_URL=chroma_server.url)
    with cstp_servers(tmp_path, [own], ["--workers", "2"]) as (base,):
        port = base.rsplit(":", 1)[1]
        shared = tmp_path / "data0" / "metrics" / f"port-{port}"
        made = 0

        async def both_counted() -> tuple[bool, Any]:
            nonlocal made
            # a connection of its own per call: the kernel hands each to either worker
            async with httpx.AsyncClient(timeout=30) as http:
                answer = await http.post(f"{base}/cstp", json=LIST, headers=ALICE)
            assert "result" in answer.json(), answer.text
            made += 1
            counting = sorted(p.name for p in shared.glob("counter_*.db"))
            return len(counting) >= 2, counting

        await poll_until(both_counted, 120, "calls served by both workers", interval=0)
        for _ in range(4):  # each scrape, whichever worker answers it, counts them all
            async with httpx.AsyncClient(timeout=30) as http:
                answer = await http.get(f"{base}/metrics", headers=prom)
            assert answer.status_code == 200, answer.text
            calls = series(answer.text, "cstp_calls_total", "method", "face", "code")
            assert calls == {("cstp.listDecisions", "jsonrpc", "ok"): float(made)}
            counts = series(answer.text, "cstp_call_duration_seconds_count", "method")
            assert counts[("cstp.listDecisions",)] == made
            assert series(answer.text, "cstp_dependency_up", "dependency") == {
                ("database",): 1.0,
                ("index",): 1.0,
            }
            head = await run_sql(database_url, "SELECT max(seq) AS seq FROM audit_chain")
            assert series(answer.text, "cstp_audit_chain_head_seq") == {
                (): float(head[0]["seq"] or 0)
            }
