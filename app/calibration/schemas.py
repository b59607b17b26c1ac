"""Wire shapes of cstp.getCalibration: the strict params structs, and the figures the answer
reports (rounding, interpretation, one slice's figures) as pure functions of the SQL sums.

SPEC section 2 lets older clients send the filters at the top level of params instead of
inside ``filters``; both spellings are declared here so each is validated with its own field
path (``filters.minDecisions`` or ``minDecisions``) in the -32602 it may earn.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from app.runtime import iso
from app.wire import AgentIn, Moment, ReviewSource, ShortText, Stakes, Struct

GroupBy = Literal["category", "stakes", "agent", "confidenceBucket"]
MinDecisions = Annotated[int, Meta(ge=1, le=1_000_000_000)]

DEFAULT_MIN_DECISIONS = 5


class CalibrationFilters(Struct):
    """Which decisions are scored; every filter given is applied, in any combination."""

    agent: ShortText | None = None
    category: ShortText | None = None
    stakes: Stakes | None = None
    since: Moment | None = None
    until: Moment | None = None
    min_decisions: MinDecisions | None = None
    # Only outcomes from these sources (SPEC.md, section 9): observed ones (ci), a person's
    # (human), the agents' own claims (agent). Absent: every source, as ``sources`` says.
    source: Annotated[list[ReviewSource], Meta(min_length=1, max_length=3)] | None = None


class GetCalibrationParams(Struct):
    filters: CalibrationFilters | None = None
    group_by: GroupBy | None = None
    # Top-level aliases of the filters (used when ``filters`` does not give the key).
    # ``agent`` may also arrive as the informational ``{"id": ...}`` object older clients
    # send about themselves; that form is never a filter and is ignored.
    agent: ShortText | AgentIn | None = None
    category: ShortText | None = None
    stakes: Stakes | None = None
    since: Moment | None = None
    until: Moment | None = None
    min_decisions: MinDecisions | None = None


@dataclass(frozen=True)
class Filters:
    """The filters of one call after merging ``filters`` with their top-level aliases."""

    agent: str | None = None
    category: str | None = None
    stakes: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_decisions: int = DEFAULT_MIN_DECISIONS
    source: tuple[str, ...] | None = None

    def wire(self) -> AppliedFilters:
        """What was applied, echoed so a client can tell which slice the figures describe."""
        return AppliedFilters(
            agent=self.agent,
            category=self.category,
            stakes=self.stakes,
            since=iso(self.since) if self.since else None,
            until=iso(self.until) if self.until else None,
            min_decisions=self.min_decisions,
            source=None if self.source is None else list(self.source),
        )


BUCKETS = 10
TOLERANCE = 0.05  # |gap| up to this is well calibrated
MARGIN = 0.15  # |gap| past this is plainly over- or underconfident
STAKES_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}


def round3(value: float) -> float:
    """Half-up to 3 decimals on the shortest decimal form of ``value``: 0.2285 reports 0.229
    (binary ``round`` says 0.228), and -0.0 never shows."""
    return float(Decimal(repr(value)).quantize(Decimal("0.001"), ROUND_HALF_UP)) + 0.0


def percent(value: float) -> int:
    """A share as a whole percentage, half-up (0.6667 -> 67)."""
    return int(Decimal(repr(value * 100)).quantize(Decimal(1), ROUND_HALF_UP))


def interpret(gap: float) -> str:
    """Name a (rounded) calibration gap; negative means more confident than outcomes justify.

    Judged on the rounded gap so the label always agrees with the figure reported beside it.
    """
    if gap < -MARGIN:
        return "overconfident"
    if gap < -TOLERANCE:
        return "slightly_overconfident"
    if gap <= TOLERANCE:
        return "well_calibrated"
    if gap <= MARGIN:
        return "slightly_underconfident"
    return "underconfident"


@dataclass(frozen=True)
class Sums:
    """The database's sums for one slice of decisions; every figure derives from them."""

    matched: int = 0  # decisions matching the filters
    reviewed: int = 0  # ... that have an outcome (abandoned included)
    scored: int = 0  # ... whose outcome is scored
    sum_confidence: float = 0.0
    sum_score: float = 0.0
    sum_squared_error: float = 0.0

    def _mean(self, total: float) -> float | None:
        return round3(total / self.scored) if self.scored else None

    @property
    def brier(self) -> float | None:
        return self._mean(self.sum_squared_error)

    @property
    def accuracy(self) -> float | None:
        return self._mean(self.sum_score)

    @property
    def mean_confidence(self) -> float | None:
        return self._mean(self.sum_confidence)

    @property
    def gap(self) -> float | None:
        return self._mean(self.sum_score - self.sum_confidence)


