"""``POST /hooks/ci/<workspace>``: a CI report, verified, becomes reviews with source ``ci``.

What is refused, and why it changes nothing:

- The signature is the Standard Webhooks one (``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature`` over ``id.timestamp.body``), checked by the ``standardwebhooks``
  library with the workspace's CI secret. The library also refuses a timestamp more than
  ``TOLERANCE`` (5 minutes) from the wall clock, either way (tests hold it to that).
- A workspace that is not a workspace id, or has no CI secret, is refused like a bad
  signature: the caller learns only that its report was not accepted (the log says why).
- A report's ``webhook-id`` is written in the transaction of the reviews it makes, under the
  primary key (workspace, id), before any review: a replay, from any process, finds it and is
  refused with nothing written, and a crash before the commit leaves neither the id nor the
  reviews, so a report never reviews twice. On Postgres a replay that arrives while the first
  is being written waits for its commit (the INSERT of a key another transaction holds) and
  is then refused. Ids are remembered for ``KEEP_IDS``, far longer than a timestamp stays
  acceptable (up to 5 minutes ahead, 5 behind), and pruned by the reports that come after.

The reviews are made as reviewDecision makes one (app.decisions.reviews): each decision
locked, its review's time read after the locks and later than its earlier reviews', the
review chained (app.decisions.repository.add_review), and the YAML file and index entry
refreshed through the outbox, inline after the commit.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta
from sqlalchemy.exc import SQLAlchemyError
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from app.db.ci import CiDelivery
from app.db.outbox import OutboxEvent
from app.decisions import repository as decisions
from app.decisions.reviews import review_time
from app.runtime import utc_now
from app.scopes import workspace_problem
from app.webhooks.secrets import KeyUnavailable, SecretUnavailable, load_key, unseal
from app.wire import Count

from . import repository
from .admin import sealed_for

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("cstp.ci")

TOLERANCE = timedelta(minutes=5)  # the standardwebhooks library's, either way of now
KEEP_IDS = timedelta(hours=1)  # a report id's memory: well past TOLERANCE, and clock skew
HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, as the column holds it
REVIEWER = "ci"


class Refused(Exception):
    """Not accepted: a bad signature or timestamp, a replay, no such workspace or no CI
    secret. The caller is told none of these apart; ``reason`` is for the log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Malformed(Exception):
    """Signed by the workspace's CI, but not a report: the message says why, in a line."""


class Unavailable(Exception):
    """The database could not be used: nothing was stored, the report may be sent again."""


class Report(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    pr: Count
    status: Literal["success", "failure"]
    url: Annotated[str, Meta(max_length=2000, pattern=r"\Ahttps?://[^\x00-\x20\x7f]+\Z")] | None = (
        None
    )
    commit: Annotated[str, Meta(pattern=r"\A[0-9A-Fa-f]{4,64}\Z", max_length=64)] | None = None


def actual_result(report: Report) -> str:
    """What the review says happened: the CI status, and the commit and run when given."""
    text = f"CI reported {report.status} for pull request {report.pr}"
    if report.commit:
        text += f" at commit {report.commit}"
    if report.url:
        text += f": {report.url}"
    return text


def parse(body: bytes) -> Report:
    try:
        return msgspec.json.decode(body, type=Report, strict=True)
    except msgspec.ValidationError as exc:
        raise Malformed(f"not a CI report: {exc}") from None
    except msgspec.DecodeError:
        raise Malformed("the body is not a JSON object") from None


async def receive(
    services: Services, workspace: str, body: bytes, headers: Mapping[str, str]
) -> list[str]:
    """Verify the report and make its reviews; the ids of the decisions reviewed, in id
    order. Raises Refused, Malformed or Unavailable, each with nothing written."""
    try:
        return await _receive(services, workspace, body, headers)
    except (SQLAlchemyError, OSError):
        # OSError: asyncpg raises ConnectionRefusedError (and TimeoutError) unwrapped.
        log.exception("database error in a CI report for workspace %s", workspace)
        raise Unavailable() from None


async def _receive(
    services: Services, workspace: str, body: bytes, headers: Mapping[str, str]
) -> list[str]:
    if workspace_problem(workspace) is not None:
        raise Refused("not a workspace id")
    try:
        secret = await _secret(services, workspace)
    except Refused:
        # The same signature check against a secret nobody has, so that a workspace without
        # a CI secret answers in about the time of one with a wrong signature.
        with contextlib.suppress(WebhookVerificationError):
            Webhook(_DECOY).verify(body, dict(headers), json_parse=False)
        raise
    try:
        Webhook(secret).verify(body, dict(headers), json_parse=False)
    except WebhookVerificationError as exc:
        raise Refused(f"not verified: {exc}") from None
    message_id = headers["webhook-id"]
    if MESSAGE_ID.fullmatch(message_id) is None:
        raise Malformed("webhook-id must be 1 to 128 printable ASCII characters, no spaces")
    report = parse(body)
    # The library accepted it: a number of seconds within TOLERANCE of now.
    signed_at = datetime.fromtimestamp(float(headers["webhook-timestamp"]), UTC)
    relay = services.relay
    events: list[OutboxEvent] = []
    async with services.db.transaction(write=True) as session:
        # The wall clock, as the library's timestamp check reads it (not the runtime's).
        await repository.prune_deliveries(session, utc_now() - KEEP_IDS)
        fresh = await repository.record_delivery(
            session,
            CiDelivery(
                workspace=workspace,
                message_id=message_id,
                signed_at=signed_at,
                received_at=services.runtime.now(),
                pr=report.pr,
                status=report.status,
                reviewed=0,
            ),
        )
        if not fresh:
            raise Refused("a replayed webhook-id")  # rolls the transaction back
        found = await decisions.lock_unreviewed_of_pr(session, workspace, report.pr)
        now = services.runtime.now()  # after the locks: the reviews' times follow their order
        last = await decisions.last_review_times(session, [d.id for d in found]) if found else {}
        result = actual_result(report)
        for decision in found:
            at = review_time(now, last.get(decision.id))
            decisions.add_review(
                session,
                decision,
                outcome=report.status,
                actual_result=result,
                lessons=None,
                notes=None,
                affected_kpis=None,
                reviewed_by=REVIEWER,
                reviewed_at=at,
                source="ci",  # observed, not claimed
            )
            events.extend(relay.enqueue(session, decision.id, decision.workspace))
        if found:
            await repository.set_reviewed(session, workspace, message_id, len(found))
        await session.flush()
    log.info(
        "CI report %s for workspace %s: pull request %d %s, %d decisions reviewed",
        message_id,
        workspace,
        report.pr,
        report.status,
        len(found),
    )
    if events:
        try:
            await relay.process(events, found)
        except Exception:
            # The reviews are committed; the outbox loop finishes what failed here.
            log.exception("after-commit outbox pass of a CI report failed")
    return [d.id for d in found]


_DECOY = "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")


async def _secret(services: Services, workspace: str) -> str:
    async with services.db.transaction(write=False) as session:
        row = await repository.secret_of(session, workspace)
    if row is None:
        raise Refused("no CI secret for the workspace")
    try:
        # never made here: an unauthenticated request must not create the key file
        key = load_key(services.settings, create=False)
        return unseal(key, sealed_for(workspace), row.secret_sealed, row.key_id)
    except (KeyUnavailable, SecretUnavailable) as exc:
        log.error(
            "the CI secret of workspace %s cannot be used (%s): run `cstp webhooks ci-secret "
            "--workspace %s` again with this server's webhook key",
            workspace,
            exc,
            workspace,
        )
        raise Refused("the CI secret cannot be opened") from None
