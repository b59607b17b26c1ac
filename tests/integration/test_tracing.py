"""OpenTelemetry traces, as a collector receives them: the real app, with the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP receiver in the test, the SDK's own
exporter sending protobuf to it. A call that carries a W3C ``traceparent`` (an HTTP header
on /cstp and the console, ``_meta`` on MCP) continues the caller's trace; its span is named
by the GenAI conventions' operation and names the audit row it wrote and that row's chain
entry, as the database has them; the callers' texts are in no span unless
CSTP_TRACE_CONTENT is on."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from app.asgi import create_app
from app.audit.chain import CHAIN
from app.config import Settings
from app.observability import spans
from app.search.embedder import Embedder
from support.app import SEED_DECISION, AppClient, serve_app

# The otel extra (in the test extra): its exporter sends, its protocol messages decode.
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed"
)
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

from support.otlp import ERROR_STATUS, SERVER_KIND, OtlpReceiver, ReceivedSpan

SECRET_INTENT = "Rotate the payroll signing key kept in vault path kv/payroll-7731"
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_PROPAGATORS",
)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    got = OtlpReceiver().start()
    try:
        yield got
    finally:
        got.stop()


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver) -> None:
    """Only the endpoint set, as an operator would: every other OTEL_* at its default."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    # every child span, however quick its work (the server keeps only the slow ones)
    monkeypatch.setattr(spans, "SLOW_CHILD_NS", 0)


