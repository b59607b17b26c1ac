"""The pure arithmetic of cstp.getCalibration: rounding, the interpretation scale (which must
reproduce SPEC's worked examples), one slice's figures, and the advice built from them."""

from __future__ import annotations

import pytest
from msgspec import to_builtins

from app.calibration.schemas import (
    Sums,
    bucket_label,
    bucket_wire,
    figures,
    interpret,
    percent,
    round3,
)
from app.calibration.service import recommendations


def sums(pairs: list[tuple[float, float]], unscored: int = 0, pending: int = 0) -> Sums:
    """Sums as the database would return them for (confidence, score) pairs."""
    n = len(pairs)
    return Sums(
        matched=n + unscored + pending,
        reviewed=n + unscored,
        scored=n,
        sum_confidence=sum(c for c, _ in pairs),
        sum_score=sum(s for _, s in pairs),
        sum_squared_error=sum((c - s) ** 2 for c, s in pairs),
    )


@pytest.mark.parametrize(
    ("value", "rounded"),
    [
        (0.22916666666666666, 0.229),
        (0.6666666666666666, 0.667),
        (-0.08333333333333337, -0.083),
        (0.2285, 0.229),
        (0.0005, 0.001),
        (-0.0004, 0.0),
        (1.0, 1.0),
        (0.04000000000000001, 0.04),
    ],
)
def test_round3_is_half_up_on_the_decimal_form(value: float, rounded: float) -> None:
    assert round3(value) == rounded
    assert str(round3(-0.0001)) == "0.0"  # never "-0.0"


def test_percent() -> None:
    assert (percent(0.6666), percent(0.675), percent(1.0), percent(0.0)) == (67, 68, 100, 0)


@pytest.mark.parametrize(
    ("gap", "label"),
    [
        (-0.5, "overconfident"),
        (-0.151, "overconfident"),
        (-0.15, "slightly_overconfident"),
        (-0.083, "slightly_overconfident"),
        (-0.051, "slightly_overconfident"),
        (-0.05, "well_calibrated"),
        (0.0, "well_calibrated"),
        (0.05, "well_calibrated"),
        (0.051, "slightly_underconfident"),
        (0.15, "slightly_underconfident"),
        (0.151, "underconfident"),
        (0.2, "underconfident"),
        (1.0, "underconfident"),
    ],
)
def test_interpretation_scale(gap: float, label: str) -> None:
    assert interpret(gap) == label


def test_worked_example_a() -> None:
    s = sums([(0.75, 1.0)] * 4 + [(0.75, 0.0)] * 2)
    f = to_builtins(figures(s, 5))
    assert (f["brierScore"], f["accuracy"], f["calibrationGap"]) == (0.229, 0.667, -0.083)
    assert f["interpretation"] == "slightly_overconfident"
    assert (f["meanConfidence"], f["totalDecisions"], f["reviewedDecisions"]) == (0.75, 6, 6)


def test_worked_example_b() -> None:
    f = to_builtins(figures(sums([(0.8, 1.0)] * 5), 5))
    assert (f["brierScore"], f["accuracy"], f["calibrationGap"]) == (0.04, 1.0, 0.2)
    assert f["interpretation"] == "underconfident"


def test_the_label_follows_the_rounded_gap() -> None:
    # Raw gap -0.0504 reports as -0.05, so it must read as well calibrated, not "slightly".
    s = Sums(
        matched=5, reviewed=5, scored=5, sum_confidence=2.752, sum_score=2.5, sum_squared_error=1.0
    )
    f = to_builtins(figures(s, 5))
    assert f["calibrationGap"] == -0.05 and f["interpretation"] == "well_calibrated"


def test_too_few_scored_decisions_is_insufficient_data() -> None:
    f = to_builtins(figures(sums([(0.9, 1.0)] * 4, unscored=3, pending=2), 5))
    assert f["interpretation"] == "insufficient_data"
    assert (f["totalDecisions"], f["reviewedDecisions"], f["pendingDecisions"]) == (4, 7, 2)
    assert f["brierScore"] == 0.01
    empty = to_builtins(figures(Sums(), 1))
    assert empty["interpretation"] == "insufficient_data"
    assert empty["brierScore"] is None and empty["calibrationGap"] is None


def test_buckets() -> None:
    assert [bucket_label(i) for i in (0, 7, 9)] == ["0.0-0.1", "0.7-0.8", "0.9-1.0"]
    wire = to_builtins(bucket_wire(7, sums([(0.75, 1.0)] * 4 + [(0.75, 0.0)] * 2)))
    assert wire == {
        "bucket": "0.7-0.8",
        "low": 0.7,
        "high": 0.8,
        "count": 6,
        "meanConfidence": 0.75,
        "accuracy": 0.667,
        "gap": -0.083,
        "brierScore": 0.229,
    }


def test_recommendations_name_the_miscalibrated_bucket() -> None:
    bucket = sums([(0.75, 1.0)] * 4 + [(0.75, 0.0)] * 2)
    advice = recommendations(bucket, [(7, bucket)], None, None, 5)
    assert advice[0].startswith("Overall you state 75% confidence and succeed 67%")
    assert advice[1] == (
        "Your 0.7-0.8 decisions succeed 67% of the time: lower confidence "
        "there or gather more evidence before deciding."
    )


def test_recommendations_when_data_is_short_or_pending() -> None:
    few = sums([(0.9, 1.0)] * 2, pending=4)
    advice = recommendations(few, [(9, few)], None, None, 5)
    assert "review more decisions" in advice[0] and "Only 2" in advice[0]
    assert advice[1].startswith("4 matching decision(s) have no review yet")
    assert len(advice) == 2  # a 2-decision bucket is not judged


def test_recommendations_for_groups_and_well_calibrated() -> None:
    good = sums([(0.5, 1.0), (0.5, 0.0)] * 3)
    under = sums([(0.6, 1.0)] * 5)
    advice = recommendations(good, [], [("security", good), ("tooling", under)], "category", 5)
    assert advice[0].startswith("Your stated confidence (50%) matches your success rate (50%)")
    assert advice[1].startswith("category 'tooling' is underconfident (gap +0.400 over 5")
    assert len(advice) == 2
