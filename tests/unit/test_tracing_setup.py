"""When traces are on, and what a setting that asks for traces this installation cannot send
does: stop the start with a message that says what to install or set. Without OpenTelemetry
at all, the module still loads, and ``current_ids`` (which log lines read) answers None."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from app.config import ConfigError, Settings
from app.observability import spans, tracing

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
    assert tracing.wanted(env) is on
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


def test_a_row_learns_its_chain_seq_whether_it_is_named_before_or_after_the_commit() -> None:
    """A handler names its row before its transaction commits (a review, in the runner's
    transaction) or after (recordDecision learns its decision's id from the group writer):
    the span gets the row's chain sequence number either way, and a row never committed
    leaves nothing behind."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from app.audit.tables import Covered

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    def call(name: str) -> tracing.CallSpan:
        return tracing.CallSpan(tracer, tracer.start_span(name), None, False)

    with call("before") as before:
        before.row("decision_reviews", "41")
        tracing.committed(
            [Covered("decision_reviews", "41", "d1"), Covered("decisions", "ab12cd34", "d2")], 7
        )
    with call("after") as after:
        after.row("decisions", "ab12cd34")
    with call("never") as never:
        never.row("intents", "not-committed")
    assert ("intents", "not-committed") not in tracing._watching
    seqs = {s.name: s.attributes.get("cstp.audit.seq") for s in exporter.get_finished_spans()}
    assert seqs == {"before": 7, "after": 8, "never": None}


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
    import time

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(spans, "SLOW_CHILD_NS", 5_000_000)
    with tracing.CallSpan(tracer, tracer.start_span("call"), None, False):
        with spans.span("SELECT", {"db.operation.name": "SELECT"}):
            pass
        with spans.span("embeddings model"):
            time.sleep(0.01)
        with pytest.raises(ValueError), spans.span("query decisions"):
            raise ValueError("the index is down")
        commit = spans.started("COMMIT", {"db.operation.name": "COMMIT"})
        assert commit is not None
        spans.ended(commit, ok=False)
    made = {s.name: s for s in exporter.get_finished_spans()}
    assert set(made) == {"call", "embeddings model", "query decisions", "COMMIT"}
    slow = made["embeddings model"]
    assert slow.parent is not None and slow.parent.span_id == made["call"].context.span_id
    assert slow.end_time is not None and slow.start_time is not None
    assert slow.end_time - slow.start_time >= 10_000_000
    assert made["query decisions"].attributes["error.type"] == "ValueError"
    assert not made["COMMIT"].status.is_ok
