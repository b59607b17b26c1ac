"""bench.console without a server: the journal it imports is one ``cstp import`` reads, with
reviews and review dates where the console's pages look for them, and a page that is not a
200 with its rows stops the run instead of being timed."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from app.config import DEFAULT_CATEGORIES
from app.console.charts import month_starts
from app.decisions.import_file import parse_file
from bench.console import LEAD, MONTHS_WITH_DATA, Page, check, journal, parse_args
from bench.seed import Generator
from bench.server import BenchError

NOW = datetime(2025, 6, 3, 12, 0, tzinfo=UTC)  # early in a month: the current one holds little


def test_the_journal_imports_as_a_year_of_partly_reviewed_decisions(tmp_path: Path) -> None:
    written = journal(tmp_path, 400, Generator(seed=7), NOW)
    files = sorted(tmp_path.rglob("*.yaml"))
    assert len(files) == len(written) == 400
    decisions = [parse_file(f, DEFAULT_CATEGORIES, 1_048_576) for f in files]
    assert {d.id for d in decisions} == {w.id for w in written}
    reviewed = [d for d in decisions if d.status == "reviewed"]
    assert 0.4 < len(reviewed) / len(decisions) < 0.8
    for d in decisions:  # the import reads every date as UTC
        assert NOW - timedelta(days=366) < d.created_at <= NOW
    for d in reviewed:
        assert d.outcome in {"success", "partial", "failure", "abandoned"}
        assert d.created_at < d.reviewed_at <= NOW
    # the calibration page's months: scored decisions in nearly every one of the twelve
    starts = month_starts(NOW, 12)
    scored = Counter(
        max(i for i, s in enumerate(starts) if s <= d.created_at)
        for d in reviewed
        if d.created_at >= starts[0]
    )
    assert len(scored) >= MONTHS_WITH_DATA
    # the signed-in agent's work list: decisions of its own, waiting for a review now due
    due = [
        d
        for d in decisions
        if d.recorded_by == LEAD and d.outcome is None and d.review_by is not None
    ]
    assert due and any(d.review_by <= NOW for d in due)


def test_the_same_seed_writes_the_same_texts(tmp_path: Path) -> None:
    a = journal(tmp_path / "a", 50, Generator(seed=3), NOW)
    b = journal(tmp_path / "b", 50, Generator(seed=3), NOW)
    assert a == b
    first = sorted((tmp_path / "a").rglob("*.yaml"))[0]
    assert first.read_text() == (tmp_path / "b" / first.relative_to(tmp_path / "a")).read_text()


PAGE = Page("approvals", ("/console/approvals",), ("Pending (4)",), ("<article", 2))


def response(status: int, body: str) -> httpx.Response:
    return httpx.Response(status, text=body, request=httpx.Request("GET", "http://127.0.0.1/"))


def test_a_page_with_its_rows_counts() -> None:
    check(PAGE, "/console/approvals", response(200, "Pending (4) <article> <article>"))


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (303, "", "HTTP 303"),  # the session was lost: a redirect to the sign-in page
        (500, "Something went wrong", "HTTP 500"),
        (200, "Pending (0) Nothing is waiting", "lacks ['Pending (4)', '2 x <article']"),
        (200, "Pending (4) <article>", "lacks ['2 x <article']"),
    ],
)
def test_an_error_or_an_empty_page_stops_the_run(status: int, body: str, message: str) -> None:
    with pytest.raises(BenchError, match=re.escape(message)):
        check(PAGE, "/console/approvals", response(status, body))


def test_too_small_a_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--decisions", "10"])
    assert exited.value.code == 2
    assert "--decisions must be at least 100" in capsys.readouterr().err
