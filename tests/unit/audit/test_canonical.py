"""The canonical form of audited rows, entry hashes and checkpoints (no database)."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.audit import canonical
from app.audit.chain import GENESIS, entry_hash, link
from app.audit.checkpoints import Checkpoint, checkpoint_mac, read_checkpoint
from app.db.decisions import Decision, DecisionReason, DecisionSupersede, DecisionTag

REVIEW: dict[str, Any] = {
    "id": 7,
    "decision_id": "1a2b3c4d",
    "outcome": "partial",
    "actual_result": None,
    "lessons": "Cache invalidation was the hard part",
    "notes": None,
    "affected_kpis": {"latency": "+40%"},
    "reviewed_by": "alice",
    "reviewed_at": datetime(2026, 12, 2, 9, 30, tzinfo=UTC),
}


EVALUATION_COLUMNS = canonical.EVALUATIONS.table.c


def test_the_documented_example() -> None:
    """docs/AUDIT.md shows this form and digest: the format must not drift."""
    form = canonical.document(canonical.REVIEWS, REVIEW)
    assert canonical.encode(form) == (
        b'{"actual_result":null,"affected_kpis":{"latency":"+40%"},"decision_id":"1a2b3c4d",'
        b'"id":7,"lessons":"Cache invalidation was the hard part","notes":null,'
        b'"outcome":"partial","reviewed_at":"2026-12-02T09:30:00.000000Z","reviewed_by":"alice"}'
    )
    assert canonical.digest_of(form) == (
        "0f00689809bee6e260a76c64508bf236eb07ac515df9ed6763f0da77838c2446"
    )
    assert canonical.covered("decision_reviews", REVIEW).row_id == "7"


def test_values_are_brought_to_their_column_type() -> None:
    """What either database gives back encodes like what was inserted."""
    inserted = {
        **REVIEW,
        "reviewed_at": datetime(2026, 12, 2, 11, 30, tzinfo=timezone(timedelta(hours=2))),
    }
    read_back = {**REVIEW, "id": "7", "reviewed_at": datetime(2026, 12, 2, 9, 30)}  # naive UTC
    assert canonical.document(canonical.REVIEWS, inserted) == canonical.document(
        canonical.REVIEWS, read_back
    )
    evaluation = dict.fromkeys(canonical.EVALUATIONS.columns)
    one = canonical.document(canonical.EVALUATIONS, {**evaluation, "confidence": 1, "allowed": 1})
    other = canonical.document(
        canonical.EVALUATIONS, {**evaluation, "confidence": 1.0, "allowed": True}
    )
    assert one == other and one["allowed"] is True
    assert canonical.encode(one["confidence"]) == b"1.0"
    assert canonical.encode(canonical.value_of(-0.0, EVALUATION_COLUMNS.confidence.type)) == b"0.0"
    facts = canonical.value_of(
        {"n": 1, "x": 1.5, "z": -0.0, "deep": [float("nan"), float("-inf"), (1, 2)]},
        EVALUATION_COLUMNS.facts.type,
    )
    assert canonical.encode(facts) == b'{"deep":["NaN","-Infinity",[1,2]],"n":1,"x":1.5,"z":0.0}'


def test_timestamps_always_have_six_fractional_digits() -> None:
    assert canonical.iso_utc(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == (
        "2026-01-02T03:04:05.000000Z"
    )
    assert canonical.iso_utc(datetime(5, 1, 2, 3, 4, 5, 7, tzinfo=UTC)) == (
        "0005-01-02T03:04:05.000007Z"
    )


def test_child_rows_are_ordered_by_their_natural_key_whatever_the_input_order() -> None:
    intent = dict.fromkeys(canonical.INTENTS.columns) | {"id": "i1"}
    matches = [
        {"id": 9, "intent_id": "i1", "decision_id": "bbbbbbbb", "rank": 2, "distance": 0.5},
        {"id": 3, "intent_id": "i1", "decision_id": "aaaaaaaa", "rank": 1, "distance": 0.25},
    ]
    forward = canonical.document(canonical.INTENTS, intent, {"intent_matches": matches})
    backward = canonical.document(canonical.INTENTS, intent, {"intent_matches": matches[::-1]})
    assert forward == backward
    assert json.loads(canonical.encode(forward))["intent_matches"] == [  # no own id or parent
        {"decision_id": "aaaaaaaa", "rank": 1, "distance": 0.25, "outcome": None},
        {"decision_id": "bbbbbbbb", "rank": 2, "distance": 0.5, "outcome": None},
    ]
    without = canonical.document(canonical.INTENTS, intent)
    assert without["intent_matches"] == []


def test_an_orm_decision_digests_like_its_rows() -> None:
    """The writer appends ORM objects; verification reads plain rows back."""
    created = datetime(2026, 12, 2, 9, 30, 1, 250, tzinfo=UTC)
    decision = Decision(
        id="1a2b3c4d",
        summary="Use a queue",
        decision="Use a queue",
        category="architecture",
        confidence=1,
        stakes="high",
        status="reviewed",
        outcome="success",  # a review column: not covered
        created_at=created,
        recorded_by="alice",
        kpi_indicators=["latency"],
        reasons=[DecisionReason(position=0, type="analysis", text="fast", strength=0.9)],
        tags=[DecisionTag(tag="queue", position=0), DecisionTag(tag="infra", position=1)],
    )
    values = dict.fromkeys(canonical.DECISIONS.columns) | {
        "id": "1a2b3c4d",
        "summary": "Use a queue",
        "decision": "Use a queue",
        "category": "architecture",
        "confidence": 1.0,
        "stakes": "high",
        "created_at": created,
        "recorded_by": "alice",
        "kpi_indicators": ["latency"],
    }
    rows = {
        "decision_reasons": [
            {
                "decision_id": "1a2b3c4d",
                "position": 0,
                "type": "analysis",
                "text": "fast",
                "strength": 0.9,
            }
        ],
        "decision_tags": [
            {"decision_id": "1a2b3c4d", "tag": "infra", "position": 1},
            {"decision_id": "1a2b3c4d", "tag": "queue", "position": 0},
        ],
    }
    assert canonical.covered_object(decision) == canonical.covered("decisions", values, rows)
    assert "outcome" not in canonical.document(canonical.DECISIONS, values, rows)


def test_supersede_links_are_a_member_only_when_a_decision_has_some() -> None:
    """Format 6 added the child table ``decision_supersedes``: a decision without links (every
    one stored before) keeps its form and digest; one with links has them, by position."""
    created = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
    values = dict.fromkeys(canonical.DECISIONS.columns) | {
        "id": "2b3c4d5e",
        "summary": "Use a queue",
        "decision": "Use a queue",
        "category": "architecture",
        "confidence": 0.5,
        "stakes": "medium",
        "created_at": created,
        "recorded_by": "alice",
    }
    plain = canonical.document(canonical.DECISIONS, values)
    assert "decision_supersedes" not in plain
    assert plain == canonical.document(canonical.DECISIONS, values, {"decision_supersedes": []})
    # the digest of a decision without links, as format 5 computed it (main at 5829ab0)
    assert canonical.digest_of(plain) == (
        "f0e7ec3686505a8f45ade68efc2711b5f3348e8cecf22f6ce1779a2edf3c3f68"
    )
    links = [
        {"decision_id": "2b3c4d5e", "superseded_id": "ffff0000", "position": 1},
        {"decision_id": "2b3c4d5e", "superseded_id": "aaaa0000", "position": 0},
    ]
    linked = canonical.document(canonical.DECISIONS, values, {"decision_supersedes": links})
    assert json.loads(canonical.encode(linked))["decision_supersedes"] == [
        {"position": 0, "superseded_id": "aaaa0000"},
        {"position": 1, "superseded_id": "ffff0000"},
    ]
    decision = Decision(
        **{k: v for k, v in values.items() if v is not None},
        reasons=[],
        tags=[],
        supersedes=[
            DecisionSupersede(superseded_id="aaaa0000", position=0),
            DecisionSupersede(superseded_id="ffff0000", position=1),
        ],
    )
    assert canonical.covered_object(decision) == canonical.covered(
        "decisions", values, {"decision_supersedes": links}
    )
    unset = Decision(**{k: v for k, v in values.items() if v is not None}, reasons=[], tags=[])
    assert canonical.covered_object(unset).digest == canonical.digest_of(plain)


def test_entries_link_and_a_key_changes_every_hash() -> None:
    entries = [canonical.Covered("decision_reviews", str(n), "d" * 64) for n in range(3)]
    plain = link((0, GENESIS), entries, None)
    keyed = link((0, GENESIS), entries, b"k" * 32)
    assert [r["seq"] for r in plain] == [1, 2, 3]
    assert plain[0]["prev_hash"] == GENESIS
    assert [r["prev_hash"] for r in plain[1:]] == [r["hash"] for r in plain[:-1]]
    message = (
        b'{"digest":"'
        + b"d" * 64
        + b'","prev":"'
        + GENESIS.encode()
        + (b'","row_id":"0","seq":1,"table":"decision_reviews"}')
    )
    assert plain[0]["hash"] == hashlib.sha256(message).hexdigest()
    assert all(p["hash"] != k["hash"] for p, k in zip(plain, keyed, strict=True))
    assert not plain[0]["keyed"] and keyed[0]["keyed"]
    assert keyed[0]["hash"] == entry_hash(b"k" * 32, 1, "decision_reviews", "0", "d" * 64, GENESIS)
    after = link((41, "a" * 64), entries[:1], None)
    assert after[0]["seq"] == 42 and after[0]["prev_hash"] == "a" * 64


def test_a_checkpoint_round_trips_and_an_edit_breaks_its_mac() -> None:
    key = b"k" * 32
    draft = Checkpoint(12, "ab" * 32, "2026-12-02T06:00:00.000000Z", True, "")
    point = Checkpoint(12, "ab" * 32, draft.time, True, checkpoint_mac(key, draft.signed()))
    again = read_checkpoint(point.as_json(), "cp.json")
    assert checkpoint_mac(key, again.signed()) == again.mac
    edited = read_checkpoint(point.as_json().replace('"seq": 12', '"seq": 13'), "cp.json")
    assert checkpoint_mac(key, edited.signed()) != edited.mac
    with pytest.raises(ValueError, match=r"cp\.json: not a checkpoint"):
        read_checkpoint('{"seq": 1}', "cp.json")


def test_values_of_another_type_than_their_column_are_converted() -> None:
    """Only a value of its column's exact type is kept as it is: True in an integer column
    is 1, a str subclass is its str(), a number in a text column its decimal text."""

    class Label(str):
        def __str__(self) -> str:
            return "label"

    row = dict.fromkeys(canonical.EVALUATIONS.columns) | {
        "id": "e1",
        "violations": True,
        "warnings": "2",
        "agent": Label("ignored"),
        "source": 7,
        "allowed": 0,
    }
    form = canonical.document(canonical.EVALUATIONS, row)
    assert (form["violations"], form["warnings"], form["agent"], form["source"]) == (
        1,
        2,
        "label",
        "7",
    )
    assert form["allowed"] is False
    # inside a JSON value, a str subclass is its text, as json.dumps writes it
    facts = canonical.value_of({"k": Label("text")}, EVALUATION_COLUMNS.facts.type)
    assert canonical.encode(facts) == b'{"k":"text"}'


def test_child_rows_with_the_same_natural_key_are_ordered_by_their_encoding() -> None:
    evaluation = dict.fromkeys(canonical.EVALUATIONS.columns) | {"id": "e1"}
    results = [
        {"guardrail_id": "g", "severity": "warn", "message": "b"},
        {"guardrail_id": "a", "severity": "block", "message": None},
        {"guardrail_id": "g", "severity": "block", "message": "a"},
    ]
    for rows in (results, results[::-1]):
        form = canonical.document(
            canonical.EVALUATIONS, evaluation, {"guardrail_rule_results": rows}
        )
        assert [(r["guardrail_id"], r["severity"]) for r in form["guardrail_rule_results"]] == [
            ("a", "block"),
            ("g", "block"),
            ("g", "warn"),
        ]


# ---- the encoding is json.dumps's, byte for byte ----------------------------------------------

# JSON values as a request or a database gives them: floats of every magnitude (where the
# notations of json and msgspec differ: 1e-05, 1e+16), non-finite and negative zero; integers
# beyond 64 bits; text with escapes, controls, non-ASCII and astral characters.
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_FLOAT = st.floats() | st.sampled_from([1e-05, 1.5e-07, 1e16, 1e22, 1.2345678901234568e17, -0.0])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | _FLOAT | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _as_json_dumps_sees_it(value: object) -> object:
    """The documented canonical value, with floats as floats (for ``json.dumps``)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value + 0.0
    if isinstance(value, dict):
        return {k: _as_json_dumps_sees_it(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json_dumps_sees_it(v) for v in value]
    return value


def _dumps(value: object) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def _no_bare_float(value: object) -> bool:
    """msgspec would write a float in its own notation: every one must arrive as its text."""
    if isinstance(value, float):
        return False
    if isinstance(value, dict):
        return all(_no_bare_float(v) for v in value.values())
    if isinstance(value, list):
        return all(_no_bare_float(v) for v in value)
    return True


@given(facts=_JSON, confidence=_FLOAT | st.none(), description=_TEXT)
def test_an_evaluation_encodes_as_json_dumps_would(
    facts: object, confidence: float | None, description: str
) -> None:
    """The format is defined as json.dumps's output (module docstring); msgspec writes it."""
    row = dict.fromkeys(canonical.EVALUATIONS.columns) | {
        "id": "e1",
        "facts": facts,
        "confidence": confidence,
        "description": description,
    }
    form = canonical.document(canonical.EVALUATIONS, row)
    expected = {
        **dict.fromkeys(canonical.EVALUATIONS.columns),
        "id": "e1",
        "facts": _as_json_dumps_sees_it(facts),
        "confidence": _as_json_dumps_sees_it(confidence),
        "description": description,
        "guardrail_rule_results": [],
    }
    assert _no_bare_float(form)
    assert canonical.encode(form) == _dumps(expected)


@given(
    metadata=_JSON,
    intent=_TEXT,
    distances=st.lists(_FLOAT, max_size=6),
    outcome=st.none() | _TEXT,
)
def test_an_intent_with_its_matches_encodes_as_json_dumps_would(
    metadata: object, intent: str, distances: list[float], outcome: str | None
) -> None:
    row = dict.fromkeys(canonical.INTENTS.columns) | {
        "id": "i1",
        "metadata": metadata,
        "intent": intent,
        "confidence": distances[0] if distances else None,
    }
    matches = [
        {"intent_id": "i1", "decision_id": f"d{n}", "rank": n, "distance": d, "outcome": outcome}
        for n, d in enumerate(distances, start=1)
    ]
    form = canonical.document(canonical.INTENTS, row, {"intent_matches": matches[::-1]})
    expected = {
        **dict.fromkeys(canonical.INTENTS.columns),
        "id": "i1",
        "metadata": _as_json_dumps_sees_it(metadata),
        "intent": intent,
        "confidence": _as_json_dumps_sees_it(row["confidence"]),
        "intent_matches": [
            {k: _as_json_dumps_sees_it(v) for k, v in m.items() if k != "intent_id"}
            for m in matches
        ],
    }
    assert _no_bare_float(form)
    assert canonical.encode(form) == _dumps(expected)
