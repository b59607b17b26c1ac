"""cstp.ready (SPEC.md, section 9): the caller's work list, most urgent first.

- ``review_due``: a decision whose ``reviewIn`` has passed and that has no outcome;
- ``stale_pending``: no outcome, no ``reviewIn``, recorded more than 30 days ago;
- ``calibration_drift``: a category in which the agent's recent window drifted
  (app.calibration.drift, with its defaults).

Priorities: a drift and a review overdue by a week or more are ``high``, a review overdue by
less ``medium``, a stale decision ``low``; within a priority the oldest first (``since``: when
the item became due). All from SQL over the stored decisions and reviews and the clock, so
every server process gives the same list.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

from msgspec import Meta

from app import scopes
from app.calibration.drift import CheckDriftParams, drift_groups, window_start
from app.errors import forbidden
from app.operations.context import CallContext
from app.runtime import iso
from app.wire import ShortText, Struct

from . import repository

STALE_AFTER = timedelta(days=30)
OVERDUE_HIGH = timedelta(days=7)
Kind = Literal["review_due", "stale_pending", "calibration_drift"]
Priority = Literal["high", "medium", "low"]
_RANK = {"high": 0, "medium": 1, "low": 2}


class ReadyParams(Struct):
    limit: Annotated[int, Meta(ge=1, le=200)] = 20
    agent: ShortText | None = None


# omit_defaults: ``decisionId`` and ``category`` are absent where they do not apply.
class ReadyItem(Struct, omit_defaults=True):
    kind: Kind
    priority: Priority
    agent: str
    reason: str
    since: str
    decision_id: str | None = None
    category: str | None = None


class ReadyResult(Struct):
    items: list[ReadyItem]
    total: int


def _days(delta: timedelta) -> int:
    return max(0, delta.days)


async def ready(ctx: CallContext, p: ReadyParams) -> ReadyResult:
    agent = p.agent or ctx.agent
    if agent != ctx.agent and not ctx.principal.may(scopes.REVIEW_ANY):
        raise forbidden(scopes.REVIEW_ANY, "another agent's work list needs this scope")
    now = ctx.services.runtime.now()
    due, due_total, stale, stale_total = await ctx.session.run_sync(
        lambda s: repository.waiting(
            s.connection(),
            workspace=ctx.workspace,
            agent=agent,
            now=now,
            stale_before=now - STALE_AFTER,
            limit=p.limit,
        )
    )
    ranked: list[tuple[int, datetime, str, ReadyItem]] = []
    for d in due:
        late = now - d.review_by
        priority: Priority = "high" if late >= OVERDUE_HIGH else "medium"
        ranked.append(
            (
                _RANK[priority],
                d.review_by,
                d.id,
                ReadyItem(
                    kind="review_due",
                    priority=priority,
                    agent=agent,
                    reason=f"review due {_days(late)} day(s) ago: {d.summary}",
                    since=iso(d.review_by),
                    decision_id=d.id,
                    category=d.category,
                ),
            )
        )
    for d in stale:
        became = d.created_at + STALE_AFTER
        ranked.append(
            (
                _RANK["low"],
                became,
                d.id,
                ReadyItem(
                    kind="stale_pending",
                    priority="low",
                    agent=agent,
                    reason=(
                        f"no outcome {_days(now - d.created_at)} day(s) after it was recorded, "
                        f"and no review date: {d.summary}"
                    ),
                    since=iso(became),
                    decision_id=d.id,
                    category=d.category,
                ),
            )
        )
    drift = CheckDriftParams(agent=agent)
    drifted = [g for g in await drift_groups(ctx, drift) if g.drifted]
    began = window_start(now, drift)
    for g in drifted:
        ranked.append(
            (
                _RANK["high"],
                began,
                g.category,
                ReadyItem(
                    kind="calibration_drift",
                    priority="high",
                    agent=agent,
                    reason=f"calibration drifted in {g.category}: " + "; ".join(g.reasons),
                    since=iso(began),
                    category=g.category,
                ),
            )
        )
    ranked.sort(key=lambda item: item[:3])
    return ReadyResult(
        items=[item for *_, item in ranked[: p.limit]],
        total=due_total + stale_total + len(drifted),
    )
