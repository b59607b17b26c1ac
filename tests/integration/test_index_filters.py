"""Search filters: Chroma (via ``to_where``) must return exactly what ``matches`` says, alone and
in every pair, on ~60 decisions in a real embedded Chroma with real embeddings."""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.records.filters import SearchFilters, matches, tag_metadata, to_where
from app.search.embedder import Embedder
from app.search.index import IndexEntry, VectorIndex, clean_metadata

START = datetime(2025, 1, 1, tzinfo=UTC)
CATEGORIES = ["architecture", "process", "integration", "tooling", "security"]
STAKES = ["low", "medium", "high", "critical"]
TAGS = ["db", "perf", "security", "api", "infra"]
OUTCOMES = ["success", "partial", "failure", "abandoned"]
EXACT_CONFIDENCES = [0.0, 1.0, 0.5, 0.75]


def build_metadata() -> dict[str, dict[str, Any]]:
    """60 decisions with every field varied; optional fields absent on some of them."""
    rng = random.Random(20250101)
    out: dict[str, dict[str, Any]] = {}
    for n in range(60):
        created = START + timedelta(days=n * 6, hours=rng.randrange(24), seconds=rng.random())
        reviewed = rng.random() < 0.5
        confidence = (
            EXACT_CONFIDENCES[n]
            if n < 4
            else float(rng.choice([0.0, 1.0, 0.5, 0.75, round(rng.random(), 3)]))
        )
        md: dict[str, Any] = {
            "title": f"Decision {n}",
            "date": created.isoformat(),
            "category": CATEGORIES[n % 5],
            "stakes": STAKES[rng.randrange(4)],
            "status": "reviewed" if reviewed else "pending",
            "confidence": confidence,
            "created_at": created.timestamp(),
            "agent": rng.choice(["agentA", "agentB", "agentC"]),
            "has_outcome": reviewed,
            "outcome": rng.choice(OUTCOMES) if reviewed else None,
            "project": rng.choice(["alpha", "beta", None]),
            "feature": rng.choice(["F001", "F002", None]),
            "pr": rng.choice([1, 2, 3, None]),
            # only a superseded decision has the key (left out by default, $ne in Chroma)
            "superseded": True if n % 7 == 3 else None,
        }
        md.update(tag_metadata(rng.sample(TAGS, rng.randrange(4))))
        out[f"{n:08x}"] = clean_metadata(md)
    return out


METADATA = build_metadata()
CREATED = sorted(md["created_at"] for md in METADATA.values())
# a boundary exactly on a stored timestamp checks inclusive/exclusive ends
AFTER = datetime.fromtimestamp(CREATED[20], UTC)
BEFORE = datetime.fromtimestamp(CREATED[40], UTC)

CANDIDATES: list[tuple[str, Any]] = [
    ("category", "architecture"),
    ("stakes", ("high", "critical")),
    ("stakes", ("low",)),
    ("status", ("reviewed",)),
    ("status", ("pending", "reviewed")),
    ("min_confidence", 0.75),
    ("min_confidence", 1.0),
    ("max_confidence", 0.0),
    ("max_confidence", 0.5),
    ("date_after", AFTER),
    ("date_before", BEFORE),
    ("agent", "agentB"),
    ("tags", ("db",)),
    ("tags", ("db", "perf")),
    ("project", "alpha"),
    ("feature", "F002"),
    ("pr", 3),
    ("has_outcome", True),
    ("has_outcome", False),
    ("include_superseded", True),
]


def expected(f: SearchFilters) -> set[str]:
    return {i for i, md in METADATA.items() if matches(f, md)}


