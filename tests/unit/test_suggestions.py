"""announceIntent's suggestions, as the seed's generator describes (SPEC.md)."""

from __future__ import annotations

from app.intents import suggestions


def test_the_three_nearest_decisions_outcomes_then_the_warnings_suggestions() -> None:
    similar = [
        {"id": "a1", "title": "Shard the queue", "outcome": "success"},
        {"id": "a2", "title": "Drop the index", "outcome": "failure", "notes": "slow reads"},
        {"id": "a3", "title": "Pending one"},  # not reviewed: nothing to say
        {"id": "a4", "title": "Move to Redis", "outcome": "partial"},  # fourth nearest
    ]
    out = suggestions.generate(similar, ["Roll out in stages", None])
    assert out == [
        "Similar action succeeded: Shard the queue",
        "Warning: Similar action failed: Drop the index",
        "Roll out in stages",
    ]


def test_decisions_of_one_title_and_outcome_give_one_suggestion() -> None:
    similar = [
        {"id": "a1", "title": "Migrate the cache to Redis", "outcome": "success"},
        {"id": "a2", "title": "Migrate the cache to Redis", "outcome": "success"},
        {"id": "a3", "title": "Migrate the cache to Redis", "outcome": "partial"},
    ]
    out = suggestions.generate(similar, ["Roll out in stages", "Roll out in stages"])
    assert out == [
        "Similar action succeeded: Migrate the cache to Redis",
        "Similar action had issues: Migrate the cache to Redis",
        "Roll out in stages",
    ]


def test_at_most_five() -> None:
    similar = [{"id": f"d{n}", "title": f"T{n}", "outcome": "success"} for n in range(6)]
    out = suggestions.generate(similar, [f"advice {n}" for n in range(4)])
    assert out == [
        "Similar action succeeded: T0",
        "Similar action succeeded: T1",
        "Similar action succeeded: T2",
        "advice 0",
        "advice 1",
    ]
