"""Webhooks for operators: ``cstp webhooks add|list|remove`` (local, with database access),
and what ``cstp outbox`` and /ready show of the deliveries. Never on a call's path."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from secrets import token_hex
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import urlsplit

from app.db.webhooks import WebhookSubscription
from app.runtime import iso
from app.scopes import workspace_problem

from . import repository
from .events import EVENTS
from .repository import DEAD, PENDING
from .secrets import key_id, load_key, new_secret, seal

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database

ID_PREFIX = "whk_"
ID = re.compile(r"whk_[0-9a-f]{16}")
MAX_URL = 2000


class BadRequest(ValueError):
    """What an operator asked for cannot be done as asked; the message says why, in a line."""


class UnknownSubscription(LookupError):
    pass


def checked_workspace(value: str) -> str:
    problem = workspace_problem(value)
    if problem is not None:
        raise BadRequest(f"workspace {value[:40]!r} is not a workspace id: {problem}")
    return value


def checked_url(value: str) -> str:
    """An absolute http or https URL with a host, without spaces, at most MAX_URL long."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or len(value) > MAX_URL
        or any(c.isspace() or ord(c) < 32 for c in value)
    ):
        raise BadRequest(
            f"--url {value[:80]!r} is not a webhook URL: an absolute http:// or https:// URL "
            f"with a host, at most {MAX_URL} characters"
        )
    return value


def checked_events(value: str) -> list[str]:
    """The comma-separated events, in EVENTS order, each once."""
    names = [e.strip() for e in value.split(",") if e.strip()]
    if not names:
        raise BadRequest(f"--events names no event (one or more of: {', '.join(EVENTS)})")
    unknown = [e for e in names if e not in EVENTS]
    if unknown:
        raise BadRequest(f"unknown event {unknown[0][:40]!r} (the events are: {', '.join(EVENTS)})")
    return [e for e in EVENTS if e in names]


@dataclass(frozen=True)
class Added:
    subscription: WebhookSubscription
    secret: str  # shown once, stored sealed


class Admin:
    """``cstp webhooks`` on a database."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    async def add(
        self, workspace: str, url: str, events: Sequence[str], by: str, now: datetime
    ) -> Added:
        key = load_key(self.settings)
        sid = ID_PREFIX + token_hex(8)
        secret = new_secret()
        row = WebhookSubscription(
            id=sid,
            workspace=workspace,
            url=url,
            events=list(events),
            secret_sealed=seal(key, sid, secret),
            key_id=key_id(key),
            created_at=now,
            created_by=by,
        )
        async with self.db.transaction(write=True) as session:
            repository.add_subscription(session, row)
        return Added(row, secret)

    async def list(self, workspace: str | None) -> Sequence[WebhookSubscription]:
        async with self.db.transaction(write=False) as session:
            return await repository.list_subscriptions(session, workspace)

    async def remove(self, sid: str, now: datetime) -> tuple[WebhookSubscription, bool]:
        """Remove a subscription (its undelivered messages are not sent); the row, and
        whether it was active until now."""
        async with self.db.transaction(write=True) as session:
            row = await repository.get_subscription(session, sid)
            if row is None:
                raise UnknownSubscription(sid)
            removed = await repository.remove_subscription(session, sid, now)
        return row, removed == 1


def listed(row: WebhookSubscription) -> dict[str, Any]:
    """A subscription as ``cstp webhooks list --json`` shows it: never its secret."""
    return {
        "id": row.id,
        "workspace": row.workspace,
        "url": row.url,
        "events": list(row.events),
        "status": "removed" if row.removed_at is not None else "active",
        "createdAt": iso(row.created_at),
        "createdBy": row.created_by,
        "removedAt": None if row.removed_at is None else iso(row.removed_at),
    }


# ---- cstp outbox, /ready ----------------------------------------------------------------------


class Counts(TypedDict):
    """Deliveries of active subscriptions by status (``checks.webhooks`` of /ready)."""

    pending: int
    dead: int


async def counts(db: Database) -> Counts:
    async with db.transaction(write=False) as session:
        found = await repository.counts_by_status(session)
    return Counts(pending=found.get(PENDING, 0), dead=found.get(DEAD, 0))


async def retry_dead(db: Database, now: datetime) -> int:
    """Re-queue dead deliveries (``cstp outbox retry``), due now, in their place in their
    subscription's order (oldest first)."""
    async with db.transaction(write=True) as session:
        return await repository.requeue_dead(session, now)


async def describe(db: Database, limit: int = 50) -> list[str]:
    """What ``cstp outbox`` prints of webhooks: counts, then each subscription with messages
    waiting or dead, then the deliveries that failed (dead, or pending after a failure)."""
    total = await counts(db)
    async with db.transaction(write=False) as session:
        per = await repository.per_subscription(session)
        failed = await repository.troubled(session, limit)
    lines = [f"webhooks: pending: {total['pending']}  dead: {total['dead']}"]
    subscriptions: dict[str, dict[str, Any]] = {}
    for sid, workspace, url, removed_at, status, n in per:
        entry = subscriptions.setdefault(
            sid, {"workspace": workspace, "url": url, "removed": removed_at is not None}
        )
        entry[status] = n
    for sid, entry in subscriptions.items():
        state = " (removed: not sent)" if entry["removed"] else ""
        lines.append(
            f"{sid} workspace {entry['workspace']} {entry['url']}{state}: "
            f"pending {entry.get(PENDING, 0)} dead {entry.get(DEAD, 0)}"
        )
    for d in failed:
        answer = f" last answer {d.last_status}" if d.last_status is not None else ""
        when = "" if d.status == DEAD else f" next {iso(d.available_at)}"
        lines.append(
            f"delivery #{d.id} {d.status:<7} {d.event} {d.message_id} to {d.subscription_id} "
            f"attempts {d.attempts}{answer}{when}: {d.last_error}"
        )
    if total["dead"]:
        lines.append(
            "dead deliveries are never retried by themselves (the receiver refused them: "
            "a 4xx answer); fix the receiver, then `cstp outbox retry` re-queues them"
        )
    return lines
