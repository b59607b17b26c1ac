"""Webhooks (SPEC.md, section 8), against a real HTTP receiver started by each test:
``cstp webhooks add|list|remove``; events arriving in order per subscription, signed as the
Standard Webhooks specification says (checked with the ``standardwebhooks`` verifier); an
event enqueued twice delivered once; a 410 making that delivery dead, said by ``cstp outbox``
and /ready, and ``cstp outbox retry`` sending it again; a secret sealed under another key
never sent unsigned; review.due sent once per decision; two relays never delivering one
subscription at once; and (slow) a receiver down for 3 minutes getting every event after."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result
from standardwebhooks.webhooks import WebhookVerificationError

from app import webhooks
from app.cli import main
from app.config import Settings
from app.db.engine import Database
from app.runtime import Runtime, utc_now
from app.webhooks import admin
from app.webhooks.delivery import WebhookRelay
from support.app import Rpc
from support.databases import run_sql
from support.receiver import Receiver
from support.waiting import poll_until

DECISION = {
    "decision": "Use a queue for the mail jobs",
    "confidence": 0.8,
    "category": "architecture",
    "stakes": "low",
}
DATA_KEYS = {"id", "agent", "workspace", "summary", "category", "confidence", "stakes", "createdAt"}


# ---- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()


async def cstp(settings: Settings, *args: str, **env: str | None) -> Result:
    """``cstp ARGS`` in this process (a thread: the command runs its own event loop), on the
    test's database and data directory (so the same webhook key file as the test's app)."""
    base: dict[str, str | None] = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_WEBHOOK_KEY": None,
        "CSTP_AUDIT_KEY": None,
        "CSTP_AUDIT_KEY_FILE": None,
    }
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env={**base, **env})


async def subscribe(
    settings: Settings, url: str, events: str, workspace: str = "default", **env: str | None
) -> dict[str, Any]:
    result = await cstp(
        settings,
        "webhooks",
        "add",
        "--workspace",
        workspace,
        "--url",
        url,
        "--events",
        events,
        "--json",
        **env,
    )
    assert result.exit_code == 0, result.output
    added: dict[str, Any] = json.loads(result.stdout)
    return added


async def enqueue(db: Database, event: str, message_id: str | None, **data: Any) -> None:
    async with db.transaction(write=True) as session:
        await webhooks.enqueue(
            session,
            workspace="default",
            event=event,
            data=data,
            at=utc_now(),
            message_id=message_id,
        )


async def deliveries(url: str) -> list[dict[str, Any]]:
    return await run_sql(
        url,
        "SELECT id, subscription_id, event, message_id, status, attempts, last_status, "
        "last_error FROM webhook_deliveries ORDER BY id",
    )


async def arrived(receiver: Receiver, count: int, within: float = 20) -> list[str]:
    async def check() -> tuple[bool, list[str]]:
        ids = [r.message_id for r in receiver.accepted()]
        return len(ids) >= count, ids

    ids: list[str] = await poll_until(check, within, f"{count} webhook(s) accepted")
    return ids


# ---- delivery ---------------------------------------------------------------------------------


async def test_events_arrive_in_order_signed_and_once(
    settings: Settings, rpc: Rpc, services: Any, receiver: Receiver
) -> None:
    sub = await subscribe(settings, receiver.url, "approval.requested,decision.recorded")
    elsewhere = Receiver().start()
    try:
        await subscribe(settings, elsewhere.url, "decision.recorded", workspace="other")
        await enqueue(services.db, "approval.requested", "msg_approval_1", approvalId="apr_1")
        await enqueue(services.db, "approval.requested", "msg_approval_1", approvalId="apr_1")
        recorded = [
            (await rpc.ok("cstp.recordDecision", {**DECISION, "decision": f"Choice {n}"}))["id"]
            for n in range(3)
        ]
        await enqueue(services.db, "approval.requested", None, approvalId="apr_2")
        # An event the subscription did not ask for: never sent to it.
        await enqueue(services.db, "review.due", "msg_review_x", id="x")

        ids = await arrived(receiver, 5)
        await asyncio.sleep(0.5)  # anything more would come now
        assert not elsewhere.got  # another workspace's subscription
    finally:
        elsewhere.stop()
    assert len(receiver.got) == 5, receiver.ids()
    assert ids[:4] == ["msg_approval_1"] + [f"msg_decision_recorded_{i}" for i in recorded]
    assert ids[4].startswith("msg_") and len(ids[4]) == 36
    bodies = [r.verified(sub["secret"]) for r in receiver.got]
    assert [b["type"] for b in bodies] == ["approval.requested"] + ["decision.recorded"] * 3 + [
        "approval.requested"
    ]
    assert bodies[0]["data"] == {"approvalId": "apr_1"}
    for body, decision_id, n in zip(bodies[1:4], recorded, range(3), strict=True):
        assert set(body) == {"type", "timestamp", "data"}
        assert set(body["data"]) == DATA_KEYS
        assert body["data"]["id"] == decision_id and body["data"]["agent"] == "alice"
        assert body["data"]["summary"] == f"Choice {n}" and body["data"]["workspace"] == "default"
        assert body["timestamp"] == body["data"]["createdAt"]
    first = receiver.got[0]
    assert first.headers["webhook-signature"].startswith("v1,")
    assert first.headers["content-type"] == "application/json"
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 60
    with pytest.raises(WebhookVerificationError):
        other_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        first.verified(other_secret)
    rows = await deliveries(settings.database_url)
    assert [(r["message_id"], r["status"], r["attempts"]) for r in rows] == [
        (i, "done", 1) for i in ids
    ]


async def test_a_410_makes_that_delivery_dead_and_the_next_goes_on(
    settings: Settings,
    client: Any,
    services: Any,
    receiver: Receiver,
    commands_share_the_model: None,
) -> None:
    sub = await subscribe(settings, receiver.url, "approval.decided")
    receiver.statuses["msg_gone"] = 410
    await enqueue(services.db, "approval.decided", "msg_gone", approvalId="apr_1")
    await enqueue(services.db, "approval.decided", "msg_next", approvalId="apr_2")
    assert await arrived(receiver, 1) == ["msg_next"]
    assert receiver.ids() == ["msg_gone", "msg_next"]  # tried once, then the next one

    rows = await deliveries(settings.database_url)
    assert [(r["message_id"], r["status"], r["last_status"]) for r in rows] == [
        ("msg_gone", "dead", 410),
        ("msg_next", "done", 200),
    ]
    ready = (await client.get("/ready")).json()
    assert ready["status"] == "degraded" and ready["degraded"] == ["webhooks"], ready
    assert ready["checks"]["webhooks"] == {"pending": 0, "dead": 1}

    shown = await cstp(settings, "outbox")
    assert shown.exit_code == 0, shown.output
    assert "webhooks: pending: 0  dead: 1" in shown.stdout
    assert f"{sub['id']} workspace default {receiver.url}: pending 0 dead 1" in shown.stdout
    [line] = [x for x in shown.stdout.splitlines() if x.startswith(f"delivery #{rows[0]['id']} ")]
    assert "dead" in line and "msg_gone" in line and "last answer 410" in line
    assert "the receiver answered 410: permanent" in line
    assert "cstp outbox retry" in shown.stdout.splitlines()[-1]

    del receiver.statuses["msg_gone"]
    retried = await cstp(settings, "outbox", "retry")
    assert retried.exit_code == 0, retried.output
    assert "re-queued 1 dead webhook delivery(ies)" in retried.stdout
    assert await arrived(receiver, 2) == ["msg_next", "msg_gone"]
    assert (await client.get("/ready")).json()["status"] == "ready"


async def test_a_secret_sealed_with_another_key_is_never_sent_unsigned(
    settings: Settings,
    client: Any,
    services: Any,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
    commands_share_the_model: None,
) -> None:
    other_key = base64.b64encode(os.urandom(32)).decode()
    sub = await subscribe(settings, receiver.url, "guardrail.blocked", CSTP_WEBHOOK_KEY=other_key)
    caplog.set_level(logging.ERROR, logger="cstp.webhooks")
    await enqueue(services.db, "guardrail.blocked", "msg_blocked", rule="no-prod")

    async def refused() -> tuple[bool, Any]:
        rows = await deliveries(settings.database_url)
        return bool(rows and rows[0]["last_error"]), rows

    [row] = await poll_until(refused, 20, "the delivery refused")
    assert row["status"] == "pending" and row["attempts"] == 0
    assert "not sent: cannot sign" in row["last_error"]
    assert "sealed with the webhook key" in row["last_error"]
    assert other_key not in row["last_error"]
    # Tried again (made due by hand): still not sent, and the log told it once.
    await run_sql(
        settings.database_url,
        "UPDATE webhook_deliveries SET available_at = created_at, last_error = NULL",
    )
    services.webhooks.wakeup.set()
    await poll_until(refused, 20, "the delivery refused again")
    assert receiver.got == []
    told = [r for r in caplog.records if sub["id"] in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in told]
    assert "cannot sign" in told[0].getMessage()

    shown = await cstp(settings, "outbox")
    assert "webhooks: pending: 1  dead: 0" in shown.stdout
    assert "not sent: cannot sign" in shown.stdout
    ready = (await client.get("/ready")).json()
    assert ready["status"] == "ready" and ready["checks"]["webhooks"] == {"pending": 1, "dead": 0}


async def test_review_due_is_sent_once_per_decision_due_since_subscribing(
    settings: Settings, rpc: Rpc, services: Any, receiver: Receiver
) -> None:
    """A subscriber gets review.due for decisions due at or after it subscribed; a scan run
    again sends nothing twice. The relay's clock is moved forward instead of waiting."""
    before = (await rpc.ok("cstp.recordDecision", {**DECISION, "reviewIn": "30d"}))["id"]
    due = (await rpc.ok("cstp.recordDecision", {**DECISION, "reviewIn": "60d"}))["id"]
    reviewed = (await rpc.ok("cstp.recordDecision", {**DECISION, "reviewIn": "60d"}))["id"]
    await rpc.ok("cstp.reviewDecision", {"id": reviewed, "outcome": "success"})
    later = (await rpc.ok("cstp.recordDecision", {**DECISION, "reviewIn": "90d"}))["id"]
    added = await admin.Admin(services.db, settings).add(
        "default", receiver.url, ["review.due"], "test", utc_now() + timedelta(days=35)
    )
    relay = WebhookRelay(services.db, settings, Runtime(now=lambda: utc_now() + timedelta(days=70)))
    try:
        assert await relay.scan_reviews() == 1
        assert await relay.scan_reviews() == 0
        await relay.drain()
    finally:
        await relay.close()
    assert receiver.ids() == [f"msg_review_due_{due}"]
    body = receiver.got[0].verified(added.secret)
    assert body["type"] == "review.due" and body["data"]["id"] == due
    assert set(body["data"]) == DATA_KEYS | {"reviewBy"}
    assert before != due and later != due


