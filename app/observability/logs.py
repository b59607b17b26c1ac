"""Log lines as an operator's log pipeline reads them (``CSTP_LOG_FORMAT``, SPEC.md section 11).

``Fields`` is a log message made of named values (the runner's line per call): a text log
shows it as one JSON object, as that line always read; a JSON log merges the values into the
line's own object, so a pipeline filters on ``method`` or ``outcome`` without parsing a string
inside a string. ``JsonFormatter`` writes any record as one JSON object per line, with the
trace and span ids of the span it was logged in (when tracing is on), so a log line and its
trace find each other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

try:
    from app.observability.tracing import (  # type: ignore[import-not-found, unused-ignore]
        current_ids,
    )
except ModuleNotFoundError as missing:
    # Only the tracing module itself may be missing (a build without it): no span, no ids.
    # Anything it fails to import in turn is a bug to see, not to hide.
    if missing.name != "app.observability.tracing":
        raise

    def current_ids() -> tuple[str, str] | None:
        return None


class Fields:
    """A log message of named values: ``str()`` is their JSON object (what a text log and
    ``record.getMessage()`` show); ``summary`` is the ``message`` of a JSON line, which holds
    the values as keys of its own."""

    __slots__ = ("summary", "values")

    def __init__(self, summary: str, values: Mapping[str, Any]) -> None:
        self.summary = summary
        self.values = values

    def __str__(self) -> str:
        return json.dumps(self.values, default=str)

    def __repr__(self) -> str:
        return f"Fields({self.summary!r}, {self.values!r})"


# The keys every JSON line may have; a Fields value of the same name never replaces one.
STANDARD_KEYS = ("time", "level", "logger", "message", "trace_id", "span_id", "exception", "stack")

# uvicorn's access records carry the request as their arguments, in this order.
_ACCESS_ARGS = ("client", "http_method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO-8601, UTC, milliseconds),
    ``level``, ``logger``, ``message``; the values of a ``Fields`` message; ``trace_id`` and
    ``span_id`` while a span is current; ``exception`` (the traceback's text) and ``stack``
    when the record has them. Non-ASCII characters are escaped, so a line is always valid
    in any encoding a log file or a terminal has."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        message = record.msg
        if isinstance(message, Fields):
            line["message"] = message.summary
            line.update((k, v) for k, v in message.values.items() if k not in STANDARD_KEYS)
        else:
            line["message"] = record.getMessage()
            if record.name == "uvicorn.access" and _is_access(record.args):
                assert isinstance(record.args, tuple)
                line.update(zip(_ACCESS_ARGS, record.args, strict=True))
        ids = current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info and not record.exc_text:
            # Cached on the record, as logging.Formatter does, for the other handlers.
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def _utc(created: float) -> str:
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.removesuffix("+00:00") + "Z"


def _is_access(args: object) -> bool:
    return isinstance(args, tuple) and len(args) == len(_ACCESS_ARGS)
