"""The delivery loop every server process runs (started in the app's lifespan, app.asgi).

Each pass:

1. now and then (REVIEW_SCAN), enqueues ``review.due`` for the decisions whose review time
   has come, unreviewed, in workspaces with a subscriber for it (``scan_reviews``);
2. finds the subscriptions whose oldest pending delivery is due and that no process holds,
   and takes their lease: a conditional UPDATE of the subscription row (free, or its lease
   run out), so on any number of processes only one delivers a subscription at a time;
3. delivers each leased subscription's messages in a task of its own, oldest first, one at
   a time: the next waits until the one before it is done or dead, so a receiver gets a
   subscription's messages in order.

An attempt signs the body as the Standard Webhooks specification says (``webhook-id``,
``webhook-timestamp`` of the attempt, ``webhook-signature``) with the ``standardwebhooks``
library and posts it (TIMEOUT). A 2xx answer is done; a 4xx other than 408 and 429 is
permanent: that delivery is dead (``cstp outbox retry`` re-queues it) and the next one goes
on; anything else (no connection, a timeout, 5xx, 408, 429, a redirect, which is not
followed) is retried after a backoff that doubles from 1 s up to MAX_BACKOFF, for as long
as it takes. A message whose delivery may have reached the receiver before this process
could record it (the process stopped) is sent again: delivery is at least once, receivers
dedupe by ``webhook-id``.

A subscription whose secret does not open (another key) is never sent unsigned: its head
delivery stays pending with the reason in ``last_error`` (``cstp outbox`` shows it), tried
again every SECRET_RETRY, and the process logs it once.

Calls only insert rows (app.webhooks.fanout): nothing here is on a call's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
from standardwebhooks import Webhook

from app.runtime import utc_now
from app.version import __version__

from . import repository
from .events import REVIEW_DUE, Message, message
from .repository import DEAD, DONE, Head, Leased
from .secrets import KeyUnavailable, SecretUnavailable, load_key, unseal

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database
    from app.runtime import Runtime

log = logging.getLogger("cstp.webhooks")

LEASE = timedelta(seconds=60)  # renewed before each attempt when half of it is gone
TIMEOUT = 10.0  # seconds an attempt may take, connecting included (well under LEASE / 2)
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0
SECRET_RETRY = timedelta(seconds=60)
REVIEW_SCAN = 30.0  # seconds between two review.due scans of a process
REVIEW_SCAN_LIMIT = 500  # review.due messages a scan enqueues per subscription at most
PARALLEL = 8  # subscriptions a process delivers at once
_ERROR = 300  # characters of an error kept


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: 1 s, 2 s, 4 s … MAX_BACKOFF."""
    return timedelta(seconds=min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** min(attempts - 1, 30)))


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    status: str  # DONE, DEAD, or "retry"
    code: int | None
    error: str | None


def judge(code: int) -> Outcome:
    """The meaning of the receiver's HTTP status (SPEC.md, section 8)."""
    if 200 <= code < 300:
        return Outcome(DONE, code, None)
    if 400 <= code < 500 and code not in (408, 429):
        return Outcome(
            DEAD, code, f"the receiver answered {code}: permanent (a 4xx other than 408/429)"
        )
    if 300 <= code < 400:
        return Outcome("retry", code, f"the receiver answered {code} (redirects are not followed)")
    return Outcome("retry", code, f"the receiver answered {code}")