async def test_two_relays_never_deliver_one_subscription_at_once(
    settings: Settings, receiver: Receiver
) -> None:
    """Two relays (as two server processes would) on one database: the receiver never has
    two requests of the subscription in flight, and gets every message once, in order."""
    receiver.delay = 0.15
    first, second = Database(settings.database_url), Database(settings.database_url)
    quick = settings.with_overrides(outbox_poll_seconds=0.05)
    relays = [WebhookRelay(first, quick, Runtime()), WebhookRelay(second, quick, Runtime())]
    added = await admin.Admin(first, settings).add(
        "default", receiver.url, ["approval.requested"], "test", utc_now()
    )
    wanted = [f"msg_{n}" for n in range(8)]
    for message_id in wanted:
        await enqueue(first, "approval.requested", message_id, n=message_id)
    loops = [asyncio.create_task(r.loop()) for r in relays]
    try:
        assert await arrived(receiver, len(wanted), within=30) == wanted
        await asyncio.sleep(0.3)
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for r in relays:
            await r.close()
        await first.dispose()
        await second.dispose()
    assert receiver.ids() == wanted
    assert receiver.most_in_flight == 1
    for got in receiver.got:
        got.verified(added.secret)


# ---- the command line ---------------------------------------------------------------------------


async def test_webhooks_add_list_remove(settings: Settings, services: Any) -> None:
    added = await subscribe(
        settings, "https://hooks.example.com/cstp", "review.due,approval.decided"
    )
    assert set(added) == {"id", "secret", "workspace", "url", "events", "createdAt"}
    assert added["id"].startswith("whk_") and added["secret"].startswith("whsec_")
    assert added["events"] == ["approval.decided", "review.due"]  # in EVENTS order
    assert len(base64.b64decode(added["secret"][len("whsec_") :])) == 32

    listed = await cstp(settings, "webhooks", "list", "--json")
    assert listed.exit_code == 0, listed.output
    [shown] = json.loads(listed.stdout)
    assert shown["id"] == added["id"] and shown["status"] == "active"
    assert "secret" not in shown and added["secret"] not in listed.stdout
    text = await cstp(settings, "webhooks", "list")
    assert added["id"] in text.stdout and added["secret"] not in text.stdout
    other = await cstp(settings, "webhooks", "list", "--workspace", "other")
    assert other.stdout.strip() == "no webhooks in workspace other"
    stored = await run_sql(settings.database_url, "SELECT * FROM webhook_subscriptions")
    assert added["secret"] not in json.dumps(stored, default=str)
    assert added["secret"][len("whsec_") :] not in json.dumps(stored, default=str)
    assert (settings.data_dir / "webhook.key").stat().st_mode & 0o777 == 0o600

    plain = await cstp(
        settings, "webhooks", "add", "--workspace", "default", "--url", "http://h/x",
        "--events", "decision.recorded",
    )  # fmt: skip
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.splitlines()[1].startswith("secret: whsec_")

    removed = await cstp(settings, "webhooks", "remove", added["id"])
    assert removed.exit_code == 0, removed.output
    assert removed.stdout.startswith(f"removed {added['id']}")
    again = await cstp(settings, "webhooks", "remove", added["id"])
    assert "already removed" in again.stdout
    [after] = [
        s
        for s in json.loads((await cstp(settings, "webhooks", "list", "--json")).stdout)
        if s["id"] == added["id"]
    ]
    assert after["status"] == "removed" and after["removedAt"]
    # A removed subscription gets nothing more.
    await enqueue(services.db, "review.due", "msg_after_removal", id="x")
    assert await deliveries(settings.database_url) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--url", "ftp://h/x"], "is not a webhook URL: an absolute http:// or https:// URL"),
        (["--url", "hooks.example.com"], "is not a webhook URL"),
        (["--events", "approval.requested,deploy.done"], "unknown event 'deploy.done'"),
        (["--events", ","], "--events names no event"),
        (["--workspace", "Bad_WS"], "workspace 'Bad_WS' is not a workspace id"),
    ],
)
async def test_webhooks_add_refuses_in_one_line(
    settings: Settings, args: list[str], says: str
) -> None:
    given = {"--workspace": "default", "--url": "https://h/x", "--events": "review.due"}
    given.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = await cstp(settings, "webhooks", "add", *[x for kv in given.items() for x in kv])
    assert result.exit_code == 1
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_webhooks_remove_refuses_in_one_line(settings: Settings) -> None:
    unknown = await cstp(settings, "webhooks", "remove", "whk_0123456789abcdef")
    assert unknown.exit_code == 1
    assert unknown.stderr.strip().endswith(
        "no webhook has the id whk_0123456789abcdef (see `cstp webhooks list`)"
    )
    malformed = await cstp(settings, "webhooks", "remove", "nope")
    assert malformed.exit_code == 1 and "is not a webhook id" in malformed.stderr
    secret = await cstp(settings, "webhooks", "remove", "whsec_c2VjcmV0")
    assert secret.exit_code == 1 and "that is a signing secret" in secret.stderr
    assert "c2VjcmV0" not in secret.stderr


