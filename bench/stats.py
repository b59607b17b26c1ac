"""Latency summaries: percentiles by linear interpolation between closest ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """``q`` in [0, 100]; ``sorted_values`` must be sorted and non-empty."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low))


def summarize(samples_ms: Sequence[float]) -> dict[str, Any]:
    """p50/p95/p99/mean/max in ms, rounded for the report; empty input gives ``None`` values."""
    if not samples_ms:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    values = sorted(samples_ms)
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p95": round(percentile(values, 95), 3),
        "p99": round(percentile(values, 99), 3),
        "mean": round(sum(values) / len(values), 3),
        "max": round(values[-1], 3),
    }
