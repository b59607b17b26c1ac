"""bench.compare's pairing: each call goes to both sides in alternating order, and the figure
reported is the median over blocks of two pairs (one A-first, one B-first), in which a drift
common to both sides and the cost of going second both cancel."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench.client import Outcome
from bench.compare import Side, measure, median_interval, parse_args


class Clocked:
    """A client whose answers take ``base`` ms plus the machine's drift at that moment (the
    same for both sides: a shared clock that slows down call after call)."""

    def __init__(self, name: str, base: float, clock: list[float], order: list[str]) -> None:
        self.name, self.base, self.clock, self.order = name, base, clock, order

    async def call(self, method: str, params: dict[str, Any]) -> Outcome:
        self.order.append(self.name)
        self.clock[0] += 0.5  # the machine gets slower with every call, by far more than B - A
        return Outcome(True, self.base + self.clock[0])


def side(name: str, base: float, clock: list[float], order: list[str]) -> Side:
    s = Side(name, None, None)  # type: ignore[arg-type]  # measure() uses only the client
    s.client = Clocked(name, base, clock, order)  # type: ignore[assignment]  # a stand-in
    return s


def test_a_common_drift_cancels_and_the_order_alternates() -> None:
    clock: list[float] = [0.0]
    order: list[str] = []
    a, b = side("A", 10.0, clock, order), side("B", 10.3, clock, order)
    row = asyncio.run(measure(a, b, "cstp.announceIntent", [{}] * 100, warmup=[{}] * 2))
    # Within a pair the second call sees 0.5 ms more drift (A first always would say +0.8);
    # a block of an A-first and a B-first pair cancels it, and so does its interval.
    assert row["medianDiffMs"] == pytest.approx(0.3, abs=1e-9)
    assert row["medianDiff95"] == [pytest.approx(0.3, abs=1e-9)] * 2
    mean_difference = row["latencyMs"]["B"]["mean"] - row["latencyMs"]["A"]["mean"]
    assert mean_difference == pytest.approx(0.3, abs=0.01)  # both sides saw the same drift
    assert order[:4] == ["A", "B", "A", "B"]  # the warm-up
    assert order[4:8] == ["A", "B", "B", "A"]  # then A first on even calls, B on odd ones
    assert (row["pairs"], row["blocks"]) == (100, 50)
    assert row["errors"] == {"A": {}, "B": {}}


def test_the_pairs_of_a_failed_call_are_left_out() -> None:
    clock: list[float] = [0.0]
    order: list[str] = []
    a, b = side("A", 10.0, clock, order), side("B", 10.3, clock, order)
    client = b.client
    assert client is not None
    answered = client.call
    calls = iter(range(1000))

    async def failing_third(method: str, params: dict[str, Any]) -> Outcome:
        if next(calls) == 2 + 2:  # B's third measured call (after two warm-up calls)
            return Outcome(False, 99.0, "http-500")
        return await answered(method, params)

    client.call = failing_third  # type: ignore[method-assign]  # the stand-in's own method
    row = asyncio.run(measure(a, b, "cstp.announceIntent", [{}] * 10, warmup=[{}] * 2))
    assert row["errors"] == {"A": {}, "B": {"http-500": 1}}
    assert row["blocks"] == 4  # the block holding the failed call is left out
    assert row["medianDiffMs"] == pytest.approx(0.3, abs=1e-9)


def test_the_interval_holds_the_median_of_a_spread() -> None:
    diffs = [0.5 + (i % 7 - 3) * 0.1 for i in range(301)]
    low, high = median_interval(diffs)
    assert low <= 0.5 <= high and high - low < 0.3


def test_a_source_that_is_not_a_working_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--a-source", str(tmp_path)])
    with pytest.raises(SystemExit):
        parse_args(["--b-env", "RETRIEVAL_MODE=hybrid"])
    with pytest.raises(SystemExit):
        parse_args(["--calls", "21"])  # blocks of two pairs
    args = parse_args(["--b-env", "CSTP_RETRIEVAL_MODE=hybrid", "--calls", "20"])
    assert args.b_settings == {"CSTP_RETRIEVAL_MODE": "hybrid"} and args.a_settings == {}
