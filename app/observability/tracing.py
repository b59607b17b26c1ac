"""OpenTelemetry traces: a span per call of every face, in the GenAI conventions' names.

Off unless the standard variables ask for it (``wanted``): ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``, everything else the
OpenTelemetry SDK reads itself (headers, sampler, batch sizes, resource attributes). Off, the
runner holds no ``Tracing`` and a call costs one ``is None``; the helpers here (``span``,
``CallSpan``) are then never reached or return at their first line.

On, the runner opens a ``CallSpan`` around each call (``Tracing.call``): the span is current
for the call's task, so spans made anywhere below it (``span``: the database, the embedder,
the vector index) are its children. A handler names what it wrote through its
``CallContext`` (``trace``, ``trace_row``), and the audit chain tells this module the
sequence number of that row's entry once it is committed (``committed``). Which attributes
each span carries: docs/ARCHITECTURE.md, "Tracing".

The base install has the OpenTelemetry API (through chromadb); ``current_ids`` works, and
answers None, without it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from litestar.enums import ScopeType

from app.config import ConfigError
from app.observability.spans import _current, child, clip, failed
from app.version import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind

    HAVE_OTEL = True
except ImportError:  # no OpenTelemetry at all: tracing cannot be on (``from_env``)
    HAVE_OTEL = False

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Receive, Scope, Send
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from app.audit.tables import Covered
    from app.scopes import Principal

DEFAULT_SERVICE = "cstp-server"
INSTALL_HINT = "pip install 'cstp-server[otel]'"

#: The GenAI semantic conventions' operation of each CSTP method that has one.
GENAI_OPERATIONS = {
    "cstp.checkGuardrails": "apply_guardrail",
    "cstp.queryDecisions": "search_memory",
    "cstp.announceIntent": "search_memory",
    "cstp.recordDecision": "create_memory",
    "cstp.reviewDecision": "update_memory",
}
APPLY_GUARDRAIL = "apply_guardrail"


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id, in lower-case hex (32 and 16 digits), for a
    log line; None outside a span, or without OpenTelemetry. A task that a call started and
    that outlives it (a batch's worker) still holds a copy of that call's context: once the
    call has ended, None there too."""
    if not HAVE_OTEL:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    call = _current.get()
    if call is not None and not call.open:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


# ---------------------------------------------------------------- configuration


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    return [n.strip().lower() for n in raw.split(",") if n.strip() and n.strip() != "none"]


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard variables turn traces on: an OTLP endpoint or an exporter is
    named (and the SDK is not disabled, nor the exporter ``none``)."""
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    named = any(
        env.get(name)
        for name in (
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )
    return named and bool(_exporter_names(env))


def from_env(content: bool, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The server's tracing as the ``OTEL_*`` variables ask (None: off). Raises ConfigError
    when they ask for traces this installation cannot send, naming what to install or set.
    ``content``: CSTP_TRACE_CONTENT."""
    env = os.environ if env is None else env
    if not wanted(env):
        return None
    if not HAVE_OTEL:
        raise ConfigError(_missing("OpenTelemetry is not installed"))
    return Tracing(_resource(env), [_exporter(name, env) for name in _exporter_names(env)], content)


def _missing(what: str) -> str:
    return (
        f"OTEL_* variables ask for traces but {what}: {INSTALL_HINT}, or set "
        "OTEL_SDK_DISABLED=true to run without traces"
    )


def _resource(env: Mapping[str, str]) -> Any:
    """The SDK's resource from OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, named
    ``cstp-server`` when neither names the service."""
    try:
        from opentelemetry.sdk.resources import (  # noqa: PLC0415  (the otel extra, on only)
            SERVICE_NAME,
            SERVICE_VERSION,
            Resource,
        )
    except ImportError:
        raise ConfigError(_missing("the OpenTelemetry SDK is not installed")) from None
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE}))
    return resource


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    """The span exporter OTEL_TRACES_EXPORTER names; ``otlp`` speaks the protocol that
    OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL names (``http/protobuf`` unless set). It reads its
    endpoint, headers, timeout and compression from the environment itself."""
    if name == "console":
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415  (on only)
            ConsoleSpanExporter,
        )

        return ConsoleSpanExporter(service_name=DEFAULT_SERVICE)
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,  # (the otel extra, on only)
            )
        except ImportError:
            raise ConfigError(_missing("the OTLP/HTTP exporter is not installed")) from None
        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter as GrpcSpanExporter,  # (on only; chromadb brings it)
            )
        except ImportError:
            raise ConfigError(_missing("the OTLP/gRPC exporter is not installed")) from None
        return GrpcSpanExporter()
    raise ConfigError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf or grpc)"
    )


