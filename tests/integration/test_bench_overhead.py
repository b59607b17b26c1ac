"""``python -m bench.overhead`` at a tiny size, end to end, for both features it switches:
the feature is on for exactly the calls it should be (the metrics count them; tracing makes
their spans) and off for the others, so its figure is the feature's cost and nothing else.
Slow: each run is a process that loads the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.server import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("feature", "method", "seen"),
    [
        ("metrics", "cstp.announceIntent", 10),
        ("tracing", "cstp.queryDecisions", 10),
        ("none", "cstp.checkGuardrails", None),  # A/A: nothing to count
    ],
)
def test_the_feature_is_on_for_half_of_the_calls(
    tmp_path: Path, feature: str, method: str, seen: int | None
) -> None:
    out = tmp_path / "overhead.json"
    argv = ["--feature", feature, "--method", method, "--size", "20", "--calls", "10"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", *argv, "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["feature"], report["method"], report["pairs"]) == (feature, method, 10)
    assert report["seenByFeature"] == seen
    assert report["offP50"] > 0 and report["onP50"] > 0
    assert f"{feature} on - off over 10 pairs" in done.stdout