@pytest.fixture(scope="module")
async def index(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[VectorIndex]:
    idx = VectorIndex.embedded(tmp_path_factory.mktemp("filters") / "chroma", embedder)
    await idx.upsert(
        [IndexEntry(i, f"{md['title']} about {md['category']}", md) for i, md in METADATA.items()]
    )
    assert await idx.count() == len(METADATA)
    yield idx
    await idx.aclose()


@pytest.fixture(scope="module")
async def vector(index: VectorIndex) -> list[float]:
    return await index.embed_query("a decision about the system")


async def found(index: VectorIndex, vector: list[float], f: SearchFilters) -> set[str]:
    hits = await index.query_vector(vector, where=to_where(f), limit=100, workspace="default")
    assert all(matches(f, h.metadata) for h in hits)
    return {h.id for h in hits}


@pytest.mark.parametrize(("name", "value"), CANDIDATES, ids=[f"{n}={v}" for n, v in CANDIDATES])
async def test_each_filter_alone(index: VectorIndex, name: str, value: Any) -> None:
    f = SearchFilters(workspace="default", **{name: value})
    want = expected(f)
    assert want, "choose a value that matches something"
    assert want != set(METADATA) or name in ("status", "include_superseded")
    hits = await index.query(
        "a decision about the system", where=to_where(f), limit=100, workspace="default"
    )
    assert {h.id for h in hits} == want


async def test_every_pair_of_filters(index: VectorIndex, vector: list[float]) -> None:
    non_empty = 0
    for (n1, v1), (n2, v2) in itertools.combinations(CANDIDATES, 2):
        if n1 == n2:
            continue
        f = SearchFilters(workspace="default", **{n1: v1, n2: v2})
        want = expected(f)
        non_empty += bool(want)
        assert await found(index, vector, f) == want, f
    assert non_empty > 100


async def test_random_combinations(index: VectorIndex, vector: list[float]) -> None:
    rng = random.Random(7)
    for _ in range(60):
        chosen = dict(rng.sample(CANDIDATES, rng.randrange(3, 7)))
        f = SearchFilters(workspace="default", **chosen)
        assert await found(index, vector, f) == expected(f), f


async def test_boundaries_are_inclusive_and_exclusive(
    index: VectorIndex, vector: list[float]
) -> None:
    at_20 = {i for i, md in METADATA.items() if md["created_at"] == CREATED[20]}
    window = SearchFilters(
        workspace="default", date_after=AFTER, date_before=BEFORE, include_superseded=True
    )
    got = await found(index, vector, window)
    assert at_20 <= got and len(got) == 20  # [20, 40): start included, end excluded
    exact = SearchFilters(workspace="default", min_confidence=0.75, max_confidence=0.75)
    assert await found(index, vector, exact) == expected(exact) != set()
    zero = SearchFilters(workspace="default", max_confidence=0.0)
    assert all(METADATA[i]["confidence"] == 0.0 for i in await found(index, vector, zero))
    naive = replace(
        window, date_after=AFTER.replace(tzinfo=None), date_before=BEFORE.replace(tzinfo=None)
    )
    assert await found(index, vector, naive) == got  # naive datetimes are UTC
    inverted = SearchFilters(workspace="default", min_confidence=0.9, max_confidence=0.1)
    assert await found(index, vector, inverted) == set()


def test_where_shapes() -> None:
    every = functools.partial(SearchFilters, workspace="default", include_superseded=True)
    assert to_where(every()) is None
    assert to_where(every(stakes=(), tags=())) is None
    assert (
        SearchFilters(workspace="default", status=()).is_empty()
        and not SearchFilters(workspace="default", pr=0).is_empty()
    )
    assert to_where(every(category="process")) == {"category": {"$eq": "process"}}
    assert to_where(every(stakes=("low", "high", "low"))) == {"stakes": {"$in": ["low", "high"]}}
    assert to_where(every(tags=("a", "b"))) == {
        "$and": [{"tags": {"$contains": "a"}}, {"tags": {"$contains": "b"}}]
    }
    where = to_where(every(min_confidence=0, has_outcome=False, pr=2))
    assert where == {
        "$and": [{"confidence": {"$gte": 0.0}}, {"pr": {"$eq": 2}}, {"has_outcome": {"$eq": False}}]
    }
    assert isinstance(where["$and"][0]["confidence"]["$gte"], float)
    # superseded decisions are left out unless asked for: a default, not a filter
    current = SearchFilters(workspace="default")
    assert current.is_empty() and to_where(current) == {"superseded": {"$ne": True}}
    assert to_where(SearchFilters(workspace="default", category="process")) == {
        "$and": [{"category": {"$eq": "process"}}, {"superseded": {"$ne": True}}]
    }
    assert matches(current, {}) and not matches(current, {"superseded": True})
    assert matches(every(), {"superseded": True})


def test_tag_metadata() -> None:
    assert tag_metadata([]) == {} and tag_metadata(None) == {}
    assert tag_metadata(["b", "a", "b", ""]) == {"tags": ["b", "a"]}


def test_matches_is_strict_about_missing_keys_and_types() -> None:
    md = {"confidence": 1.0, "has_outcome": False, "pr": 1, "tags": ["x"]}
    assert matches(SearchFilters(workspace="default"), {})
    assert not matches(SearchFilters(workspace="default", project="alpha"), md)
    assert not matches(SearchFilters(workspace="default", has_outcome=True), md)
    assert matches(
        SearchFilters(workspace="default", has_outcome=False, pr=1, max_confidence=1.0), md
    )
    assert not matches(SearchFilters(workspace="default", pr=1), {"pr": True})
    assert not matches(SearchFilters(workspace="default", min_confidence=0.0), {"confidence": None})
    assert not matches(SearchFilters(workspace="default", tags=("x", "y")), md)
    assert not matches(SearchFilters(workspace="default", date_after=START), {})
