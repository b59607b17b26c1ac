"""OpenTelemetry traces: a span per call of every face, in the GenAI conventions' names.

Off unless the standard variables ask for it (app.observability.exporters): an OTLP
endpoint or an exporter named, everything else the OpenTelemetry SDK reads itself (headers,
sampler, batch sizes, resource attributes). Off, the runner holds no ``Tracing`` and a call
costs one ``is None``; the helpers here are then never reached.

On, the runner opens a ``CallSpan`` (app.observability.calls) around each call
(``Tracing.call``). While the call runs it only takes notes: its ids (drawn at once, so its
log lines name them), its attributes, the audit row it wrote with that row's chain sequence
number, and the work below it worth a span (app.observability.spans: the database, the
embedder, the vector index, ``apply_guardrail``). When the call ends, its notes wait in
``Tracing``'s queue and become SDK spans, with the times they were taken at, once no traced
call runs: a caller waits for no span to be built. Which attributes each
span carries: docs/ARCHITECTURE.md, "Tracing".

The base install has the OpenTelemetry API (through chromadb); ``current_ids`` works, and
answers None, without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from litestar.enums import ScopeType

from app.config import ConfigError
from app.observability import exporters
from app.observability.calls import APPLY_GUARDRAIL, CallSpan
from app.observability.spans import Attributes, _current
from app.version import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    HAVE_OTEL = True
except ImportError:  # no OpenTelemetry at all: tracing cannot be on (``from_env``)
    HAVE_OTEL = False

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Receive, Scope, Send
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from app.scopes import Principal

log = logging.getLogger("cstp.tracing")

# When the spans of ended calls are made (``Tracing.ended``): once no traced call runs,
# looked for every IDLE_CHECK seconds, so that making them delays no caller; on a server
# that is never idle, once WAITING_MAX calls wait, PER_TURN calls per turn of the event loop.
IDLE_CHECK = 0.01
WAITING_MAX = 64
PER_TURN = 8

#: The GenAI semantic conventions' operation of each CSTP method that has one.
GENAI_OPERATIONS = {
    "cstp.checkGuardrails": "apply_guardrail",
    "cstp.queryDecisions": "search_memory",
    "cstp.announceIntent": "search_memory",
    "cstp.recordDecision": "create_memory",
    "cstp.reviewDecision": "update_memory",
}


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id, in lower-case hex (32 and 16 digits), for a
    log line: the running call's, else the caller's whose trace a request continues; None
    outside both, or without OpenTelemetry. A task that a call started and that outlives it
    (a batch's worker) still holds a copy of that call's context: once the call has ended,
    None there too."""
    if not HAVE_OTEL:
        return None
    call = _current.get()
    if call is not None:
        return (format(call.trace_id, "032x"), format(call.span_id, "016x")) if call.open else None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def from_env(content: bool, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The server's tracing as the ``OTEL_*`` variables ask (None: off). Raises ConfigError
    when they ask for traces this installation cannot send, naming what to install or set.
    ``content``: CSTP_TRACE_CONTENT."""
    env = os.environ if env is None else env
    if not exporters.wanted(env):
        return None
    if not HAVE_OTEL:
        raise ConfigError(exporters.missing("OpenTelemetry is not installed"))
    made = [exporters.exporter(name, env) for name in exporters.exporter_names(env)]
    return Tracing(exporters.service_resource(env), made, content)


# ---------------------------------------------------------------- the server's tracer


class Tracing:
    """The tracer of one server (app): made by ``from_env`` when the app is built, started
    with the app (its batch span processors' threads) and shut down, its spans flushed,
    when the app stops."""

    def __init__(self, resource: Any, exporters: Sequence[SpanExporter], content: bool) -> None:
        from app.observability.ids import ChosenIds  # noqa: PLC0415  (the otel extra, on only)

        self.resource = resource
        self.exporters = list(exporters)
        self.content = content  # CSTP_TRACE_CONTENT: texts in spans
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        # The headers the propagators read (OTEL_PROPAGATORS), as text and as HTTP's bytes: a
        # request without any of them continues no trace, and is spared the extraction.
        self.fields: frozenset[str] = frozenset()
        self.header_fields: frozenset[bytes] = frozenset()
        self._names: dict[str, tuple[str, Attributes]] = {}
        self.ids = ChosenIds()
        self._ended: deque[CallSpan] = deque()  # calls whose spans are yet to be made
        self._timer: asyncio.TimerHandle | None = None  # when the loop next looks at them
        self.running = 0  # traced calls running now

    def start(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415  (on only)
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        # The sampler (OTEL_TRACES_SAMPLER) and span limits come from the environment.
        provider = TracerProvider(
            resource=self.resource, id_generator=self.ids, shutdown_on_exit=False
        )
        for exporter in self.exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        self.fields = frozenset(f.lower() for f in propagate.get_global_textmap().fields)
        self.header_fields = frozenset(f.encode("latin-1") for f in self.fields)
        self.provider = provider
        self.tracer = provider.get_tracer("cstp-server", __version__)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span of the calls ended so far (tests, shutdown)."""
        self.make_spans()
        return self.provider is None or self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop; later calls are not traced."""
        self.make_spans()
        provider, self.provider, self.tracer = self.provider, None, None
        if provider is not None:
            provider.shutdown()

    def continued(self, carrier: Mapping[str, Any]) -> AbstractContextManager[object]:
        """Within it, the trace context the carrier (HTTP headers, MCP ``_meta``) holds is
        current, so the calls made there continue the caller's trace (W3C ``traceparent``
        and ``tracestate``, or what OTEL_PROPAGATORS names)."""
        if not any(name in carrier for name in self.fields):
            return nullcontext()
        return _attached(propagate.extract(carrier))

    def call(self, method: str, principal: Principal, face: str) -> CallSpan | None:
        """The span of one call (a context manager), or None once stopped."""
        if self.tracer is None:
            return None
        name, fixed = self._fixed(method)
        attributes: Attributes = {
            **fixed,
            "cstp.workspace": principal.workspace,
            "cstp.agent": principal.agent,
            "cstp.face": face,
        }
        if face != "console":
            attributes["rpc.system"] = face
        if method in GENAI_OPERATIONS and GENAI_OPERATIONS[method] != APPLY_GUARDRAIL:
            attributes["gen_ai.memory.store.id"] = principal.workspace
        return CallSpan(self, name, attributes, GENAI_OPERATIONS.get(method))

    def _fixed(self, method: str) -> tuple[str, Attributes]:
        """A method's span name and the attributes that depend on it alone (kept)."""
        known = self._names.get(method)
        if known is None:
            operation = GENAI_OPERATIONS.get(method)
            attributes: Attributes = {"rpc.method": method}
            if operation is not None:
                attributes["gen_ai.operation.name"] = operation
            known = (f"{operation} {method}" if operation else method, attributes)
            self._names[method] = known
        return known

    def began(self) -> None:
        """A traced call has begun (``CallSpan``): while one runs, no span is made."""
        self.running += 1

    def ended(self, call: CallSpan) -> None:
        """A call has ended: its spans are made once no call runs (checked every
        ``IDLE_CHECK`` seconds), or once ``WAITING_MAX`` calls wait; at once outside a loop."""
        self.running -= 1
        self._ended.append(call)
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.make_spans()
            return
        self._timer = loop.call_later(IDLE_CHECK, self._when_idle)

    def _when_idle(self) -> None:
        self._timer = None
        if self.running and len(self._ended) < WAITING_MAX:
            self._timer = asyncio.get_running_loop().call_later(IDLE_CHECK, self._when_idle)
            return
        self.make_spans(PER_TURN)
        if self._ended:  # the rest at a later turn: calls that arrived meanwhile go first
            self._timer = asyncio.get_running_loop().call_later(0, self._when_idle)

    @property
    def pending(self) -> int:
        """Ended calls whose spans are yet to be made."""
        return len(self._ended)

    def make_spans(self, most: int | None = None) -> None:
        """The spans of the ended calls (``most`` of them at most), handed to the span
        processors (which export them in batches, from a thread of their own)."""
        made = 0
        while self._ended and (most is None or made < most):
            try:
                call = self._ended.popleft()
            except IndexError:  # another thread (a flush) took the last one
                return
            made += 1
            tracer = self.tracer
            if tracer is None:  # shut down
                continue
            try:
                self._make(tracer, call)
            except Exception:  # a trace is lost; the server goes on (and says so)
                log.exception("the spans of a %s call could not be made", call.name)

    def _make(self, tracer: Tracer, call: CallSpan) -> None:
        with self.ids.chosen(call.trace_id, call.span_id):
            made = tracer.start_span(
                call.name,
                call.parent,
                kind=SpanKind.SERVER,
                attributes=call.attributes,
                start_time=call.start,
            )
        _status(made, call.status)
        under = trace.set_span_in_context(made)
        for work in call.children:
            child = tracer.start_span(
                work.name, under, attributes=work.attributes, start_time=work.start
            )
            _status(child, work.status)
            child.end(end_time=work.end)
        made.end(end_time=call.end)


def _status(made: Span, status: str | None) -> None:
    if status is not None:
        made.set_status(Status(StatusCode.ERROR, status or None))


def continue_traces(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: the requests it passes on continue their caller's trace (HTTP
    headers) while the app runs with tracing on."""

    async def continuing(scope: Scope, receive: Receive, send: Send) -> None:
        tracing: Tracing | None = (
            scope["app"].state.tracing if scope["type"] == ScopeType.HTTP else None
        )
        if tracing is None or not any(key in tracing.header_fields for key, _ in scope["headers"]):
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
