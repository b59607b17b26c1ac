"""The benchmark's verdicts: growth with the corpus is judged on the tail too, and the
at-scale targets are checked at 100,000 decisions; its progress reaches a log file."""

from __future__ import annotations

from typing import Any

import pytest

from bench import run
from bench.run import evaluate_growth, evaluate_targets


def size(n: int, p50: float, p95: float, p99: float, floor: float = 5.0) -> dict[str, Any]:
    row = {
        "method": "cstp.announceIntent",
        "concurrency": 1,
        "latencyMs": {"p50": p50, "p95": p95, "p99": p99},
        "errorCount": 0,
    }
    return {"size": n, "floor": {"floorMs": floor}, "methods": [row]}


def test_a_tail_that_grows_faster_than_log_n_fails_though_the_median_passes() -> None:
    growth = evaluate_growth([size(1_000, 12.0, 14.0, 15.0), size(100_000, 13.0, 88.5, 104.0)])
    by_metric = {g["metric"]: g for g in growth}
    assert set(by_metric) == {"p50", "p95", "p99"}
    allowed = by_metric["p50"]["logNRatio"]
    assert allowed == round(5 / 3, 3)  # ln(100,000) / ln(1,000)
    assert by_metric["p50"]["status"] == "pass"
    assert (by_metric["p95"]["status"], by_metric["p99"]["status"]) == ("FAIL", "FAIL")
    assert (by_metric["p99"]["valueFrom"], by_metric["p99"]["valueTo"]) == (15.0, 104.0)


def test_the_at_scale_targets_are_judged_at_100000_decisions() -> None:
    sizes = [size(1_000, 12.0, 14.0, 15.0), size(100_000, 13.0, 30.0, 49.0)]
    targets = {t["target"]: t for t in evaluate_targets(sizes)}
    one = targets["at scale: announceIntent p99 <= 50 ms, 1 client"]
    assert (one["status"], one["value"], one["measuredAt"]) == ("pass", 49.0, [100_000])
    assert not one["approximate"]
    eight = targets["at scale: announceIntent p99 <= 150 ms, 8 clients"]
    assert eight["status"] == "not measured"  # no row with 8 clients


def test_progress_reaches_a_log_file_every_so_often(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Elsewhere than on a terminal, an unfinished progress line is written now and then (a
    seeding of 100,000 decisions takes twenty minutes), a final one always."""
    now = [1000.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(run, "_last_progress", [0.0])
    run.log("seed 10/100", final=False)
    now[0] += 1
    run.log("seed 20/100", final=False)  # too soon after the last one: not written
    now[0] += run.PROGRESS_EVERY_S
    run.log("seed 90/100", final=False)
    run.log("seed 100/100")
    assert capsys.readouterr().err.splitlines() == ["seed 10/100", "seed 90/100", "seed 100/100"]
