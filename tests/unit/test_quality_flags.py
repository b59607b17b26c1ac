"""The not_a_decision check (app/decisions/quality.py): clear cases both ways, what reasons,
context and length do, determinism, and its precision on the hand-written labelled sets, so a
change to the rules that starts flagging real decisions fails here. Recall has a floor too: a
check that flags nothing has a perfect precision."""

from __future__ import annotations

import pytest

from app.decisions.quality import MAX_CONTEXT_CHARS, MAX_TEXT_CHARS, NOT_A_DECISION, flags
from bench.quality_flags import DEFAULT_SET, HELD_OUT, load, main, score

STATUS_UPDATES = [
    "Done",
    "Done.",
    "Sent the email",
    "Fixed typo",
    "Deployed v1.2 to staging",
    "Merged PR #42",
    "Ok, thanks",
    "Tests pass",
    "Working on it",
    "Blocked on the staging credentials",
    "Restarted the scheduler after the OOM kill",
    "I have updated the changelog",
    "Fix typo in the install guide",
    "Need to decide between Kafka and NATS",
]

DECISIONS = [
    "Use PostgreSQL instead of SQLite for the multi-tenant deployment",
    "Chose Redis over Memcached for the session cache",
    "We will not support MySQL",
    "Adopt ruff for linting",
    "Pin numpy below 2.0 until chromadb supports it",
    "Deploy on Tuesdays and Thursdays only",
    "Store timestamps in UTC and convert at the edge",
    "Fixed the flaky test by injecting a fake clock",
    "Merged the PR without the second review because the fix is a one-liner",
    "Unsure between Kafka and NATS at first, went with NATS",
    "Postgres.",
]


@pytest.mark.parametrize("text", STATUS_UPDATES)
def test_a_status_update_is_flagged(text: str) -> None:
    assert flags(text) == [NOT_A_DECISION]


@pytest.mark.parametrize("text", DECISIONS)
def test_a_decision_is_not_flagged(text: str) -> None:
    assert flags(text) == []


def test_reasons_make_a_flag_less_likely_but_do_not_launder_a_bare_ack() -> None:
    longer = "Finished the export of the audit rows for the quarterly report"
    assert flags(longer) == [NOT_A_DECISION]
    assert flags(longer, reasons=1) == []
    assert flags("Done", reasons=2) == [NOT_A_DECISION]


def test_a_context_that_names_alternatives_makes_a_terse_answer_a_decision() -> None:
    assert flags("Done") == [NOT_A_DECISION]
    assert flags("Done", context="Option A: patch the importer; option B: rewrite it") == []
    assert flags("Done", context="The nightly export job") == [NOT_A_DECISION]
    # A context too long to read is taken as deliberation.
    assert flags("Done", context="x " * MAX_CONTEXT_CHARS) == []


def test_a_long_text_is_never_flagged() -> None:
    text = "Done. " * (MAX_TEXT_CHARS // 6 + 1)
    assert len(text) > MAX_TEXT_CHARS
    assert flags(text) == []
    assert flags("Sent the email. " * 2000) == []  # the longest text the API accepts, unread


@pytest.mark.parametrize("text", ["", "   ", ".", "!?", "\n\t"])
def test_blank_or_punctuation_only_is_not_flagged(text: str) -> None:
    assert flags(text) == []


def test_curly_apostrophes_and_case_do_not_matter() -> None:
    assert flags("We’ll use Kafka") == flags("we'll use kafka") == []
    assert flags("SENT THE EMAIL") == [NOT_A_DECISION]


def test_the_answer_is_deterministic_and_a_fresh_list() -> None:
    examples = load(DEFAULT_SET)
    first = [flags(e.text, reasons=e.reasons, context=e.context) for e in examples]
    first[0].append("tampered")
    again = [flags(e.text, reasons=e.reasons, context=e.context) for e in examples]
    assert again[0] != first[0]
    assert again[1:] == first[1:]
    assert {f for result in again for f in result} == {NOT_A_DECISION}


def test_the_labelled_sets_are_big_balanced_and_unique() -> None:
    for path, at_least in ((DEFAULT_SET, 200), (HELD_OUT, 100)):
        examples = load(path)
        assert len(examples) >= at_least
        decisions = sum(e.decision for e in examples)
        assert 0.4 <= decisions / len(examples) <= 0.6
        keys = [(e.text, e.reasons, e.context) for e in examples]
        assert len(keys) == len(set(keys))


@pytest.mark.parametrize("path", [DEFAULT_SET, HELD_OUT], ids=["labelled", "heldout"])
def test_precision_on_the_labelled_sets(path) -> None:
    result = score(load(path))
    assert result.precision >= 0.9, [e.text for e in result.false_positives]
    assert result.recall >= 0.75, [e.text for e in result.false_negatives]


def test_the_bench_prints_precision_recall_and_the_misses(capsys) -> None:
    assert main(["--set", str(DEFAULT_SET)]) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "recall" in out
    assert "false positives" in out and "false negatives" in out
