"""The calibration page's two pictures, laid out on the server (SPEC.md, section 10): a
reliability diagram of getCalibration's buckets and Brier score over time. This module only
computes coordinates; the template draws them as inline SVG, escaping every label."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# The plot area inside each picture's box, in SVG user units.
LEFT, TOP, SIZE = 48, 16, 280
WIDTH, HEIGHT = LEFT + SIZE + 16, TOP + SIZE + 40
#: Where each picture's template draws its box, axes and labels.
FRAME = {"width": WIDTH, "height": HEIGHT, "left": LEFT, "top": TOP, "size": SIZE}


def _x(value: float) -> float:
    return round(LEFT + value * SIZE, 1)


def _y(value: float, top: float = 1.0) -> float:
    return round(TOP + SIZE - (value / top) * SIZE, 1)


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    r: float
    label: str  # the point's title (its figures in words)
    data: dict[str, Any]  # its figures, as data-* attributes a test or a person can read


def reliability(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    """One point per bucket with scored decisions: mean confidence against accuracy, its
    area growing with the count; the diagonal is perfect calibration."""
    most = max((b["count"] for b in buckets), default=0) or 1
    points = []
    for b in buckets:
        if b["count"] == 0 or b["meanConfidence"] is None or b["accuracy"] is None:
            continue
        points.append(
            Point(
                _x(b["meanConfidence"]),
                _y(b["accuracy"]),
                round(4 + 8 * (b["count"] / most) ** 0.5, 1),
                f"{b['bucket']}: {b['count']} decisions, mean confidence "
                f"{b['meanConfidence']:.2f}, accuracy {b['accuracy']:.2f}",
                {
                    "bucket": b["bucket"],
                    "count": b["count"],
                    "confidence": b["meanConfidence"],
                    "accuracy": b["accuracy"],
                },
            )
        )
    ticks = [(round(i / 5, 1), _x(i / 5), _y(i / 5)) for i in range(6)]
    return {
        **FRAME,
        "diagonal": (_x(0), _y(0), _x(1), _y(1)),
        "ticks": ticks,
        "points": points,
    }


def month_starts(now: datetime, months: int) -> list[datetime]:
    """The first instants of the last ``months`` calendar months (UTC), oldest first, the
    current month last."""
    year, month = now.year, now.month
    starts = []
    for _ in range(months):
        starts.append(datetime(year, month, 1, tzinfo=UTC))
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
    return starts[::-1]


def brier_over_time(
    months: list[tuple[datetime, float | None, int]], drifted: bool
) -> dict[str, Any]:
    """One point per month with scored decisions (Brier score: lower is better), joined by a
    line; the last month is marked when the recent window drifted (checkDrift)."""
    top = max([0.5, *(b for _, b, _ in months if b is not None)])
    step = SIZE / max(1, len(months) - 1)
    points = []
    for i, (start, brier, scored) in enumerate(months):
        if brier is None:
            continue
        label = f"{start:%Y-%m}: Brier {brier:.3f} over {scored} reviewed decisions"
        points.append(
            Point(
                round(LEFT + i * step, 1),
                _y(brier, top),
                4,
                label,
                {"month": f"{start:%Y-%m}", "brier": round(brier, 3), "count": scored},
            )
        )
    labels = [(f"{start:%b}", round(LEFT + i * step, 1)) for i, (start, _, _) in enumerate(months)]
    ticks = [(round(top * i / 4, 2), _y(top * i / 4, top)) for i in range(5)]
    return {
        **FRAME,
        "points": points,
        "line": " ".join(f"{p.x},{p.y}" for p in points),
        "labels": labels,
        "ticks": ticks,
        "drifted": drifted and bool(points),
        "last": points[-1] if points else None,
    }
