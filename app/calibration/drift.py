"""cstp.checkDrift (SPEC.md, section 9): is an agent's judgement in a category getting worse?

Per agent x category, the decisions reviewed in the last ``recentDays`` days (the recent
window) against those reviewed in the ``baselineDays`` days before it (the baseline), both by
review time. Drifted: recent Brier score worse than the baseline's by more than 20% (relative),
or accuracy lower by more than 15 points; each window with at least ``minDecisions`` scored
(reviewed, not abandoned) decisions, else nothing is concluded. The answer carries the
numbers that decided it, so a person can check the judgement.

Sums come from SQL over the decisions' latest reviews (app.calibration.repository), so every
server process gives the same answer for the same stored state and clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from msgspec import Meta

from app.operations.context import CallContext
from app.wire import ShortText, Struct

from . import repository
from .schemas import round3

BRIER_WORSE = 0.20  # relative
ACCURACY_DROP = 0.15  # absolute: 15 points
# "More than": a difference equal to a threshold is not drift, though floating point may
# make 0.9 - 0.75 a hair over 0.15.
EPSILON = 1e-9
Days = Annotated[int, Meta(ge=1, le=3650)]


class CheckDriftParams(Struct):
    agent: ShortText | None = None
    category: ShortText | None = None
    recent_days: Days = 30
    baseline_days: Days = 90
    min_decisions: Annotated[int, Meta(ge=1, le=1_000_000)] = 5


class WindowOut(Struct):
    n: int  # scored decisions reviewed in the window
    brier_score: float | None
    accuracy: float | None


class DriftGroup(Struct):
    agent: str
    category: str
    recent: WindowOut
    baseline: WindowOut
    drifted: bool
    reasons: list[str]


class CheckDriftResult(Struct):
    groups: list[DriftGroup]


class Window:
    """One window's sums."""

    def __init__(self, n: int = 0, score: float = 0.0, squared: float = 0.0) -> None:
        self.n, self.score, self.squared = n, score, squared

    @property
    def brier(self) -> float | None:
        return self.squared / self.n if self.n else None

    @property
    def accuracy(self) -> float | None:
        return self.score / self.n if self.n else None

    def wire(self) -> WindowOut:
        brier, accuracy = self.brier, self.accuracy
        return WindowOut(
            n=self.n,
            brier_score=None if brier is None else round3(brier),
            accuracy=None if accuracy is None else round3(accuracy),
        )


def judge(recent: Window, baseline: Window, p: CheckDriftParams) -> list[str]:
    """Why the recent window drifted from the baseline ([] when it did not, or when either
    window has too few decisions to say)."""
    if recent.n < p.min_decisions or baseline.n < p.min_decisions:
        return []
    reasons = []
    rb, bb = recent.brier, baseline.brier
    assert rb is not None and bb is not None
    if rb > bb * (1 + BRIER_WORSE) + EPSILON:
        worse = "" if bb == 0 else f" ({(rb - bb) / bb * 100:+.0f}%)"
        reasons.append(
            f"Brier score {rb:.3f} in the last {p.recent_days} days against {bb:.3f} in the "
            f"{p.baseline_days} days before{worse}: more than 20% worse"
        )
    ra, ba = recent.accuracy, baseline.accuracy
    assert ra is not None and ba is not None
    if ba - ra > ACCURACY_DROP + EPSILON:
        reasons.append(
            f"accuracy {ra:.3f} in the last {p.recent_days} days against {ba:.3f} in the "
            f"{p.baseline_days} days before ({(ra - ba) * 100:+.0f} points): more than 15 "
            "points lower"
        )
    return reasons


async def drift_groups(ctx: CallContext, p: CheckDriftParams) -> list[DriftGroup]:
    """Every agent x category with a decision reviewed in either window, by agent then
    category."""
    now = ctx.services.runtime.now()
    split = now - timedelta(days=p.recent_days)
    since = split - timedelta(days=p.baseline_days)
    # in the call's session: an aggregate over the windows, not a short indexed read
    rows = await ctx.session.run_sync(
        lambda s: repository.drift_sums(
            s.connection(),
            workspace=ctx.workspace,
            agent=p.agent,
            category=p.category,
            since=since,
            split=split,
            until=now,
        )
    )
    windows: dict[tuple[str, str], dict[str, Window]] = {}
    for agent, category, window, n, score, squared in rows:
        windows.setdefault((agent, category), {})[window] = Window(n, score, squared)
    groups = []
    for (agent, category), sides in sorted(windows.items()):
        recent, baseline = sides.get("recent", Window()), sides.get("baseline", Window())
        reasons = judge(recent, baseline, p)
        groups.append(
            DriftGroup(
                agent=agent,
                category=category,
                recent=recent.wire(),
                baseline=baseline.wire(),
                drifted=bool(reasons),
                reasons=reasons,
            )
        )
    return groups


async def check_drift(ctx: CallContext, p: CheckDriftParams) -> CheckDriftResult:
    return CheckDriftResult(groups=await drift_groups(ctx, p))


def window_start(now: datetime, p: CheckDriftParams) -> datetime:
    """When the recent window begins (a drift's ``since`` in ready)."""
    return now - timedelta(days=p.recent_days)
