"""The webhook events (SPEC.md, section 8) and the message each one is: its id and body."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.runtime import iso

APPROVAL_REQUESTED = "approval.requested"
APPROVAL_DECIDED = "approval.decided"
GUARDRAIL_BLOCKED = "guardrail.blocked"
REVIEW_DUE = "review.due"
DECISION_RECORDED = "decision.recorded"

#: Every event a subscription may ask for, in the order ``cstp webhooks`` lists them.
EVENTS: tuple[str, ...] = (
    APPROVAL_REQUESTED,
    APPROVAL_DECIDED,
    GUARDRAIL_BLOCKED,
    REVIEW_DUE,
    DECISION_RECORDED,
)

#: What a message id may be: printable ASCII without spaces, as an HTTP header carries it.
MESSAGE_ID = re.compile(r"[!-~]{1,128}")


class UnknownEvent(ValueError):
    """An event name that is not one of EVENTS."""


@dataclass(frozen=True)
class Message:
    """One event as its subscribers get it."""

    workspace: str
    event: str
    message_id: str
    body: str  # the JSON text sent, byte for byte what is signed
    at: datetime


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    raise TypeError(f"a webhook's data cannot hold a {type(value).__name__}")


def message(
    *,
    workspace: str,
    event: str,
    data: Mapping[str, Any],
    at: datetime,
    message_id: str | None = None,
) -> Message:
    """The message of ``event`` in ``workspace``: body ``{"type", "timestamp", "data"}``
    (datetimes in ``data`` are written as the wire's timestamps); ``message_id`` None is a
    fresh one. Raises UnknownEvent, or ValueError for a message id no header can carry."""
    if event not in EVENTS:
        raise UnknownEvent(f"unknown webhook event {event!r} (one of: {', '.join(EVENTS)})")
    if message_id is None:
        message_id = new_message_id()
    elif not MESSAGE_ID.fullmatch(message_id):
        raise ValueError("a webhook message id is 1-128 printable ASCII characters, no spaces")
    body = json.dumps(
        {"type": event, "timestamp": iso(at), "data": dict(data)},
        separators=(",", ":"),
        ensure_ascii=False,
        default=_plain,
    )
    return Message(workspace, event, message_id, body, at)
