"""Injected time and ids, so tests can fix them and nothing depends on the wall clock; and
the count of the calls in flight (``Calls``)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def random_decision_id() -> str:
    return secrets.token_hex(4)


def random_uuid() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Runtime:
    """The clock and id sources a service reads; tests pass fixed ones."""

    now: Callable[[], datetime] = field(default=utc_now)
    decision_id: Callable[[], str] = field(default=random_decision_id)
    uuid: Callable[[], str] = field(default=random_uuid)


class Calls:
    """The calls the server is running now, of every face (the operations runner counts
    them). Counted on the event loop and read from worker threads too: one int, so a read
    is at worst a moment old."""

    def __init__(self) -> None:
        self.running = 0

    def crowded(self) -> bool:
        """Whether more than one call is running (a call's work shares the cores)."""
        return self.running > 1


def iso(value: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, the wire format of every timestamp."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
