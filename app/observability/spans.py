"""Child spans of a call (app.observability.tracing): the work of the database, the
embedder, the vector index and the outbox, made after the work and only when it was slow or
failed; and the call that runs now, which they belong to."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING

from app.errors import CstpError

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # no OpenTelemetry: no call is ever traced, so nothing here runs
    pass

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

    from app.observability.tracing import CallSpan

# How much of a text CSTP_TRACE_CONTENT puts in a span (an intent can be long; a collector
# truncates or refuses big attributes anyway).
CONTENT_CHARS = 1000

# The call whose task (or worker thread: asyncio.to_thread copies the context) runs now.
_current: ContextVar[CallSpan | None] = ContextVar("cstp_call_span", default=None)
_NOTHING: AbstractContextManager[None] = nullcontext()


#: A child span (a database read or commit, an embedding, an index call) is kept only when
#: its work took at least this long: spans cost the call itself (made, queued and encoded in
#: the server's process), and a trace needs to show where the time went, not every quick
#: read (docs/PERFORMANCE.md, "Observability's cost"). Tests set it to 0 to see them all.
SLOW_CHILD_NS = 1_000_000


def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> AbstractContextManager[None]:
    """A child span of the running call for the work of a ``with`` block, made once the block
    has ended and only when it took ``SLOW_CHILD_NS`` or more; nothing outside a call, or once
    the call has ended (a task it started that outlives it). For the database, the embedder
    and the vector index."""
    call = _current.get()
    if call is None or not call.open:
        return _NOTHING
    return _timed(call, name, attributes)


@contextmanager
def _timed(
    call: CallSpan, name: str, attributes: Mapping[str, AttributeValue] | None
) -> Iterator[None]:
    start = time.time_ns()
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        _after_the_fact(call, name, attributes, start, error)


def _after_the_fact(
    call: CallSpan,
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    start: int,
    error: BaseException | None = None,
    *,
    ok: bool = True,
) -> None:
    """The span of work that ran from ``start`` until now, under the call's span, when it
    was slow enough to keep or failed (a failure is always worth a span)."""
    end = time.time_ns()
    if end - start < SLOW_CHILD_NS and error is None and ok:
        return
    parent = trace.set_span_in_context(call.span)
    made = call.tracer.start_span(name, parent, attributes=attributes, start_time=start)
    if error is not None:
        failed(made, error)
    elif not ok:
        made.set_status(Status(StatusCode.ERROR))
    made.end(end_time=end)


@contextmanager
def child(
    tracer: Tracer, name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> Iterator[Span]:
    """A span current within the block, ended after it, with the error's class when the
    block raises (never its text)."""
    with tracer.start_as_current_span(
        name,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as made:
        try:
            yield made
        except BaseException as exc:
            failed(made, exc)
            raise


def failed(made: Span, exc: BaseException) -> None:
    """Error status: a CstpError's code and its message (what the caller is told), any other
    exception's class name only (its text may hold what must not leave the server)."""
    if isinstance(exc, CstpError):
        made.set_attribute("rpc.jsonrpc.error_code", exc.code)
        made.set_attribute("error.type", str(exc.code))
        made.set_status(Status(StatusCode.ERROR, clip(exc.message)))
    else:
        made.set_attribute("error.type", type(exc).__qualname__)
        made.set_status(Status(StatusCode.ERROR))


def clip(text: str) -> str:
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"


# ---------------------------------------------------------------- spans across events


class Started:
    """Work begun in one callback and ended in another (a database commit: app.db.engine).
    (Not a dataclass: the module also loads where no OpenTelemetry is, outside sys.modules
    in a test, where a dataclass cannot resolve its annotations.)"""

    __slots__ = ("attributes", "call", "name", "start")

    def __init__(
        self, call: CallSpan, name: str, attributes: Mapping[str, AttributeValue], start: int
    ) -> None:
        self.call, self.name, self.attributes, self.start = call, name, attributes, start


def started(name: str, attributes: Mapping[str, AttributeValue]) -> Started | None:
    """Work of the running call beginning now, whose span ``ended`` makes when it was slow
    enough (``SLOW_CHILD_NS``). None outside a call, or once it has ended."""
    call = _current.get()
    if call is None or not call.open:
        return None
    return Started(call, name, attributes, time.time_ns())


def ended(made: Started, *, ok: bool = True) -> None:
    _after_the_fact(made.call, made.name, made.attributes, made.start, ok=ok)
