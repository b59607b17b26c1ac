"""A filtered search whose first probe holds too few matches looks further, in order: the
nearest many more decisions unfiltered, then (few matches in SQL) those matches ranked exactly
from their stored vectors, and only then the index's own filtered query, whose cost grows with
the collection. Whatever the path, the results are the exact filtered nearest.

The probe's widths are the module's constants, made small here so that a few dozen decisions
take each path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import app.search.semantic as search
from support.app import Rpc

QUERY = "roll out the login service"
NEAR = [f"Deploy the auth service to production, wave {i}" for i in range(40)]
FAR = [f"Bake sourdough bread number {i} for the team party" for i in range(5)]


async def record_all(rpc: Rpc) -> dict[str, str]:
    """Records the corpus; returns each far decision's id -> text."""
    batch = [
        {
            "jsonrpc": "2.0",
            "id": n,
            "method": "cstp.recordDecision",
            "params": {"decision": text, "confidence": 0.7, "category": "architecture"},
        }
        for n, text in enumerate(NEAR)
    ]
    answers = (await rpc.raw(batch)).json()
    assert all("result" in a for a in answers), answers
    far = {}
    for text in FAR:
        answer = await rpc.ok(
            "cstp.recordDecision", {"decision": text, "confidence": 0.4, "category": "security"}
        )
        far[answer["id"]] = text
    return far


@pytest.fixture(scope="module")
async def corpus(
    shared_rpc: Rpc, shared_services: Any
) -> AsyncIterator[tuple[Rpc, Any, dict[str, str]]]:
    """The module's one app with the corpus recorded once: the tests only search it (each
    with its own widths and spy, undone after it)."""
    yield shared_rpc, shared_services, await record_all(shared_rpc)


class Spy:
    """Counts the index's filtered queries and reads of stored vectors (then lets them run)."""

    def __init__(self, index: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.where_queries = 0
        self.vector_reads = 0
        query_vector, distances = index.query_vector, index.distances

        async def spy_query(*args: Any, **kwargs: Any) -> Any:
            self.where_queries += kwargs.get("where") is not None
            return await query_vector(*args, **kwargs)

        async def spy_distances(*args: Any, **kwargs: Any) -> Any:
            self.vector_reads += 1
            return await distances(*args, **kwargs)

        monkeypatch.setattr(index, "query_vector", spy_query)
        monkeypatch.setattr(index, "distances", spy_distances)


async def exact_nearest(services: Any, ids: list[str]) -> list[str]:
    vector = await services.index.embed_query(QUERY)
    known = await services.index.distances(vector, ids, workspace="default")
    return [i for i, _ in sorted(known.items(), key=lambda item: (item[1], item[0]))]


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
@pytest.mark.parametrize(
    ("widen", "exact_at_most", "path"),
    [
        (100, 200, "wider"),  # the wider look sees the whole collection
        (2, 10, "exact"),  # 5 matches: ranked from their stored vectors
        (2, 3, "index"),  # 5 matches, more than 3: the index's filtered query
    ],
)
async def test_a_filtered_search_finds_the_exact_nearest_matches_by_each_path(
    corpus: tuple[Rpc, Any, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    widen: int,
    exact_at_most: int,
    path: str,
) -> None:
    rpc, services, far = corpus
    expected = await exact_nearest(services, list(far))
    monkeypatch.setattr(search, "PROBE", 1)
    monkeypatch.setattr(search, "WIDEN", widen)
    monkeypatch.setattr(search, "EXACT_AT_MOST", exact_at_most)
    spy = Spy(services.index, monkeypatch)
    # limit 3 + overfetch 10: the probe sees 13 of 45 decisions, all of them near ones
    answer = await rpc.ok(
        "cstp.queryDecisions",
        {"query": QUERY, "limit": 3, "retrievalMode": mode, "filters": {"category": "security"}},
    )
    found = [d["id"] for d in answer["decisions"]]
    if mode == "semantic":
        assert found == expected[:3]
    else:  # no word of the query is in them: the keyword side adds nothing, order may tie
        assert set(found) == set(expected[:3])
    assert all(d["category"] == "security" for d in answer["decisions"])
    assert (spy.where_queries, spy.vector_reads) == {
        "wider": (0, 0),
        "exact": (0, 1),
        "index": (1, 0),
    }[path]


async def test_a_filter_nobody_matches_answers_nothing_without_the_filtered_query(
    corpus: tuple[Rpc, Any, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rpc, services, _far = corpus
    monkeypatch.setattr(search, "PROBE", 1)
    monkeypatch.setattr(search, "WIDEN", 2)
    spy = Spy(services.index, monkeypatch)
    for mode in ("semantic", "hybrid"):
        answer = await rpc.ok(
            "cstp.queryDecisions",
            {"query": QUERY, "retrievalMode": mode, "filters": {"category": "process"}},
        )
        assert answer["decisions"] == []
    assert spy.where_queries == 0
