"""What a traced call records while it runs (app.observability.tracing): the work of the
database, the embedder, the vector index and the outbox, kept when it was slow or failed;
and the call that runs now, which that work belongs to.

Nothing here calls the OpenTelemetry SDK: a call only notes names, attributes and clock
readings, and its spans are made from those notes once its answer has gone out
(``Tracing.ended``), so a traced call waits for no span to be built.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING

from app.errors import CstpError

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from app.observability.calls import CallSpan

Attributes = dict[str, "AttributeValue"]

# How much of a text CSTP_TRACE_CONTENT puts in a span (an intent can be long; a collector
# truncates or refuses big attributes anyway).
CONTENT_CHARS = 1000

# The call whose task (or worker thread: asyncio.to_thread copies the context) runs now.
_current: ContextVar[CallSpan | None] = ContextVar("cstp_call_span", default=None)
_NOTHING: AbstractContextManager[None] = nullcontext()


#: A child span (a database read or commit, an embedding, an index call) is kept only when
#: its work took at least this long: a trace needs to show where the time went, not every
#: quick read, and each span is work for the server's process and the collector
#: (docs/PERFORMANCE.md, "Observability's cost"). Tests set it to 0 to see them all.
SLOW_CHILD_NS = 1_000_000


class Work:
    """A piece of a call's work, from ``start`` to ``end`` (``time.time_ns``): a child span of
    the call's once the call has ended. ``status``: None when it went well, else the error's
    description ("" for none)."""

    __slots__ = ("attributes", "end", "name", "start", "status")

    def __init__(self, name: str, attributes: Attributes, start: int) -> None:
        self.name, self.attributes, self.start = name, attributes, start
        self.end = start
        self.status: str | None = None

    def failed(self, exc: BaseException | None) -> None:
        """Marked as failed by ``exc`` (None: failed without an exception, a rollback)."""
        self.status = failed(self.attributes, exc)


def failed(attributes: Attributes, exc: BaseException | None) -> str:
    """Puts an error's attributes in ``attributes`` and answers the span's status
    description: a CstpError's code and its message (what the caller is told), any other
    exception's class name only (its text may hold what must not leave the server)."""
    if isinstance(exc, CstpError):
        attributes["rpc.jsonrpc.error_code"] = exc.code
        attributes["error.type"] = str(exc.code)
        return clip(exc.message)
    if exc is not None:
        attributes["error.type"] = type(exc).__qualname__
    return ""


def clip(text: str) -> str:
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"


def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> AbstractContextManager[None]:
    """The work of a ``with`` block, noted as a child span of the running call when it took
    ``SLOW_CHILD_NS`` or more or raised; nothing outside a call, or once the call has ended
    (a task it started that outlives it). For the database, the embedder and the index."""
    call = _current.get()
    if call is None or not call.open:
        return _NOTHING
    return _Timed(call, name, attributes)


class _Timed:
    """``span``'s block (a class: this runs around every read of a traced call)."""

    __slots__ = ("always", "attributes", "call", "name", "start")

    def __init__(
        self,
        call: CallSpan,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        *,
        always: bool = False,
    ) -> None:
        self.call, self.name, self.attributes, self.always = call, name, attributes, always
        self.start = 0

    def __enter__(self) -> None:
        self.start = time.time_ns()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ok = exc is None
        _noted(self.call, self.name, self.attributes, self.start, exc, ok=ok, keep=self.always)


def _noted(
    call: CallSpan,
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    start: int,
    error: BaseException | None,
    *,
    ok: bool,
    keep: bool = False,
) -> None:
    """The work that ran from ``start`` until now, noted in the call when it was slow enough
    to keep, failed (a failure is always worth a span) or is to be kept anyway, and while the
    call still runs."""
    end = time.time_ns()
    if (end - start < SLOW_CHILD_NS and ok and not keep) or not call.open:
        return
    work = Work(name, dict(attributes or {}), start)
    work.end = end
    if not ok:
        work.failed(error)
    call.children.append(work)  # one append: safe from a worker thread too


# ---------------------------------------------------------------- spans across events


class Started:
    """Work begun in one callback and ended in another (a database commit: app.db.engine)."""

    __slots__ = ("attributes", "call", "name", "start")

    def __init__(
        self, call: CallSpan, name: str, attributes: Mapping[str, AttributeValue], start: int
    ) -> None:
        self.call, self.name, self.attributes, self.start = call, name, attributes, start


def started(name: str, attributes: Mapping[str, AttributeValue]) -> Started | None:
    """Work of the running call beginning now, which ``ended`` notes when it was slow enough
    (``SLOW_CHILD_NS``) or failed. None outside a call, or once it has ended."""
    call = _current.get()
    if call is None or not call.open:
        return None
    return Started(call, name, attributes, time.time_ns())


def ended(made: Started, *, ok: bool = True) -> None:
    _noted(made.call, made.name, made.attributes, made.start, None, ok=ok)


def note(call: CallSpan, name: str, attributes: Attributes) -> AbstractContextManager[None]:
    """A child span of ``call`` around a ``with`` block, kept however quick the block was
    (``apply_guardrail``: the issue's span of every evaluation). ``attributes`` may be added
    to inside the block: the span takes them as they are when it ends."""
    return _Timed(call, name, attributes, always=True)
