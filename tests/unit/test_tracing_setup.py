"""When traces are on, and what a setting that asks for traces this installation cannot send
does: stop the start with a message that says what to install or set. Without OpenTelemetry
at all, the module still loads, and ``current_ids`` (which log lines read) answers None."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import ConfigError, Settings
from app.observability import calls, exporters, spans, tracing

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "cstp"}, False),  # naming the service asks for nothing
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", **ENDPOINT}, False),
        ({"OTEL_SDK_DISABLED": "true", **ENDPOINT}, False),
        ({"OTEL_SDK_DISABLED": "false", **ENDPOINT}, True),
    ],
)
def test_traces_are_on_only_when_the_standard_variables_ask(env: dict[str, str], on: bool) -> None:
    assert exporters.wanted(env) is on
    assert (tracing.from_env(False, env) is not None) is on


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_an_exporter_this_server_cannot_use_stops_the_start(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        tracing.from_env(False, env)


def test_without_opentelemetry_the_module_loads_and_asking_for_traces_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    path = Path(tracing.__file__)
    spec = importlib.util.spec_from_file_location("tracing_without_otel", path)
    assert spec is not None and spec.loader is not None
    bare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bare)
    assert bare.HAVE_OTEL is False
    assert bare.current_ids() is None
    assert bare.from_env(False, {}) is None
    with pytest.raises(ConfigError, match=r"cstp-server\[otel\].*OTEL_SDK_DISABLED=true"):
        bare.from_env(False, ENDPOINT)


def test_current_ids_outside_a_span_is_none() -> None:
    assert tracing.current_ids() is None


@pytest.mark.parametrize(
    ("raw", "content"), [(None, False), ("true", True), ("1", True), ("false", False)]
)
def test_trace_content_setting(raw: str | None, content: bool) -> None:
    env = {} if raw is None else {"CSTP_TRACE_CONTENT": raw}
    assert Settings.from_env(env).trace_content is content


def test_a_trace_content_value_that_is_no_boolean_is_refused() -> None:
    with pytest.raises(ConfigError, match="CSTP_TRACE_CONTENT"):
        Settings.from_env({"CSTP_TRACE_CONTENT": "maybe"})


def in_memory(content: bool = False) -> tuple[tracing.Tracing, InMemorySpanExporter]:
    """A started tracer whose spans are kept in memory (``force_flush`` exports them)."""
    from opentelemetry.sdk.resources import Resource

    exporter = InMemorySpanExporter()
    made = tracing.Tracing(Resource.create({}), [exporter], content)
    made.start()
    return made, exporter


def finished(made: tracing.Tracing, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    assert made.force_flush()
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_row_learns_its_chain_seq_whether_it_is_named_before_or_after_the_commit() -> None:
    """A handler names its row before its transaction commits (a review, in the runner's
    transaction) or after (recordDecision learns its decision's id from the group writer):
    the span gets the row's chain sequence number either way, and a row never committed
    leaves nothing behind."""
    from app.audit.tables import Covered

    made, exporter = in_memory()

    def call(name: str) -> calls.CallSpan:
        return calls.CallSpan(made, name, {}, None)

    with call("before") as before:
        before.row("decision_reviews", "41")
        calls.committed(
            [Covered("decision_reviews", "41", "d1"), Covered("decisions", "ab12cd34", "d2")], 7
        )
    with call("after") as after:
        after.row("decisions", "ab12cd34")
    with call("never") as never:
        never.row("intents", "not-committed")
    assert ("intents", "not-committed") not in calls._watching
    kept = finished(made, exporter).items()
    seqs = {name: (s.attributes or {}).get("cstp.audit.seq") for name, s in kept}
    assert seqs == {"before": 7, "after": 8, "never": None}


async def test_a_calls_spans_are_made_once_no_call_runs_with_the_ids_its_logs_carry() -> None:
    """A call only takes notes while it runs: its span is made once no traced call runs
    (never while another caller waits for its answer), with the call's own start and end and
    the trace and span ids that its log lines named while it ran."""
    import asyncio

    made, exporter = in_memory()
    exported = exporter.get_finished_spans

    async def spans_made(count: int, tries: int = 100) -> bool:
        for _ in range(tries):
            assert made.provider is not None and made.provider.force_flush()
            if len(exported()) >= count:
                return True
            await asyncio.sleep(tracing.IDLE_CHECK)
        return False

    before = time.time_ns()
    with calls.CallSpan(made, "search_memory cstp.queryDecisions", {}, "search_memory"):
        ids = tracing.current_ids()
        with calls.CallSpan(made, "other", {}, None):  # a call that runs on (its own task's)
            await asyncio.sleep(0.002)
            first = time.time_ns()
        assert not await spans_made(1, tries=20)  # not while a call runs
    after = time.time_ns()
    assert ids is not None and tracing.current_ids() is None
    assert await spans_made(2)
    span = finished(made, exporter)["search_memory cstp.queryDecisions"]
    assert (format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")) == ids
    assert span.start_time is not None and span.end_time is not None
    assert before <= span.start_time and first <= span.end_time <= after


def test_cstp_mcp_passes_a_tool_calls_trace_context_on_as_headers() -> None:
    from app.mcp.stdio import trace_headers

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    meta = {"traceparent": parent, "tracestate": "bad\r\nX-Injected: 1", "progressToken": 3}
    assert trace_headers(meta) == {"traceparent": parent}
    assert trace_headers(None) == {}


def test_child_spans_are_kept_for_slow_or_failed_work_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick read costs the call a span and tells nobody where time went: a child span is
    made after its work, and only when that work was slow or failed, under the call's span
    and with the work's own start and end."""
    made, exporter = in_memory()
    monkeypatch.setattr(spans, "SLOW_CHILD_NS", 5_000_000)
    with calls.CallSpan(made, "call", {}, None):
        with spans.span("SELECT", {"db.operation.name": "SELECT"}):
            pass
        with spans.span("embeddings model"):
            time.sleep(0.01)
        with pytest.raises(ValueError), spans.span("query decisions"):
            raise ValueError("the index is down")
        commit = spans.started("COMMIT", {"db.operation.name": "COMMIT"})
        assert commit is not None
        spans.ended(commit, ok=False)
    kept = finished(made, exporter)
    assert set(kept) == {"call", "embeddings model", "query decisions", "COMMIT"}
    slow = kept["embeddings model"]
    assert slow.parent is not None and slow.parent.span_id == kept["call"].context.span_id
    assert slow.end_time is not None and slow.start_time is not None
    assert slow.end_time - slow.start_time >= 10_000_000
    assert kept["query decisions"].attributes is not None
    assert kept["query decisions"].attributes["error.type"] == "ValueError"
    assert not kept["COMMIT"].status.is_ok