def _failure(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {TIMEOUT:g} s ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return "could not connect to the receiver"
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class WebhookRelay:
    """The delivery loop of one process (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        runtime: Runtime,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.runtime = runtime
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.wakeup = asyncio.Event()
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._key: bytes | None = None
        self._signers: dict[str, Webhook] = {}
        self._told: set[str] = set()  # subscriptions whose unopened secret was logged
        self._failing: dict[str, int] = {}  # subscriptions whose receiver fails: attempts
        self._working: dict[str, asyncio.Task[None]] = {}
        self._next_scan = 0.0

    # ---- the loop -------------------------------------------------------------------------

    async def loop(self) -> None:
        """Wake on a timer (CSTP outbox poll) or when poked, and run a pass."""
        while True:
            try:
                await self.run_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook pass failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.outbox_poll_seconds):
                    await self.wakeup.wait()
            self.wakeup.clear()

    async def run_due(self) -> int:
        """One pass: the review.due scan when its time has come, then lease the due
        subscriptions and start delivering them; the number started."""
        if time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + REVIEW_SCAN
            await self.scan_reviews()
        room = PARALLEL - len(self._working)
        if room <= 0:
            return 0
        now = self.runtime.now()
        async with self.db.transaction(write=False) as session:
            due = await repository.due_subscriptions(session, now, room, list(self._working))
        if not due:
            return 0
        async with self.db.transaction(write=True) as session:
            leased = await repository.lease(session, due, self.owner, now, now + LEASE)
        for sub in leased:
            task = asyncio.get_running_loop().create_task(self._deliver(sub))
            self._working[sub.id] = task
            task.add_done_callback(functools.partial(self._finished, sub.id))
        return len(leased)

    def _finished(self, subscription_id: str, _task: asyncio.Task[None]) -> None:
        self._working.pop(subscription_id, None)

    async def drain(self) -> None:
        """Run passes until nothing is due and no delivery is in progress (tests, tools)."""
        while True:
            started = await self.run_due()
            if self._working:
                await asyncio.wait(set(self._working.values()))
            elif not started:
                return

    async def close(self) -> None:
        """Stop delivering: cancel the deliveries in progress, give their leases back."""
        tasks = list(self._working.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- review.due -------------------------------------------------------------------------

    async def scan_reviews(self) -> int:
        """Enqueue a review.due message for each decision whose ``review_by`` has passed and
        that has no review, for each subscriber of its workspace that wants them, once per
        subscriber (message id ``msg_review_due_<decision id>``). A subscriber gets the
        decisions due at or after the moment it subscribed, not those due before (no
        flood of old reviews on a new subscription)."""
        now = self.runtime.now()
        async with self.db.transaction(write=False) as session:
            subscribers = await repository.review_due_subscribers(session)
        total = 0
        for subscriber in subscribers:
            async with self.db.transaction(write=False) as session:
                due = await repository.reviews_due(session, subscriber, now, REVIEW_SCAN_LIMIT)
            if not due:
                continue
            rows: list[tuple[str, Message]] = [
                (
                    subscriber.id,
                    message(
                        workspace=subscriber.workspace,
                        event=REVIEW_DUE,
                        data={
                            "id": d.id,
                            "agent": d.recorded_by,
                            "workspace": subscriber.workspace,
                            "summary": d.summary,
                            "category": d.category,
                            "confidence": d.confidence,
                            "stakes": d.stakes,
                            "createdAt": d.created_at,
                            "reviewBy": d.review_by,
                        },
                        at=now,
                        message_id=f"msg_review_due_{d.id}",
                    ),
                )
                for d in due
            ]
            async with self.db.transaction(write=True) as session:
                await repository.add_deliveries(session, rows)
            total += len(rows)
        return total

    # ---- one subscription -----------------------------------------------------------------------

    async def _deliver(self, sub: Leased) -> None:
        """Deliver ``sub``'s due messages in order while this process holds its lease."""
        lease_until = sub.lease_until
        held = True
        try:
            while True:
                now = self.runtime.now()
                async with self.db.transaction(write=False) as session:
                    first = await repository.head(session, sub.id)
                if first is None or first.available_at > now:
                    return
                signer = await self._signer(sub, first)
                if signer is None:
                    return
                if lease_until - now < LEASE / 2:
                    async with self.db.transaction(write=True) as session:
                        held = await repository.renew(session, sub.id, self.owner, now, now + LEASE)
                    if not held:
                        log.warning(
                            "webhook subscription %s: lease lost; left to its holder", sub.id
                        )
                        return
                    lease_until = now + LEASE
                outcome = await self._attempt(sub.url, signer, first)
                await self._record(sub, first, outcome)
                self._tell(sub, outcome)
                if outcome.status not in (DONE, DEAD):
                    return
        except Exception:
            log.exception("webhook subscription %s: delivery pass failed", sub.id)
        finally:
            if held:
                with contextlib.suppress(Exception):
                    async with self.db.transaction(write=True) as session:
                        await repository.release(session, sub.id, self.owner)

    def _tell(self, sub: Leased, outcome: Outcome) -> None:
        """A receiver's outage is one log line when it starts and one when it ends, with the
        attempts that failed meanwhile: not a line per attempt."""
        if outcome.status == "retry":
            if sub.id not in self._failing:
                self._failing[sub.id] = 0
                log.warning(
                    "webhook subscription %s (%s): %s; retried with backoff until it answers",
                    sub.id,
                    sub.url,
                    outcome.error,
                )
            self._failing[sub.id] += 1
        elif sub.id in self._failing:
            log.warning(
                "webhook subscription %s answers again after %d failed attempt(s)",
                sub.id,
                self._failing.pop(sub.id),
            )

    async def _signer(self, sub: Leased, first: Head) -> Webhook | None:
        """The subscription's signer; None (the reason recorded on its head delivery, and
        logged once) when its secret cannot be opened: nothing is ever sent unsigned."""
        signer = self._signers.get(sub.id)
        if signer is not None:
            return signer
        try:
            if self._key is None:
                self._key = load_key(self.settings)
            secret = unseal(self._key, sub.id, sub.secret_sealed, sub.key_id)
            signer = Webhook(secret)
        except (KeyUnavailable, SecretUnavailable) as exc:
            reason = f"not sent: cannot sign: {exc}"
            if sub.id not in self._told:
                self._told.add(sub.id)
                log.error(
                    "webhook subscription %s (workspace %s) %s", sub.id, sub.workspace, reason
                )
            now = self.runtime.now()
            async with self.db.transaction(write=True) as session:
                await repository.record(
                    session, first.id, last_error=reason[:_ERROR], available_at=now + SECRET_RETRY
                )
            return None
        self._told.discard(sub.id)
        self._signers[sub.id] = signer
        return signer

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(TIMEOUT),
                follow_redirects=False,
                transport=self._transport,
                headers={"user-agent": f"cstp-server/{__version__} (webhooks)"},
            )
        return self._client

    async def _attempt(self, url: str, signer: Webhook, first: Head) -> Outcome:
        """Sign ``first`` now and post it; what the receiver's answer means."""
        body = first.body.encode("utf-8")
        # The wall clock, not the injected one: receivers check the timestamp against theirs.
        at = utc_now()
        headers = {
            "content-type": "application/json",
            "webhook-id": first.message_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signer.sign(first.message_id, at, body),
        }
        try:
            async with asyncio.timeout(TIMEOUT * 2):  # a receiver that trickles its answer
                # The answer's body is never read: only its status counts.
                async with self._http().stream("POST", url, content=body, headers=headers) as r:
                    return judge(r.status_code)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return Outcome("retry", None, f"no answer within {TIMEOUT * 2:g} s")
        except Exception as exc:
            return Outcome("retry", None, _failure(exc))

    async def _record(self, sub: Leased, first: Head, outcome: Outcome) -> None:
        now = self.runtime.now()
        attempts = first.attempts + 1
        async with self.db.transaction(write=True) as session:
            if outcome.status == DONE:
                await repository.record(
                    session,
                    first.id,
                    status=DONE,
                    attempts=attempts,
                    delivered_at=now,
                    last_status=outcome.code,
                    last_error=None,
                )
            elif outcome.status == DEAD:
                await repository.record(
                    session,
                    first.id,
                    status=DEAD,
                    attempts=attempts,
                    last_status=outcome.code,
                    last_error=(outcome.error or "")[:_ERROR],
                )
            else:
                await repository.record(
                    session,
                    first.id,
                    attempts=attempts,
                    available_at=now + backoff(attempts),
                    last_status=outcome.code,
                    last_error=(outcome.error or "")[:_ERROR],
                )
        if outcome.status == DEAD:
            log.error(
                "webhook delivery #%d (%s %s to subscription %s) is dead: %s",
                first.id,
                first.event,
                first.message_id,
                sub.id,
                outcome.error,
            )