async def traced_app(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    async with serve_app(create_app(settings, embedder=embedder)) as http:
        yield http


@pytest.fixture
async def traced(
    otel_env: None, settings: Settings, embedder: Embedder
) -> AsyncIterator[AppClient]:
    async for http in traced_app(settings, embedder):
        yield http


@pytest.fixture
async def traced_with_content(
    otel_env: None, settings: Settings, embedder: Embedder
) -> AsyncIterator[AppClient]:
    async for http in traced_app(replace(settings, trace_content=True), embedder):
        yield http


def traceparent() -> tuple[str, str, str]:
    """A caller's trace: (its traceparent header, trace id, parent span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def call(
    http: AppClient, method: str, params: dict[str, Any], header: str | None = None
) -> Any:
    headers = {"Authorization": "Bearer token-alice"}
    if header is not None:
        headers["traceparent"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = (await http.post("/cstp", json=body, headers=headers)).json()
    return answer.get("result", answer.get("error"))


async def flushed(http: AppClient, receiver: OtlpReceiver) -> list[ReceivedSpan]:
    """Every span the app has ended, as received: the batch processor flushed (no sleep)."""
    tracing = http.app.state.tracing
    assert await asyncio.to_thread(tracing.force_flush)
    return receiver.received()


def named(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


async def sql(http: AppClient, statement: str, **values: Any) -> Any:
    """One row of a read, straight from the database."""
    services = http.app.state.services
    return await services.db.read(lambda conn: conn.execute(text(statement), values).one())


async def chain_seq(http: AppClient, table: str, row_id: str) -> int:
    statement = f"SELECT seq FROM {CHAIN.name} WHERE table_name = :t AND row_id = :r"
    return int((await sql(http, statement, t=table, r=row_id))[0])


def strings_in(spans: list[ReceivedSpan]) -> list[str]:
    return [
        str(value)
        for span in spans
        for value in [span.name, span.status_message, *span.attributes.values()]
    ]


async def test_an_announcement_continues_the_callers_trace_with_its_audit_row(
    traced: AppClient, receiver: OtlpReceiver
) -> None:
    await call(traced, "cstp.recordDecision", SEED_DECISION)
    header, trace_id, parent = traceparent()
    result = await call(traced, "cstp.announceIntent", {"intent": SECRET_INTENT}, header)
    assert result["received"] is True, result
    spans = await flushed(traced, receiver)
    mine = receiver.trace(trace_id)

    announce = named(mine, "search_memory cstp.announceIntent")
    assert (announce.parent_id, announce.kind) == (parent, SERVER_KIND)
    attributes = announce.attributes
    assert attributes["gen_ai.operation.name"] == "search_memory"
    assert attributes["rpc.method"] == "cstp.announceIntent"
    assert attributes["rpc.system"] == "jsonrpc"
    assert (attributes["cstp.workspace"], attributes["cstp.agent"]) == ("default", "alice")
    assert attributes["cstp.correlation_id"] == result["correlationId"]
    intent_id = attributes["cstp.intent.id"]
    assert (attributes["cstp.audit.table"], attributes["cstp.audit.row_id"]) == (
        "intents",
        intent_id,
    )
    row = await sql(
        traced,
        "SELECT agent, correlation_id, evaluation_id FROM intents WHERE id = :id",
        id=intent_id,
    )
    assert (row.agent, row.correlation_id) == ("alice", result["correlationId"])
    assert attributes["cstp.audit.seq"] == await chain_seq(traced, "intents", intent_id)
    assert attributes["gen_ai.memory.record.count"] == len(result["similarDecisions"]) == 1
    assert attributes["gen_ai.memory.store.id"] == "default"

    guardrail = named(mine, "apply_guardrail")
    assert guardrail.parent_id == announce.span_id
    assert guardrail.attributes["gen_ai.operation.name"] == "apply_guardrail"
    assert guardrail.attributes["cstp.evaluation.id"] == row.evaluation_id
    stored = await sql(
        traced,
        "SELECT rule_set_version, rule_set_hash FROM guardrail_evaluations WHERE id = :id",
        id=row.evaluation_id,
    )
    assert guardrail.attributes["cstp.guardrail.rule_set_version"] == stored.rule_set_version
    assert guardrail.attributes["cstp.guardrail.rule_set_hash"] == stored.rule_set_hash
    assert guardrail.attributes["gen_ai.guardrail.policy.id"] == stored.rule_set_hash
    assert guardrail.attributes["gen_ai.guardrail.result.value"] == (
        "true" if result["guardrailStatus"]["allowed"] else "false"
    )

    # the embedder, the index and the database, in the call's trace
    names = {s.name for s in mine}
    assert any(name.startswith("embeddings ") for name in names), names
    assert {"query decisions", "SELECT", "COMMIT"} <= names, names
    assert announce.resource["service.name"] == "cstp-server"

    # no intent text anywhere, in any span of any call
    assert not any("payroll" in value for value in strings_in(spans))


async def test_with_content_on_the_texts_are_in_the_spans(
    traced_with_content: AppClient, receiver: OtlpReceiver
) -> None:
    header, trace_id, _ = traceparent()
    await call(traced_with_content, "cstp.announceIntent", {"intent": SECRET_INTENT}, header)
    await flushed(traced_with_content, receiver)
    mine = receiver.trace(trace_id)
    announce = named(mine, "search_memory cstp.announceIntent")
    assert announce.attributes["gen_ai.memory.query.text"] == SECRET_INTENT
    assert named(mine, "apply_guardrail").attributes["cstp.action.description"] == SECRET_INTENT


async def test_a_recorded_decision_is_a_create_memory_span_with_its_chain_entry(
    traced: AppClient, receiver: OtlpReceiver
) -> None:
    header, trace_id, parent = traceparent()
    result = await call(traced, "cstp.recordDecision", SEED_DECISION, header)
    await flushed(traced, receiver)
    mine = receiver.trace(trace_id)
    recorded = named(mine, "create_memory cstp.recordDecision")
    assert recorded.parent_id == parent
    assert recorded.attributes["gen_ai.memory.record.id"] == result["id"]
    assert recorded.attributes["cstp.audit.row_id"] == result["id"]
    assert recorded.attributes["cstp.audit.seq"] == await chain_seq(
        traced, "decisions", result["id"]
    )
    assert named(mine, "apply_guardrail").parent_id == recorded.span_id
    assert "upsert decisions" in {s.name for s in mine}  # the outbox pass it waited for
    assert not any(SEED_DECISION["decision"] in value for value in strings_in(mine))


async def test_checks_reviews_and_failures(traced: AppClient, receiver: OtlpReceiver) -> None:
    """checkGuardrails is an apply_guardrail span of its own evaluation; a review an
    update_memory span of its review row; a refused call an error with its code, not text."""
    recorded = await call(traced, "cstp.recordDecision", SEED_DECISION)
    checked = await call(traced, "cstp.checkGuardrails", {"action": {"description": "Deploy"}})
    await call(traced, "cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"})
    refused = await call(traced, "cstp.recordDecision", {**SEED_DECISION, "confidence": 7})
    assert refused["code"] == -32602
    spans = await flushed(traced, receiver)

    check = named(spans, "apply_guardrail cstp.checkGuardrails")
    evaluation = checked["evaluationId"]
    assert check.attributes["cstp.evaluation.id"] == evaluation
    assert check.attributes["cstp.guardrail.rule_set_version"] == checked["ruleSetVersion"]
    assert check.attributes["cstp.audit.seq"] == await chain_seq(
        traced, "guardrail_evaluations", evaluation
    )
    assert not [s for s in spans if s.name == "apply_guardrail" and s.parent_id == check.span_id]

    review = named(spans, "update_memory cstp.reviewDecision")
    assert review.attributes["gen_ai.memory.record.id"] == recorded["id"]
    row_id = review.attributes["cstp.audit.row_id"]
    assert review.attributes["cstp.audit.table"] == "decision_reviews"
    decision = await sql(
        traced, "SELECT decision_id FROM decision_reviews WHERE id = :id", id=int(row_id)
    )
    assert decision[0] == recorded["id"]
    assert review.attributes["cstp.audit.seq"] == await chain_seq(
        traced, "decision_reviews", row_id
    )

    failed = [s for s in spans if s.status == ERROR_STATUS and s.kind == SERVER_KIND]
    assert [s.name for s in failed] == ["create_memory cstp.recordDecision"]
    assert failed[0].attributes["rpc.jsonrpc.error_code"] == -32602
    assert failed[0].attributes["error.type"] == "-32602"
    assert failed[0].status_message == "Invalid params"


async def test_an_mcp_tool_call_continues_the_trace_in_its_meta(
    traced: AppClient, receiver: OtlpReceiver
) -> None:
    header, trace_id, parent = traceparent()
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "query_decisions",
            "arguments": {"query": "database for agent memory"},
            "_meta": {"traceparent": header},
        },
    }
    headers = {
        "Authorization": "Bearer token-alice",
        "Accept": "application/json, text/event-stream",
        "Host": "127.0.0.1:9991",
    }
    answer = await traced.post("/mcp", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert "error" not in answer.json(), answer.text
    await flushed(traced, receiver)
    query = named(receiver.trace(trace_id), "search_memory cstp.queryDecisions")
    assert query.parent_id == parent
    assert (query.attributes["cstp.face"], query.attributes["rpc.system"]) == ("mcp", "mcp")
    assert query.attributes["gen_ai.memory.record.count"] == 0


async def test_a_console_page_continues_the_trace_in_its_header(
    traced: AppClient, receiver: OtlpReceiver
) -> None:
    form = await traced.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    await traced.post("/console/login", data={"token": "token-alice", "csrf": csrf.group(1)})
    header, trace_id, parent = traceparent()
    page = await traced.get("/console/decisions", headers={"traceparent": header})
    assert page.status_code == 200
    await flushed(traced, receiver)
    listed = named(receiver.trace(trace_id), "cstp.listDecisions")
    assert listed.parent_id == parent
    assert listed.attributes["cstp.face"] == "console"
    assert "rpc.system" not in listed.attributes
