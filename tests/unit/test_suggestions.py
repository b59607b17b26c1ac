"""announceIntent's suggestions, as the seed's generator describes (SPEC.md)."""

from __future__ import annotations

from app.intents import suggestions
from app.intents.schemas import SimilarDecision
from app.wire import Outcome


def similar_to(title: str, outcome: Outcome | None = None) -> SimilarDecision:
    return SimilarDecision(
        id="d1",
        title=title,
        category="architecture",
        confidence=0.8,
        status="pending" if outcome is None else "reviewed",
        date="2026-01-05T10:00:00Z",
        outcome=outcome,
    )


def test_the_three_nearest_decisions_outcomes_then_the_warnings_suggestions() -> None:
    similar = [
        similar_to("Shard the queue", "success"),
        similar_to("Drop the index", "failure"),
        similar_to("Pending one"),  # not reviewed: nothing to say
        similar_to("Move to Redis", "partial"),  # fourth nearest
    ]
    out = suggestions.generate(similar, ["Roll out in stages", None])
    assert out == [
        "Similar action succeeded: Shard the queue",
        "Warning: Similar action failed: Drop the index",
        "Roll out in stages",
    ]


def test_decisions_of_one_title_and_outcome_give_one_suggestion() -> None:
    similar = [
        similar_to("Migrate the cache to Redis", "success"),
        similar_to("Migrate the cache to Redis", "success"),
        similar_to("Migrate the cache to Redis", "partial"),
    ]
    out = suggestions.generate(similar, ["Roll out in stages", "Roll out in stages"])
    assert out == [
        "Similar action succeeded: Migrate the cache to Redis",
        "Similar action had issues: Migrate the cache to Redis",
        "Roll out in stages",
    ]


def test_at_most_five() -> None:
    similar = [similar_to(f"T{n}", "success") for n in range(6)]
    out = suggestions.generate(similar, [f"advice {n}" for n in range(4)])
    assert out == [
        "Similar action succeeded: T0",
        "Similar action succeeded: T1",
        "Similar action succeeded: T2",
        "advice 0",
        "advice 1",
    ]