# ---- a receiver down for minutes ----------------------------------------------------------------


@pytest.mark.slow
async def test_a_receiver_down_for_3_minutes_gets_every_event_after(
    settings: Settings, rpc: Rpc, services: Any, receiver: Receiver
) -> None:
    sub = await subscribe(settings, receiver.url, "decision.recorded,approval.requested")
    expected: list[str] = []
    for n in range(2):
        recorded = await rpc.ok("cstp.recordDecision", {**DECISION, "decision": f"Before {n}"})
        expected.append(f"msg_decision_recorded_{recorded['id']}")
    await arrived(receiver, 2)
    receiver.stop()
    down_until = time.monotonic() + 180
    n = 0
    while time.monotonic() < down_until:
        recorded = await rpc.ok("cstp.recordDecision", {**DECISION, "decision": f"During {n}"})
        expected.append(f"msg_decision_recorded_{recorded['id']}")
        await enqueue(services.db, "approval.requested", f"msg_approval_{n}", n=n)
        expected.append(f"msg_approval_{n}")
        n += 1
        await asyncio.sleep(min(15.0, max(0.0, down_until - time.monotonic())))
    rows = await deliveries(settings.database_url)
    assert not any(r["status"] == "dead" for r in rows)
    head = next(r for r in rows if r["status"] == "pending")
    assert head["attempts"] >= 5 and "could not connect" in head["last_error"], head
    receiver.start()  # the same port again

    async def caught_up() -> tuple[bool, Any]:
        seen = list(dict.fromkeys(r.message_id for r in receiver.accepted()))
        return len(seen) >= len(expected), seen

    seen = await poll_until(caught_up, 120, "every event after the outage", interval=0.5)
    assert seen == expected  # deduplicated by webhook-id: every event once, in order
    for got in receiver.accepted():
        got.verified(sub["secret"])
    rows = await deliveries(settings.database_url)
    assert {r["status"] for r in rows} == {"done"}, rows
    assert (await admin.counts(services.db)) == {"pending": 0, "dead": 0}


async def test_a_malformed_webhook_key_is_one_line(settings: Settings) -> None:
    result = await cstp(settings, "webhooks", "list", CSTP_WEBHOOK_KEY="too-short")
    assert result.exit_code == 1
    assert "CSTP_WEBHOOK_KEY must be 32 bytes written in base64" in result.stderr
    assert "too-short" not in result.stderr  # a key's text is never echoed
    good = base64.urlsafe_b64encode(os.urandom(32)).decode()
    assert (await cstp(settings, "webhooks", "list", CSTP_WEBHOOK_KEY=good)).exit_code == 0
