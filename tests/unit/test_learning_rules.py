"""The pure parts of the learning loop: drift's thresholds at their boundaries, and a session
brief that never exceeds its budget however long its task or agent name."""

from __future__ import annotations

from typing import Any

from app.calibration.drift import CheckDriftParams, Window, judge
from app.learning.brief import encoded, fit, markdown
from app.search.embedder import token_counter


def test_a_drop_of_exactly_15_points_is_not_drift() -> None:
    p = CheckDriftParams(min_decisions=4)
    baseline = Window(10, 9.0, 10 * 0.01)  # accuracy 0.9
    exactly = Window(4, 3.0, 4 * 0.01)  # 0.75: 15 points lower (0.15000000000000002 as floats)
    assert judge(exactly, baseline, p) == []
    lower = Window(4, 2.9, 4 * 0.01)  # 0.725: more than 15 points
    assert any("points lower" in r for r in judge(lower, baseline, p))


def test_a_brier_exactly_20_percent_worse_is_not_drift() -> None:
    p = CheckDriftParams(min_decisions=1)
    baseline = Window(5, 5.0, 5 * 0.1)  # Brier 0.1
    assert judge(Window(5, 5.0, 5 * 0.12), baseline, p) == []  # 0.12: exactly 20% worse
    assert judge(Window(5, 5.0, 5 * 0.13), baseline, p) != []
    assert judge(Window(4, 5.0, 4 * 0.9), baseline, CheckDriftParams()) == []  # too few


def empty(agent: str, task: str | None) -> dict[str, Any]:
    return {
        "agent": agent,
        "task": task,
        "calibration": [],
        "ready": [],
        "relevant": [],
        "recentFailures": [],
        "rules": [
            {"id": f"rule-{n}", "action": "warn", "mode": "enforce", "description": "A rule " * 20}
            for n in range(30)
        ],
    }


def test_a_brief_never_exceeds_its_budget() -> None:
    count = token_counter()
    for render in (markdown, encoded):
        for agent, task in (
            ("agent-1", "\x01" * 280),  # JSON escapes each: many tokens a character
            ("a." * 64, "Pick a broker " * 20),
            ("\x01" * 128, None),
        ):
            text, tokens = fit(empty(agent, task), render, 200)
            assert tokens == count(text) <= 200, (render.__name__, agent[:10], tokens)
    text, _ = fit(empty("alice", "Pick a broker"), markdown, 200)
    assert "left out to fit the token budget" in text and "Task: Pick a broker" in text
