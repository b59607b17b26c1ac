"""The result structs encode as the answers always have: a key that the protocol leaves out
when it has no value is absent (not null), the others are null, and keys come in the same
order. The handlers build these structs, so their options (omit_defaults, field order) are
what keeps the wire as it was."""

from __future__ import annotations

import msgspec

from app.calibration.schemas import AppliedFilters, GetCalibrationResult, Sums, figures
from app.decisions.schemas import DecisionOut
from app.guardrails.schemas import GuardrailHit, GuardrailOut, GuardrailStatus
from app.intents.schemas import AnnounceIntentResult, SimilarDecision
from app.search.schemas import FoundDecision
from app.wire import DecisionItem


def keys(struct: msgspec.Struct) -> list[str]:
    encoded: dict[str, object] = msgspec.json.decode(msgspec.json.encode(struct))
    return list(encoded)


ITEM = {
    "id": "0a1b2c3d",
    "title": "Use Postgres",
    "category": "architecture",
    "confidence": 0.8,
    "stakes": "high",
    "status": "pending",
    "date": "2026-01-05T10:00:00Z",
    "agent": "alice",
    "tags": [],
}


def test_a_list_item_leaves_out_what_it_does_not_have() -> None:
    assert keys(DecisionItem(**ITEM)) == list(ITEM)
    found = FoundDecision(**ITEM, score=0.5)
    assert keys(found) == [*ITEM, "score"]
    found = FoundDecision(**ITEM, outcome="success", distance=0.2, score=0.5, reasons=[])
    assert keys(found) == [*ITEM, "outcome", "distance", "score", "reasons"]
    # only a superseded decision (listed when includeSuperseded asks for it) says by what
    found = FoundDecision(**ITEM, superseded_by="1b2c3d4e", score=0.5)
    assert keys(found) == [*ITEM, "supersededBy", "score"]


def test_a_decision_shows_its_supersede_links_after_its_reviews() -> None:
    fields = list(DecisionOut.__struct_encode_fields__)
    assert fields[-3:] == ["reviews", "supersededBy", "supersedes"]


def test_a_guardrail_without_a_suggestion_has_no_suggestion_key() -> None:
    hit = GuardrailHit(guardrail_id="r", name="n", message="m", severity="warn")
    assert keys(hit) == ["guardrailId", "name", "message", "severity"]
    rule = GuardrailOut(
        id="r",
        description="d",
        action="warn",
        mode="enforce",
        scope=[],
        conditions=[],
        requirements=[],
    )
    assert "suggestion" not in keys(rule)


def test_an_announcement_says_degraded_only_when_it_was() -> None:
    similar = SimilarDecision(
        id="0a1b2c3d",
        title="t",
        category="architecture",
        confidence=0.8,
        status="pending",
        date="2026-01-05T10:00:00Z",
    )
    assert keys(similar) == ["id", "title", "category", "confidence", "status", "date"]
    status = GuardrailStatus(
        allowed=True, violations=[], warnings=[], evaluated=0, evaluation_id="e"
    )
    answer = AnnounceIntentResult(
        received=True,
        correlation_id="c",
        received_at="2026-01-05T10:00:00Z",
        similar_decisions=[similar],
        guardrail_status=status,
        suggestions=[],
        responding_agent="cognition-engines",
    )
    base = [
        "received",
        "correlationId",
        "receivedAt",
        "similarDecisions",
        "guardrailStatus",
        "suggestions",
        "respondingAgent",
    ]
    assert keys(answer) == base
    degraded = msgspec.structs.replace(answer, retrieval_mode="keyword", degraded=True)
    assert keys(degraded) == [*base, "retrievalMode", "degraded"]
    # a retry answers the stored encoding, decoded: the same JSON
    stored = msgspec.json.encode(degraded)
    again = msgspec.json.decode(stored, type=AnnounceIntentResult)
    assert msgspec.json.encode(again) == stored


def test_calibration_lists_groups_before_filters_and_min_decisions_last() -> None:
    head = figures(Sums(), 5)
    result = GetCalibrationResult(
        brier_score=None,
        accuracy=None,
        calibration_gap=None,
        interpretation="insufficient_data",
        overall=head,
        buckets=[],
        recommendations=[],
        filters=AppliedFilters(agent="alice", min_decisions=5),
        agent="alice",
        sources=[],
    )
    encoded = msgspec.json.decode(msgspec.json.encode(result))
    # ``sources`` (issue #40) after what earlier clients read, in the same order as before
    assert list(encoded)[-4:] == ["recommendations", "filters", "agent", "sources"]
    assert list(encoded["filters"]) == ["agent", "minDecisions"]
    assert encoded["brierScore"] is None  # null, not absent
    grouped = msgspec.structs.replace(result, group_by="category", groups=[])
    assert list(msgspec.json.decode(msgspec.json.encode(grouped)))[-6:] == [
        "recommendations",
        "groupBy",
        "groups",
        "filters",
        "agent",
        "sources",
    ]
