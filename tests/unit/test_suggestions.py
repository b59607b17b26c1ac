"""announceIntent's suggestions, from the similar decisions and the guardrails' advice."""

from __future__ import annotations

from app.intents import suggestions


def test_decisions_of_one_title_and_outcome_give_one_suggestion() -> None:
    similar = [
        {"id": "a1", "title": "Migrate the cache to Redis", "outcome": "success"},
        {"id": "a2", "title": "Migrate the cache to Redis", "outcome": "success"},
        {"id": "a3", "title": "Migrate the cache to Redis", "outcome": "failure", "notes": "OOM"},
        {"id": "a4", "title": "Shard the queue", "outcome": "success"},
    ]
    out = suggestions.generate(similar, ["Roll out in stages", "Roll out in stages", None])
    assert out == [
        "Similar action succeeded: Migrate the cache to Redis",
        "Warning: Similar action failed: Migrate the cache to Redis (lesson: OOM)",
        "Roll out in stages",
    ]


def test_at_most_three_from_outcomes_and_five_in_all() -> None:
    similar = [{"id": f"d{n}", "title": f"T{n}", "outcome": "success"} for n in range(6)]
    advice = [f"advice {n}" for n in range(4)]
    out = suggestions.generate(similar, advice)
    assert out == [
        "Similar action succeeded: T0",
        "Similar action succeeded: T1",
        "Similar action succeeded: T2",
        "advice 0",
        "advice 1",
    ]
