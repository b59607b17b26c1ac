"""Webhooks (SPEC.md, section 8): signed messages to the URLs a workspace subscribed.

- ``enqueue`` / ``enqueue_many`` (fanout): an event's deliveries, in the caller's transaction.
- ``events``: the five events (``EVENTS``) and a message's id and body.
- ``delivery``: the loop every server process runs, which posts them, signed (Standard
  Webhooks), in order per subscription, retried with backoff until a receiver answers.
- ``secrets``: the signing secrets, sealed under a key kept outside the database.
- ``admin``: ``cstp webhooks add|list|remove``, and what ``cstp outbox`` and /ready show.
"""

from .events import (
    APPROVAL_DECIDED,
    APPROVAL_REQUESTED,
    DECISION_RECORDED,
    EVENTS,
    GUARDRAIL_BLOCKED,
    REVIEW_DUE,
    Message,
    UnknownEvent,
    message,
)
from .fanout import enqueue, enqueue_many

__all__ = [
    "APPROVAL_DECIDED",
    "APPROVAL_REQUESTED",
    "DECISION_RECORDED",
    "EVENTS",
    "GUARDRAIL_BLOCKED",
    "REVIEW_DUE",
    "Message",
    "UnknownEvent",
    "enqueue",
    "enqueue_many",
    "message",
]
