"""The ids of the server's spans (the ``otel`` extra; imported only when tracing starts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator


class ChosenIds(RandomIdGenerator):
    """The SDK's random ids, except for a call's own span: its ids are drawn when the call
    begins (its log lines carry them) and used when its span is made, after the call
    (``chosen``; app.observability.tracing)."""

    def __init__(self) -> None:
        self._next = threading.local()

    def draw(self, trace_id: int | None) -> tuple[int, int]:
        """A new call's trace id (``trace_id`` when it continues a trace) and span id."""
        return trace_id or super().generate_trace_id(), super().generate_span_id()

    @contextmanager
    def chosen(self, trace_id: int, span_id: int) -> Iterator[None]:
        """Within it, this thread's next span gets these ids."""
        self._next.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._next.ids = None

    def generate_span_id(self) -> int:
        chosen: tuple[int, int] | None = getattr(self._next, "ids", None)
        return super().generate_span_id() if chosen is None else chosen[1]

    def generate_trace_id(self) -> int:
        chosen: tuple[int, int] | None = getattr(self._next, "ids", None)
        return super().generate_trace_id() if chosen is None else chosen[0]