# ---------------------------------------------------------------- the server's tracer


class Tracing:
    """The tracer of one server (app): made by ``from_env`` when the app is built, started
    with the app (its batch span processors' threads) and shut down, its spans flushed,
    when the app stops."""

    def __init__(self, resource: Any, exporters: Sequence[SpanExporter], content: bool) -> None:
        self.resource = resource
        self.exporters = list(exporters)
        self.content = content  # CSTP_TRACE_CONTENT: texts in spans
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        self._names: dict[str, tuple[str, dict[str, AttributeValue]]] = {}

    def start(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415  (on only)
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        # The sampler (OTEL_TRACES_SAMPLER) and span limits come from the environment.
        provider = TracerProvider(resource=self.resource, shutdown_on_exit=False)
        for exporter in self.exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        self.provider = provider
        self.tracer = provider.get_tracer("cstp-server", __version__)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span ended so far (tests, shutdown)."""
        return self.provider is None or self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop; later calls are not traced."""
        provider, self.provider, self.tracer = self.provider, None, None
        if provider is not None:
            provider.shutdown()

    def continued(self, carrier: Mapping[str, Any]) -> AbstractContextManager[object]:
        """Within it, the trace context the carrier (HTTP headers, MCP ``_meta``) holds is
        current, so the calls made there continue the caller's trace (W3C ``traceparent``
        and ``tracestate``, or what OTEL_PROPAGATORS names)."""
        return _attached(propagate.extract(carrier))

    def call(self, method: str, principal: Principal, face: str) -> CallSpan | None:
        """The span of one call (a context manager), or None once stopped."""
        tracer = self.tracer
        if tracer is None:
            return None
        name, fixed = self._fixed(method)
        attributes: dict[str, AttributeValue] = {
            **fixed,
            "cstp.workspace": principal.workspace,
            "cstp.agent": principal.agent,
            "cstp.face": face,
        }
        if face != "console":
            attributes["rpc.system"] = face
        if method in GENAI_OPERATIONS and GENAI_OPERATIONS[method] != APPLY_GUARDRAIL:
            attributes["gen_ai.memory.store.id"] = principal.workspace
        span = tracer.start_span(name, kind=SpanKind.SERVER, attributes=attributes)
        return CallSpan(tracer, span, GENAI_OPERATIONS.get(method), self.content)

    def _fixed(self, method: str) -> tuple[str, dict[str, AttributeValue]]:
        """A method's span name and the attributes that depend on it alone (kept)."""
        known = self._names.get(method)
        if known is None:
            operation = GENAI_OPERATIONS.get(method)
            attributes: dict[str, AttributeValue] = {"rpc.method": method}
            if operation is not None:
                attributes["gen_ai.operation.name"] = operation
            known = (f"{operation} {method}" if operation else method, attributes)
            self._names[method] = known
        return known


def continue_traces(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: the requests it passes on continue their caller's trace (HTTP
    headers) while the app runs with tracing on."""

    async def continuing(scope: Scope, receive: Receive, send: Send) -> None:
        tracing: Tracing | None = (
            scope["app"].state.tracing if scope["type"] == ScopeType.HTTP else None
        )
        if tracing is None:
            await app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]
        }
        with tracing.continued(headers):
            await app(scope, receive, send)

    return continuing


@contextmanager
def _attached(context: Context) -> Iterator[object]:
    token = otel_context.attach(context)
    try:
        yield context
    finally:
        otel_context.detach(token)


class CallSpan:
    """One call's span while the call runs: current in its context, ended when it ends,
    with its error code when it fails. Handlers reach it through ``CallContext``."""

    __slots__ = ("_otel_token", "_rows", "_token", "content", "open", "operation", "span", "tracer")

    def __init__(self, tracer: Tracer, span: Span, operation: str | None, content: bool) -> None:
        self.tracer = tracer
        self.span = span
        self.operation = operation  # its GenAI operation name, if any
        self.content = content
        self.open = False
        self._rows: list[tuple[str, str]] = []
        self._token: Any = None
        self._otel_token: Any = None

    def __enter__(self) -> CallSpan:
        self._otel_token = otel_context.attach(trace.set_span_in_context(self.span))
        self._token = _current.set(self)
        self.open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Closed first: a task this call started and that outlives it (a batch's worker, whose
        # context is a copy of this call's) makes no more spans under it.
        self.open = False
        _current.reset(self._token)
        otel_context.detach(self._otel_token)
        for key in self._rows:
            if _watching.get(key) is self:
                del _watching[key]
        if exc is not None:
            failed(self.span, exc)
        self.span.end()

    def set(self, key: str, value: AttributeValue) -> None:
        self.span.set_attribute(key, value)

    def text(self, key: str, value: str | None) -> None:
        """A text of the caller's (intent, query, decision): only with CSTP_TRACE_CONTENT."""
        if self.content and value:
            self.span.set_attribute(key, clip(value))

    def row(self, table: str, row_id: str) -> None:
        """The audit row this call wrote: its table and id now, its chain entry's sequence
        number (``cstp.audit.seq``) once committed (at once when it already is)."""
        self.span.set_attributes({"cstp.audit.table": table, "cstp.audit.row_id": row_id})
        key = (table, row_id)
        seq = _recent.pop(key, None)
        if seq is not None:
            self.span.set_attribute("cstp.audit.seq", seq)
        else:
            _watching[key] = self
            self._rows.append(key)

    def guardrail(self) -> AbstractContextManager[Guardrail]:
        """Where a guardrail evaluation of this call is described: the call's own span when
        the call is one (checkGuardrails), else a child ``apply_guardrail`` span around it
        (announceIntent, recordDecision)."""
        if self.operation == APPLY_GUARDRAIL:
            return nullcontext(Guardrail(self, own=True))
        return _guardrail_child(self)


@contextmanager
def _guardrail_child(call: CallSpan) -> Iterator[Guardrail]:
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": APPLY_GUARDRAIL}
    with child(call.tracer, APPLY_GUARDRAIL, attributes) as span:
        yield Guardrail(call, own=False, span=span)


class Guardrail:
    """What an evaluation puts on its span (``CallSpan.guardrail``)."""

    __slots__ = ("call", "own", "span")

    def __init__(self, call: CallSpan, *, own: bool, span: Span | None = None) -> None:
        self.call = call
        self.own = own
        self.span = call.span if span is None else span

    def evaluated(
        self,
        evaluation_id: str,
        version: str,
        rule_set_hash: str,
        *,
        allowed: bool,
        violations: int,
        warnings: int,
        description: str,
    ) -> None:
        """The stored evaluation: its id, the rule set's version and content hash (the
        conventions' policy version and id), and the rules' verdict (before any approval
        an escalation asks for)."""
        self.span.set_attributes(
            {
                "cstp.evaluation.id": evaluation_id,
                "cstp.guardrail.rule_set_version": version,
                "cstp.guardrail.rule_set_hash": rule_set_hash,
                "gen_ai.guardrail.policy.id": rule_set_hash,
                "gen_ai.guardrail.policy.version": version,
                "gen_ai.guardrail.result.type": "allowed",
                "gen_ai.guardrail.result.value": "true" if allowed else "false",
                "cstp.guardrail.violations": violations,
                "cstp.guardrail.warnings": warnings,
            }
        )
        if self.call.content:
            self.span.set_attribute("cstp.action.description", clip(description))
        if self.own:  # checkGuardrails: the evaluation is the call's audit row
            self.call.row("guardrail_evaluations", evaluation_id)


# ---------------------------------------------------------------- the audit chain's seq

# Rows a running call wrote and waits to learn the chain entry of, by (table, row id); and
# the entries committed that no call asked for yet (recordDecision learns its decision's id
# once the group writer has committed it), the most recent RECENT of them.
_watching: dict[tuple[str, str], CallSpan] = {}
_recent: OrderedDict[tuple[str, str], int] = OrderedDict()  # the oldest dropped in O(1)
RECENT = 4096


def committed(entries: Sequence[Covered], first: int) -> None:
    """The audit chain committed ``entries`` with sequence numbers from ``first`` on (an
    observer of app.audit.chain, which app.asgi registers when tracing starts)."""
    for offset, entry in enumerate(entries):
        key = (entry.table, entry.row_id)
        call = _watching.pop(key, None)
        if call is not None:
            call.span.set_attribute("cstp.audit.seq", first + offset)
            continue
        _recent[key] = first + offset
        if len(_recent) > RECENT:
            _recent.popitem(last=False)
