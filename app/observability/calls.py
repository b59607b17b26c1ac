"""A traced call while it runs (app.observability.tracing): its ids, the attributes handlers
and the guardrail evaluation give it, and the audit row it wrote with that row's chain
sequence number. Only notes: the call's spans are made of them after it (``Tracing.ended``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from app.observability.spans import Attributes, Work, _current, clip, failed, note

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # no OpenTelemetry: no call is ever traced, so nothing here runs
    pass

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.util.types import AttributeValue

    from app.audit.tables import Covered
    from app.observability.tracing import Tracing

APPLY_GUARDRAIL = "apply_guardrail"


class CallSpan:
    """One call while it runs: its ids, attributes and noted work, current in its context
    (``spans._current``); when it ends, with its error code when it fails, its span is made
    (``Tracing.ended``). Handlers reach it through ``CallContext``."""

    __slots__ = (
        "_rows",
        "_token",
        "attributes",
        "children",
        "end",
        "name",
        "open",
        "operation",
        "parent",
        "span_id",
        "start",
        "status",
        "trace_id",
        "tracing",
    )

    def __init__(
        self, tracing: Tracing, name: str, attributes: Attributes, operation: str | None
    ) -> None:
        self.tracing = tracing
        self.name = name
        self.attributes = attributes
        self.operation = operation  # its GenAI operation name, if any
        # The caller's trace, when the request continues one (``continue_traces``).
        self.parent: Context = otel_context.get_current()
        caller = trace.get_current_span(self.parent).get_span_context()
        self.trace_id, self.span_id = tracing.ids.draw(caller.trace_id if caller.is_valid else None)
        self.children: list[Work] = []
        self.status: str | None = None
        self.start = self.end = 0
        self.open = False
        self._rows: list[tuple[str, str]] = []
        self._token: Any = None

    @property
    def content(self) -> bool:
        return self.tracing.content

    def __enter__(self) -> CallSpan:
        self.start = time.time_ns()
        self._token = _current.set(self)
        self.open = True
        self.tracing.began()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Closed first: a task this call started and that outlives it (a batch's worker, whose
        # context is a copy of this call's) notes nothing more in it.
        self.end = time.time_ns()
        self.open = False
        _current.reset(self._token)
        for key in self._rows:
            if _watching.get(key) is self:
                del _watching[key]
        if exc is not None:
            self.status = failed(self.attributes, exc)
        self.tracing.ended(self)

    def set(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def text(self, key: str, value: str | None) -> None:
        """A text of the caller's (intent, query, decision): only with CSTP_TRACE_CONTENT."""
        if self.tracing.content and value:
            self.attributes[key] = clip(value)

    def row(self, table: str, row_id: str) -> None:
        """The audit row this call wrote: its table and id now, its chain entry's sequence
        number (``cstp.audit.seq``) once committed (at once when it already is)."""
        self.attributes["cstp.audit.table"] = table
        self.attributes["cstp.audit.row_id"] = row_id
        key = (table, row_id)
        seq = _recent.pop(key, None)
        if seq is not None:
            self.attributes["cstp.audit.seq"] = seq
        else:
            _watching[key] = self
            self._rows.append(key)

    def guardrail(self) -> AbstractContextManager[Guardrail]:
        """Where a guardrail evaluation of this call is described: the call's own span when
        the call is one (checkGuardrails), else a child ``apply_guardrail`` span around it
        (announceIntent, recordDecision)."""
        if self.operation == APPLY_GUARDRAIL:
            return nullcontext(Guardrail(self, self.attributes, own=True))
        return _guardrail_child(self)


@contextmanager
def _guardrail_child(call: CallSpan) -> Iterator[Guardrail]:
    attributes: Attributes = {"gen_ai.operation.name": APPLY_GUARDRAIL}
    with note(call, APPLY_GUARDRAIL, attributes):
        yield Guardrail(call, attributes, own=False)


class Guardrail:
    """What an evaluation puts on its span (``CallSpan.guardrail``)."""

    __slots__ = ("attributes", "call", "own")

    def __init__(self, call: CallSpan, attributes: Attributes, *, own: bool) -> None:
        self.call = call
        self.attributes = attributes  # its span's
        self.own = own

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
        self.attributes.update(
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
            self.attributes["cstp.action.description"] = clip(description)
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
            call.attributes["cstp.audit.seq"] = first + offset
            continue
        _recent[key] = first + offset
        if len(_recent) > RECENT:
            _recent.popitem(last=False)