def figures(s: Sums, min_decisions: int) -> Figures:
    """The figures of one slice; fewer scored decisions than asked is a clear answer (the
    figures, the counts and ``insufficient_data``), not an error."""
    gap = s.gap
    sufficient = gap is not None and s.scored >= min_decisions
    return Figures(
        brier_score=s.brier,
        accuracy=s.accuracy,
        calibration_gap=gap,
        interpretation=interpret(gap) if sufficient and gap is not None else "insufficient_data",
        total_decisions=s.scored,
        reviewed_decisions=s.reviewed,
        pending_decisions=s.matched - s.reviewed,
        mean_confidence=s.mean_confidence,
    )


def group_figures(key: str, s: Sums, min_decisions: int) -> GroupOut:
    """One group's figures, its key first."""
    return GroupOut(key=key, **msgspec.structs.asdict(figures(s, min_decisions)))


def bucket_label(index: int) -> str:
    return f"{index / 10:.1f}-{(index + 1) / 10:.1f}"


def bucket_wire(index: int, s: Sums) -> BucketOut:
    return BucketOut(
        bucket=bucket_label(index),
        low=round3(index / 10),
        high=round3((index + 1) / 10),
        count=s.scored,
        mean_confidence=s.mean_confidence,
        accuracy=s.accuracy,
        gap=s.gap,
        brier_score=s.brier,
    )


class Figures(Struct):
    """One slice's figures; null where no decision of the slice can be scored."""

    brier_score: float | None
    accuracy: float | None
    calibration_gap: float | None
    interpretation: str
    total_decisions: int
    reviewed_decisions: int
    pending_decisions: int
    mean_confidence: float | None


class BucketOut(Struct):
    bucket: str
    low: float
    high: float
    count: int
    mean_confidence: float | None
    accuracy: float | None
    gap: float | None
    brier_score: float | None


# One group's figures (those of ``Figures``) with its key first, as the answer has always
# listed them.
class GroupOut(Struct):
    key: str
    brier_score: float | None
    accuracy: float | None
    calibration_gap: float | None
    interpretation: str
    total_decisions: int
    reviewed_decisions: int
    pending_decisions: int
    mean_confidence: float | None


# The filters applied: those not given are absent, ``minDecisions`` always there. kw_only is
# the base's already; restated so that mypy lets a field without a default follow fields with
# one (the order is the answer's key order).
class AppliedFilters(Struct, omit_defaults=True, kw_only=True):
    agent: str | None = None
    category: str | None = None
    stakes: str | None = None
    since: str | None = None
    until: str | None = None
    min_decisions: int
    source: list[str] | None = None


# ``groupBy`` and ``groups`` are there only when the call grouped.
class GetCalibrationResult(Struct, omit_defaults=True, kw_only=True):
    brier_score: float | None
    accuracy: float | None
    calibration_gap: float | None
    interpretation: str
    overall: Figures
    buckets: list[BucketOut]
    recommendations: list[str]
    group_by: GroupBy | None = None
    groups: list[GroupOut] | None = None
    filters: AppliedFilters
    agent: str
    # The sources of the outcomes scored (agent, ci, human): claimed and observed outcomes
    # are never blended without saying so.
    sources: list[str]
