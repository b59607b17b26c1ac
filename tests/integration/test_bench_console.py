"""``python -m bench.console`` at a tiny size, end to end: it imports, starts the real server,
signs in as a browser, times every console page and writes its report, so the benchmark of
issue #41 cannot rot while the console changes. Slow: a server process and two ``cstp``
commands, each loading the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import console

pytestmark = pytest.mark.slow


def test_every_console_page_is_timed_on_imported_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "console.json"
    argv = ["--decisions", "150", "--calls", "10", "--warmup", "1", "--out", str(out)]
    assert console.main(argv) == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["decisions"] == 150
    assert 0 < report["reviewed"] < 150
    assert report["approvals"] == {"pending": 4, "decided": 2}
    assert report["serverProblems"] == []
    assert list(report["pages"]) == [
        "decisions",
        "decisions?q=<word>",
        "decisions?category=security",
        "decisions?page=6",
        "decisions/<id>",
        "approvals",
        "ready",
        "calibration",
        "guardrails",
        "audit",
    ]
    for row in report["pages"].values():
        assert row["latencyMs"]["n"] == 10
        assert 0 < row["latencyMs"]["p50"] <= row["latencyMs"]["max"]
    table = capsys.readouterr().out
    assert "| calibration |" in table and "upper bound of server time" in table
    assert out.with_suffix(".server.log").exists()  # kept beside the result
