"""Injected time and ids, so tests can fix them and nothing depends on the wall clock."""

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


def iso(value: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, the wire format of every timestamp."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
