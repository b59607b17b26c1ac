"""The hybrid merge (app/search/fusion.py) and how a query becomes keyword phrases
(app/search/keyword.py), without a database."""

from __future__ import annotations

import math

import pytest

from app.search import fusion, keyword


def test_a_decision_both_sides_found_gets_similarity_plus_the_keyword_bonus() -> None:
    merged = fusion.fuse([("a", 0.2), ("b", 0.3)], [("b", 1.0), ("c", 0.5)], words=4)
    by_id = {m.id: m for m in merged}
    weight = fusion.KEYWORD_WEIGHT / 2  # 1.5 / sqrt(4)
    assert by_id["a"].score == pytest.approx(0.8)
    assert by_id["b"].score == pytest.approx(0.7 + weight * 1.0)
    # only the keyword side found c: the vector list's largest distance stands in for it
    assert by_id["c"].score == pytest.approx(0.7 + weight * 0.25)
    assert by_id["c"].distance is None and by_id["a"].keyword is None
    assert [m.id for m in merged] == ["b", "c", "a"]


def test_the_bonus_weighs_more_the_shorter_the_query() -> None:
    assert fusion.keyword_weight(1) == fusion.KEYWORD_WEIGHT
    assert fusion.keyword_weight(0) == fusion.KEYWORD_WEIGHT
    assert fusion.keyword_weight(25) == pytest.approx(fusion.KEYWORD_WEIGHT / 5)
    # one word: the decision holding it beats a nearer one without it
    short = fusion.fuse([("near", 0.3), ("holder", 0.7)], [("holder", 1.0)], words=1)
    assert short[0].id == "holder"
    # a sentence of 25 words: a share of 0.4 of its weight does not outrank meaning
    long = fusion.fuse([("near", 0.3), ("holder", 0.5)], [("holder", 0.4)], words=25)
    assert long[0].id == "near"


def test_ties_are_broken_by_id_and_nothing_is_listed_twice() -> None:
    merged = fusion.fuse([("b", 0.5), ("a", 0.5)], [("a", 0.0), ("b", 0.0)], words=2)
    assert [m.id for m in merged] == ["a", "b"]
    assert fusion.fuse([], [], words=3) == []
    only_words = fusion.fuse([], [("x", 0.5)], words=1)
    assert only_words[0].score == pytest.approx(fusion.KEYWORD_WEIGHT * 0.25)
    assert math.isfinite(only_words[0].score)


def test_query_words_are_split_at_whitespace_folded_and_deduplicated() -> None:
    assert keyword.terms("OPS-1432  ops-1432 — E1042\n billing/invoice_worker.py") == [
        "ops-1432",
        "e1042",
        "billing/invoice_worker.py",
    ]
    assert keyword.terms("— ... !!") == []
    many = " ".join(f"w{n}" for n in range(100))
    assert len(keyword.terms(many)) == keyword.MAX_TERMS


@pytest.mark.parametrize(
    ("word", "phrase"),
    [
        ("E1042", '"E1042"'),
        ('say"hi', '"say""hi"'),
        ('"', '""""'),
        ("a OR b", '"a OR b"'),
        ("NEAR(x", '"NEAR(x"'),
    ],
)
def test_a_word_is_one_fts5_string(word: str, phrase: str) -> None:
    assert keyword.fts5_phrase(word) == phrase


def test_a_phrase_weighs_more_the_rarer_it_is_in_the_workspace() -> None:
    assert keyword.bm25_idf(1000, 1) > keyword.bm25_idf(1000, 100) > 0
    assert keyword.bm25_idf(10, 10) > 0  # a word every decision holds still counts a little
