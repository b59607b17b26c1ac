"""The retrieval-quality corpus generator (bench/quality_corpus.py), without a server: it is
deterministic for a seed, big enough, and every label holds by construction."""

from __future__ import annotations

import re

import pytest

from bench.quality_corpus import KINDS, LATE, SPLITS, THEMES, Corpus, generate


@pytest.fixture(scope="module")
def small() -> Corpus:
    return generate(seed=7, n_decisions=300, n_queries=60)


@pytest.fixture(scope="module")
def default() -> Corpus:
    return generate(seed=42, n_decisions=2000, n_queries=320)


def _text(d) -> str:
    p = d.params
    return "\n".join([p["decision"], p.get("context", ""), *(r["text"] for r in p["reasons"])])


def _grams(text: str) -> set[tuple[str, ...]]:
    w = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(w[i : i + 4]) for i in range(len(w) - 3)}


def _satisfies(d, filters: dict) -> bool:
    """An independent reading of the queryDecisions filters the corpus uses."""
    p = d.params
    checks = {
        "category": lambda v: p["category"] == v,
        "project": lambda v: p["project"] == v,
        "stakes": lambda v: p["stakes"] in ([v] if isinstance(v, str) else v),
        "tags": lambda v: all(t in p["tags"] for t in v),
        "status": lambda v: (d.review is not None) == (v == "reviewed"),
        "dateAfter": lambda v: v == LATE and d.phase == "late",
    }
    return all(checks[name](value) for name, value in filters.items())


def test_same_seed_same_corpus_other_seed_other_corpus(small: Corpus) -> None:
    again = generate(seed=7, n_decisions=300, n_queries=60)
    assert [d.as_json() for d in again.decisions] == [d.as_json() for d in small.decisions]
    assert [q.as_json() for q in again.queries] == [q.as_json() for q in small.queries]
    assert again.fingerprint() == small.fingerprint()
    assert generate(seed=8, n_decisions=300, n_queries=60).fingerprint() != small.fingerprint()


@pytest.mark.parametrize("name,n_decisions,n_queries", [("small", 300, 60), ("default", 2000, 320)])
def test_counts_kinds_and_splits(
    name: str, n_decisions: int, n_queries: int, request: pytest.FixtureRequest
) -> None:
    corpus: Corpus = request.getfixturevalue(name)
    assert len(corpus.decisions) >= n_decisions
    assert len(corpus.queries) >= n_queries
    assert len({d.key for d in corpus.decisions}) == len(corpus.decisions)
    assert len({q.id for q in corpus.queries}) == len(corpus.queries)
    for kind in KINDS:
        for split in SPLITS:
            assert any(q.kind == kind and q.split == split for q in corpus.queries), (kind, split)
    categories = {d.params["category"] for d in corpus.decisions}
    assert categories == {"architecture", "process", "integration", "tooling", "security"}
    assert {d.phase for d in corpus.decisions} == {"early", "late"}
    assert any(d.review for d in corpus.decisions) and any(d.tokens for d in corpus.decisions)
    texts = {_text(d) for d in corpus.decisions}
    assert len(texts) > 0.95 * len(corpus.decisions)  # varied, not near-duplicates


@pytest.mark.parametrize("name", ["small", "default"])
def test_labels_hold(name: str, request: pytest.FixtureRequest) -> None:
    corpus: Corpus = request.getfixturevalue(name)
    by_key = corpus.by_key()
    texts = {d.key: _text(d) for d in corpus.decisions}
    lowered = {k: t.lower() for k, t in texts.items()}
    for q in corpus.queries:
        assert q.relevant, q
        assert all(k in by_key for k in q.relevant)
        assert q.text.strip()
        relevant = set(q.relevant)
        if q.kind == "paraphrase":
            (key,) = q.relevant
            target = by_key[key]
            assert not _grams(q.text) & _grams(texts[key]), (q.text, texts[key])
            same = [d for d in corpus.decisions if d.signature == target.signature]
            assert same == [target]
            assert q.category == target.params["category"]
        elif q.kind == "exact_token":
            assert q.token and q.token in q.text
            holders = {k for k, t in lowered.items() if q.token.lower() in t}
            assert holders == relevant, q.token
            assert len(relevant) <= 3
        elif q.kind == "short_keyword":
            assert 2 <= len(q.text.split()) <= 3
            theme = next(t for t in THEMES if t.key == q.family)
            about = {k for k, t in lowered.items() if theme.matches(t)}
            assert about == relevant
        else:
            assert q.kind == "filtered" and q.filters
            assert all(_satisfies(by_key[k], q.filters) for k in relevant), q
            if q.subkind == "keyword+filters":
                theme = next(t for t in THEMES if t.key == q.family)
                pool = {k for k, t in lowered.items() if theme.matches(t)}
            else:
                assert not any(_grams(q.text) & _grams(texts[k]) for k in relevant)
                signature = by_key[q.relevant[0]].signature
                pool = {d.key for d in corpus.decisions if d.signature == signature}
            assert relevant == {k for k in pool if _satisfies(by_key[k], q.filters)}


def test_each_decision_is_about_at_most_its_own_theme(small: Corpus) -> None:
    for d in small.decisions:
        about = {t.key for t in THEMES if t.matches(_text(d).lower())}
        assert about == ({d.family} if d.source == "theme" else set()), d.key
