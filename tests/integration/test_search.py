"""cstp.queryDecisions over the real RPC, the real embedder and a real (embedded) Chroma.

The filter tests record a corpus of 40 decisions (dates moved with an injected clock, two
agents, some reviewed), then check every filter of docs/PROTOCOL.md alone and every pair of filters:
the returned ids must be exactly the decisions that satisfy the filters, computed here from
what was recorded (semantics: app/records/filters.py docstring).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text as sql

from app.asgi import create_app
from app.config import Settings, parse_rate_limits
from app.runtime import Runtime, iso
from support.app import TOKENS, Rpc, add_token, serve_app
from support.databases import copy_database

QUERY = "a decision about our software systems"
START = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves; the app reads it for every timestamp it stores."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


# ---------------------------------------------------------------------------------------------
# The corpus: 40 decisions, drawn from a seeded generator (seed 1 is chosen so that every pair
# of the filters below matches at least one decision; a guard test checks it).
# ---------------------------------------------------------------------------------------------

CATEGORIES = ["architecture", "process", "integration", "tooling", "security"]
STAKES = ["low", "medium", "high", "critical"]
CONFIDENCES = [0.0, 1.0, 0.5, 0.75, 0.3, 0.9, 0.6, 0.85, 0.1, 0.45]
TAG_SETS: list[list[str]] = [
    [],
    ["infra"],
    ["db"],
    ["infra", "db"],
    ["infra", "db", "perf"],
    ["perf"],
    ["db", "perf"],
    ["perf", "infra"],
]
PROJECTS = [None, "payments", "search"]
FEATURES = [None, "checkout", "refunds"]
PRS = [None, 42, 7]
OUTCOMES = [None, None, "success", "failure", "partial"]
TOPICS = [
    "Adopt a message queue for order events",
    "Cache product pages at the edge",
    "Rotate database credentials monthly",
    "Move CI builds to ephemeral runners",
    "Split the monolith's billing module",
    "Require two approvals on main",
    "Introduce feature flags for releases",
    "Use structured logging everywhere",
    "Pin dependency versions in lock files",
    "Run nightly load tests",
]


@dataclass
class Recorded:
    """What the test recorded (and reviewed) for one decision: the reference for filters."""

    index: int
    id: str = ""
    category: str = ""
    stakes: str = ""
    confidence: float = 0.0
    agent: str = ""
    tags: list[str] = field(default_factory=list)
    project: str | None = None
    feature: str | None = None
    pr: int | None = None
    outcome: str | None = None
    created_at: datetime = START
    text: str = ""

    @property
    def status(self) -> str:
        return "reviewed" if self.outcome is not None else "pending"


def build_corpus() -> list[Recorded]:
    rng = random.Random(1)
    corpus = []
    for i in range(40):
        corpus.append(
            Recorded(
                index=i,
                category=rng.choice(CATEGORIES),
                stakes=rng.choice(STAKES),
                confidence=CONFIDENCES[i % len(CONFIDENCES)],
                agent=rng.choice(["alice", "bob"]),
                tags=list(rng.choice(TAG_SETS)),
                project=rng.choice(PROJECTS),
                feature=rng.choice(FEATURES),
                pr=rng.choice(PRS),
                outcome=rng.choice(OUTCOMES),
                # irregular spacing: 1 day plus a few hours and minutes per step
                created_at=START + timedelta(days=i, hours=(i * 5) % 11, minutes=(i * 7) % 60),
                text=f"{TOPICS[i % len(TOPICS)]} (decision {i})",
            )
        )
    return corpus


def record_params(d: Recorded) -> dict[str, Any]:
    params: dict[str, Any] = {
        "decision": d.text,
        "confidence": d.confidence,
        "category": d.category,
        "stakes": d.stakes,
        "context": f"Context for decision {d.index}",
        "reasons": [
            {"type": "analysis", "text": f"Reason one of {d.index}", "strength": 0.7},
            {"type": "pattern", "text": f"Reason two of {d.index}"},
        ],
        "tags": d.tags,
    }
    for key in ("project", "feature", "pr"):
        if getattr(d, key) is not None:
            params[key] = getattr(d, key)
    return params


# ---------------------------------------------------------------------------------------------
# Filters: the wire value of each, and the reference predicate (written from docs/PROTOCOL.md
# and the filters docstring, independently of the server's code).
# ---------------------------------------------------------------------------------------------

CORPUS = build_corpus()
AFTER_AT = CORPUS[10].created_at  # dateAfter is inclusive: decision 10 must be found
BEFORE_AT = CORPUS[30].created_at  # dateBefore is exclusive: decision 30 must not be found

Predicate = Callable[[Recorded], bool]

FILTERS: dict[str, tuple[Any, Predicate]] = {
    "category": ("security", lambda d: d.category == "security"),
    "stakes": (["high", "critical"], lambda d: d.stakes in ("high", "critical")),
    "status": (["reviewed"], lambda d: d.status == "reviewed"),
    "minConfidence": (0.5, lambda d: d.confidence >= 0.5),
    "maxConfidence": (0.75, lambda d: d.confidence <= 0.75),
    "dateAfter": (iso(AFTER_AT), lambda d: d.created_at >= AFTER_AT),
    "dateBefore": (iso(BEFORE_AT), lambda d: d.created_at < BEFORE_AT),
    "agent": ("bob", lambda d: d.agent == "bob"),
    "tags": (["infra", "db"], lambda d: {"infra", "db"} <= set(d.tags)),
    "project": ("payments", lambda d: d.project == "payments"),
    "feature": ("checkout", lambda d: d.feature == "checkout"),
    "pr": (42, lambda d: d.pr == 42),
    "hasOutcome": (True, lambda d: d.outcome is not None),
}

MIDNIGHT = datetime(2026, 3, 15, tzinfo=UTC)
# Extra values for the single-filter checks: boundaries (0.0 and 1.0 are real confidences),
# other spellings and the opposite values.
VARIANTS: list[tuple[str, Any, Predicate]] = [
    ("minConfidence", 0.0, lambda d: True),
    ("minConfidence", 1.0, lambda d: d.confidence == 1.0),
    ("maxConfidence", 0.0, lambda d: d.confidence == 0.0),
    ("maxConfidence", 1.0, lambda d: True),
    ("minConfidence", 0.75, lambda d: d.confidence >= 0.75),
    ("status", ["pending"], lambda d: d.status == "pending"),
    ("status", ["pending", "reviewed"], lambda d: True),
    ("stakes", ["low"], lambda d: d.stakes == "low"),
    ("stakes", "critical", lambda d: d.stakes == "critical"),
    ("hasOutcome", False, lambda d: d.outcome is None),
    ("agent", "alice", lambda d: d.agent == "alice"),
    ("tags", ["db"], lambda d: "db" in d.tags),
    ("tags", ["perf", "infra", "db"], lambda d: {"perf", "infra", "db"} <= set(d.tags)),
    ("project", "search", lambda d: d.project == "search"),
    ("project", "nope", lambda d: False),
    ("pr", 7, lambda d: d.pr == 7),
    ("feature", "refunds", lambda d: d.feature == "refunds"),
    ("category", "architecture", lambda d: d.category == "architecture"),
    ("dateAfter", "2026-03-15", lambda d: d.created_at >= MIDNIGHT),
    ("dateBefore", "2026-03-15", lambda d: d.created_at < MIDNIGHT),
    ("dateAfter", iso(CORPUS[39].created_at + timedelta(seconds=1)), lambda d: False),
    # the same instants written with another UTC offset
    (
        "dateAfter",
        AFTER_AT.astimezone(timezone(timedelta(hours=2))).isoformat(),
        lambda d: d.created_at >= AFTER_AT,
    ),
    (
        "dateBefore",
        BEFORE_AT.astimezone(timezone(timedelta(hours=-5))).isoformat(),
        lambda d: d.created_at < BEFORE_AT,
    ),
    # whole numbers sent as JSON integers
    ("minConfidence", 1, lambda d: d.confidence == 1.0),
    ("maxConfidence", 0, lambda d: d.confidence == 0.0),
    ("minConfidence", 0, lambda d: True),
    # an empty list restricts nothing; tags are exact and case-sensitive
    ("tags", [], lambda d: True),
    ("stakes", [], lambda d: True),
    ("tags", ["DB"], lambda d: False),
    ("tags", ["db", "db"], lambda d: "db" in d.tags),
]

PAIRS = list(itertools.combinations(FILTERS, 2))


def expected_ids(predicates: list[Predicate]) -> set[str]:
    return {d.id for d in CORPUS if all(p(d) for p in predicates)}


# ---------------------------------------------------------------------------------------------
# Fixtures: one database and one app for the whole module (the corpus is read-only once built).
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def module_db(
    template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    async with copy_database(template_db, tmp_path_factory.mktemp("search")) as url:
        yield url


def make_settings(database_url: str, root: Path) -> Settings:
    return Settings(
        data_dir=root / "data",
        database_url=database_url,
        decisions_dir=root / "decisions",
        auth_tokens=TOKENS,
        rate_limits=parse_rate_limits("default=100000/1"),
        outbox_poll_seconds=0.2,
    )


@pytest.fixture(scope="module")
async def corpus_rpc(
    module_db: str, tmp_path_factory: pytest.TempPathFactory, embedder: Any
) -> AsyncIterator[Rpc]:
    """The 40 decisions recorded (each at its own time) and some reviewed, through the RPC."""
    clock = Clock(START)
    settings = make_settings(module_db, tmp_path_factory.mktemp("search-app"))
    app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    token_of = {agent: token for token, agent in TOKENS.items()}
    async with serve_app(app) as client:
        rpc = Rpc(client)
        for d in CORPUS:
            clock.now = d.created_at
            result = await rpc.ok("cstp.recordDecision", record_params(d), token=token_of[d.agent])
            assert result["indexed"] is True, result
            d.id = result["id"]
        clock.now = START + timedelta(days=60)
        reviewer = add_token(client, "token-bob-reviewer", "bob", "reviewer")  # any decision
        for d in CORPUS:
            if d.outcome is not None:
                clock.now += timedelta(minutes=3)
                reviewed = await rpc.ok(
                    "cstp.reviewDecision",
                    {
                        "id": d.id,
                        "outcome": d.outcome,
                        "actualResult": f"Result {d.index}",
                        "lessons": f"Lesson {d.index}",
                    },
                    token=reviewer,
                )
                assert reviewed["reindexed"] is True, reviewed
        assert len({d.id for d in CORPUS}) == len(CORPUS)
        yield rpc


async def query(rpc: Rpc, filters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = await rpc.ok(
        "cstp.queryDecisions", {"query": QUERY, "limit": 50, "filters": filters, **extra}
    )
    return result


def check_result(result: dict[str, Any], expected: set[str], label: str) -> None:
    """Exact id set, descending scores (what every mode orders by), distances in [0, 2], and
    each item matches what was recorded."""
    items = result["decisions"]
    got = [item["id"] for item in items]
    by_id = {d.id: d for d in CORPUS}
    missing = sorted(by_id[i].index for i in expected - set(got))
    extra = sorted(by_id[i].index if i in by_id else i for i in set(got) - expected)
    assert len(got) == len(set(got)), f"{label}: duplicate ids {got}"
    assert not missing and not extra, f"{label}: missing decisions {missing}, unexpected {extra}"
    assert result["total"] == len(items)
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True), f"{label}: not sorted by score: {scores}"
    distances = [item["distance"] for item in items if "distance" in item]
    assert all(0.0 <= x <= 2.0 for x in distances), distances
    for item in items:
        d = by_id[item["id"]]
        assert item["category"] == d.category
        assert item["stakes"] == d.stakes
        assert item["status"] == d.status
        assert item["confidence"] == d.confidence
        assert item["date"] == iso(d.created_at)
        assert item["title"] == d.text
        assert item.get("outcome") == d.outcome
        assert item.get("tags", []) == d.tags, "tags in the order they were recorded"
        assert "reasons" not in item


# ---------------------------------------------------------------------------------------------
# Every filter, alone and in pairs
# ---------------------------------------------------------------------------------------------


async def test_corpus_makes_every_filter_and_pair_meaningful(corpus_rpc: Rpc) -> None:
    """Guard: each filter keeps some but not all decisions, and every pair keeps some, so a
    filter the server ignored (or applied wrongly) changes the expected answer."""
    for name, (_value, predicate) in FILTERS.items():
        assert 0 < len(expected_ids([predicate])) < len(CORPUS), name
    for a, b in PAIRS:
        assert expected_ids([FILTERS[a][1], FILTERS[b][1]]), (a, b)
    # the inclusive/exclusive date boundaries sit exactly on recorded decisions
    assert FILTERS["dateAfter"][1](CORPUS[10]) and not FILTERS["dateBefore"][1](CORPUS[30])


async def test_no_filter_returns_every_decision(corpus_rpc: Rpc) -> None:
    check_result(await query(corpus_rpc, {}), {d.id for d in CORPUS}, "no filter")


@pytest.mark.parametrize("name", list(FILTERS))
async def test_each_filter_alone(corpus_rpc: Rpc, name: str) -> None:
    value, predicate = FILTERS[name]
    result = await query(corpus_rpc, {name: value})
    check_result(result, expected_ids([predicate]), f"{name}={value!r}")


@pytest.mark.parametrize(
    ("name", "value", "predicate"),
    VARIANTS,
    ids=[f"{name}={value!r}" for name, value, _ in VARIANTS],
)
async def test_each_filter_alone_other_values(
    corpus_rpc: Rpc, name: str, value: Any, predicate: Predicate
) -> None:
    result = await query(corpus_rpc, {name: value})
    check_result(result, expected_ids([predicate]), f"{name}={value!r}")


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
async def test_every_pair_of_filters(corpus_rpc: Rpc, a: str, b: str) -> None:
    (va, pa), (vb, pb) = FILTERS[a], FILTERS[b]
    result = await query(corpus_rpc, {a: va, b: vb})
    check_result(result, expected_ids([pa, pb]), f"{a}={va!r} + {b}={vb!r}")


async def test_all_filters_at_once(corpus_rpc: Rpc) -> None:
    filters = {name: value for name, (value, _p) in FILTERS.items()}
    expected = expected_ids([p for _v, p in FILTERS.values()])
    check_result(await query(corpus_rpc, filters), expected, "all filters")


async def test_limit_keeps_the_nearest_matches(corpus_rpc: Rpc) -> None:
    """A small limit returns the first matches of the full (filtered) ranking, not fewer."""
    value, predicate = FILTERS["hasOutcome"]
    full = await query(corpus_rpc, {"hasOutcome": value})
    assert len(full["decisions"]) == len(expected_ids([predicate])) > 3
    top = await corpus_rpc.ok(
        "cstp.queryDecisions",
        {
            "query": QUERY,
            "limit": 3,
            "filters": {"hasOutcome": value},
        },
    )
    assert [i["id"] for i in top["decisions"]] == [i["id"] for i in full["decisions"][:3]]


async def test_include_reasons(corpus_rpc: Rpc) -> None:
    target = CORPUS[5]
    filters = {
        "dateAfter": iso(target.created_at),
        "dateBefore": iso(target.created_at + timedelta(seconds=1)),
    }
    plain = await query(corpus_rpc, filters)
    assert [i["id"] for i in plain["decisions"]] == [target.id]
    assert "reasons" not in plain["decisions"][0]
    for flag in ({"includeReasons": True}, {"include_reasons": True}):
        rich = await query(corpus_rpc, filters, **flag)
        assert rich["decisions"][0]["reasons"] == [
            {"type": "analysis", "text": f"Reason one of {target.index}", "strength": 0.7},
            {"type": "pattern", "text": f"Reason two of {target.index}", "strength": 0.8},
        ], flag


async def test_result_envelope(corpus_rpc: Rpc) -> None:
    result = await query(corpus_rpc, {"agent": "bob"}, retrievalMode="hybrid")
    assert result["query"] == QUERY
    assert result["agent"] == "alice"  # the token's agent, not a filter or a param
    assert isinstance(result["queryTimeMs"], (int, float)) and result["queryTimeMs"] >= 0
    check_result(result, expected_ids([FILTERS["agent"][1]]), "hybrid")


# ---------------------------------------------------------------------------------------------
# Meaning, not words
# ---------------------------------------------------------------------------------------------

UNRELATED = [
    ("Use PostgreSQL for agent memory storage", "architecture"),
    ("Hold weekly retrospectives with the whole team", "process"),
    ("Adopt ruff as the single Python linter", "tooling"),
    ("Sync invoices to the accounting system nightly", "integration"),
    ("Encrypt backups at rest with per-tenant keys", "security"),
    ("Write architecture decision records for big changes", "process"),
    ("Cache search results for five minutes", "architecture"),
    ("Upgrade the CSV importer to stream large files", "tooling"),
]


async def test_paraphrase_finds_the_decision_first(rpc: Rpc) -> None:
    ids = {}
    for text, category in [("Deploy auth service to production", "architecture"), *UNRELATED]:
        result = await rpc.ok(
            "cstp.recordDecision", {"decision": text, "confidence": 0.8, "category": category}
        )
        ids[text] = result["id"]
    found = await rpc.ok("cstp.queryDecisions", {"query": "roll out the login service"})
    titles = [item["title"] for item in found["decisions"]]
    assert titles[0] == "Deploy auth service to production", titles
    assert len(titles) == len(ids)  # default limit 10 > 9 decisions
    first, second = found["decisions"][0]["distance"], found["decisions"][1]["distance"]
    assert first < second
    # an exact restatement is (almost) at distance 0
    same = await rpc.ok(
        "cstp.queryDecisions", {"query": "Deploy auth service to production", "limit": 1}
    )
    assert same["decisions"][0]["id"] == ids["Deploy auth service to production"]
    assert same["decisions"][0]["distance"] < 0.25


# ---------------------------------------------------------------------------------------------
# Parameter validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 51, -1, "10", 2.5, True])
async def test_limit_out_of_range(shared_rpc: Rpc, limit: int) -> None:
    error = await shared_rpc.error("cstp.queryDecisions", {"query": "anything", "limit": limit})
    assert error["code"] == -32602
    assert error["data"]["field"] == "limit"


@pytest.mark.parametrize("limit", [1, 50])
async def test_limit_bounds_are_accepted(rpc: Rpc, limit: int) -> None:
    result = await rpc.ok("cstp.queryDecisions", {"query": "anything", "limit": limit})
    assert result["decisions"] == []


@pytest.mark.parametrize(
    "params", [{"query": ""}, {"query": "   \n\t"}, {}, {"query": None}, {"query": 42}]
)
async def test_blank_or_missing_query(shared_rpc: Rpc, params: dict[str, Any]) -> None:
    error = await shared_rpc.error("cstp.queryDecisions", params)
    assert error["code"] == -32602
    assert error["data"]["field"] == "query"


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"minConfidence": "high"}, "filters.minConfidence"),
        ({"maxConfidence": 1.5}, "filters.maxConfidence"),
        ({"stakes": ["huge"]}, "filters.stakes"),
        ({"status": ["done"]}, "filters.status"),
        ({"pr": "42"}, "filters.pr"),
        ({"hasOutcome": "yes"}, "filters.hasOutcome"),
        ({"tags": "infra"}, "filters.tags"),
        ({"dateAfter": "last week"}, "filters.dateAfter"),
        ({"dateBefore": "2026-13-45"}, "filters.dateBefore"),
        ({"dateAfter": "2026-03-01T10:00:00"}, "filters.dateAfter"),  # no time zone
        ("security", "filters"),
    ],
)
async def test_bad_filter_names_the_field(shared_rpc: Rpc, filters: Any, field: str) -> None:
    error = await shared_rpc.error("cstp.queryDecisions", {"query": "anything", "filters": filters})
    assert error["code"] == -32602, error
    assert error["data"]["field"].startswith(field), error


async def test_unknown_params_and_null_filters_are_ignored(rpc: Rpc) -> None:
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {"decision": "Adopt trunk based development", "confidence": 0.7, "category": "process"},
    )
    result = await rpc.ok(
        "cstp.queryDecisions",
        {
            "query": "branching strategy",
            "somethingNew": 1,
            "filters": {"category": None, "project": None, "futureFilter": "x"},
        },
    )
    assert [item["id"] for item in result["decisions"]] == [recorded["id"]]


async def test_date_filters_are_exact_to_the_microsecond(settings: Settings, embedder: Any) -> None:
    """Date bounds close together (1 s, 1 ms, 1 µs apart) are still told apart."""
    base = datetime(2026, 9, 30, 23, 59, 58, tzinfo=UTC)
    offsets = [
        timedelta(0),
        timedelta(seconds=1),
        timedelta(seconds=1, milliseconds=1),
        timedelta(seconds=1, milliseconds=1, microseconds=1),
        timedelta(seconds=2),
    ]
    clock = Clock(base)
    app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        ids = []
        for i, offset in enumerate(offsets):
            clock.now = base + offset
            result = await rpc.ok(
                "cstp.recordDecision",
                {
                    "decision": f"Tune the cache eviction policy, step {i}",
                    "confidence": 0.7,
                    "category": "tooling",
                },
            )
            ids.append(result["id"])
        for lo in range(len(offsets)):
            for hi in range(lo, len(offsets) + 1):
                filters: dict[str, Any] = {"dateAfter": iso(base + offsets[lo])}
                if hi < len(offsets):
                    filters["dateBefore"] = iso(base + offsets[hi])
                found = await rpc.ok(
                    "cstp.queryDecisions",
                    {"query": "cache eviction", "limit": 50, "filters": filters},
                )
                assert {item["id"] for item in found["decisions"]} == set(ids[lo:hi]), filters


async def test_filters_on_an_empty_index_or_missing_keys_give_no_match(rpc: Rpc) -> None:
    filters = {name: value for name, (value, _p) in FILTERS.items()}
    empty = await rpc.ok("cstp.queryDecisions", {"query": "anything", "filters": filters})
    assert empty["decisions"] == [] and empty["total"] == 0
    bare = await rpc.ok(
        "cstp.recordDecision",
        {"decision": "Keep a changelog", "confidence": 0.6, "category": "process"},
    )
    for name in ("tags", "project", "feature", "pr"):
        value = FILTERS[name][0]
        result = await rpc.ok(
            "cstp.queryDecisions", {"query": "changelog", "filters": {name: value}}
        )
        assert result["decisions"] == [], name
    found = await rpc.ok(
        "cstp.queryDecisions", {"query": "changelog", "filters": {"hasOutcome": False}}
    )
    assert [item["id"] for item in found["decisions"]] == [bare["id"]]


# ---------------------------------------------------------------------------------------------
# Backend failure: -32003, never a silent empty list
# ---------------------------------------------------------------------------------------------


async def test_unreachable_index_is_query_failed(
    settings: Settings, embedder: Any, free_port: int
) -> None:
    down = replace(settings, chroma_url=f"http://127.0.0.1:{free_port}")
    app = create_app(down, embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        recorded = await rpc.ok(
            "cstp.recordDecision",
            {"decision": "Deploy auth service", "confidence": 0.9, "category": "architecture"},
        )
        assert recorded["indexed"] is False  # stored anyway; the outbox indexes it later
        for params in (
            {"query": "deploy"},
            {"query": "deploy", "filters": {"category": "architecture"}},
        ):
            answer = await rpc.call("cstp.queryDecisions", params)
            assert "result" not in answer, answer
            error = answer["error"]
            assert error["code"] == -32003
            text = repr(error)
            for leak in (
                str(free_port),
                "127.0.0.1",
                "http",
                "Traceback",
                "Exception",
                "ConnectError",
                "Connection refused",
                "chroma",
                str(settings.data_dir),
                "/",
            ):
                assert leak not in text, (leak, error)


# Slow: 101 decisions at the real probe width; test_filtered_depth takes the same paths with
# small widths in the fast loop.
@pytest.mark.slow
async def test_a_rare_filter_match_beyond_the_unfiltered_probe_is_found(rpc: Rpc) -> None:
    """With more decisions than a filtered search first probes unfiltered, a match far from
    the query must still be found (the search then asks the index with the filter)."""
    near = [
        {
            "decision": f"Deploy the auth service to production, wave {i}",
            "confidence": 0.7,
            "category": "architecture",
        }
        for i in range(100)
    ]
    for start in range(0, len(near), 50):
        batch = [
            {"jsonrpc": "2.0", "id": i, "method": "cstp.recordDecision", "params": p}
            for i, p in enumerate(near[start : start + 50])
        ]
        answers = (await rpc.raw(batch)).json()
        assert all("result" in a for a in answers)
    far = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Bake sourdough bread for the team party",
            "confidence": 0.4,
            "category": "security",
        },
    )
    found = await rpc.ok(
        "cstp.queryDecisions",
        {"query": "roll out the login service", "limit": 1, "filters": {"category": "security"}},
    )
    assert [d["id"] for d in found["decisions"]] == [far["id"]]
    # the far decision is beyond what the probe saw, so the filtered query found it
    from app.search.semantic import OVERFETCH, PROBE

    probe = (1 + OVERFETCH) * PROBE
    unfiltered = await rpc.ok(
        "cstp.queryDecisions", {"query": "roll out the login service", "limit": probe}
    )
    assert len(unfiltered["decisions"]) == probe
    assert far["id"] not in [d["id"] for d in unfiltered["decisions"]]


class _RolledBack(Exception):
    pass


async def test_search_reads_beside_the_write_on_sqlite_and_within_it_on_postgres(
    rpc: Rpc, services: Any, seed_decision: dict[str, Any]
) -> None:
    """``Database.read`` (a search's read of its hits) given the call's write session: on
    SQLite it reads in a transaction of its own, so a search never holds the write lock and
    does not see the call's uncommitted change; on Postgres it reads in the call's own
    transaction (one connection instead of two) and sees it."""
    recorded = await rpc.ok("cstp.recordDecision", seed_decision)
    db = services.db

    def lessons(conn: Any) -> str | None:  # a review column: the only kind an UPDATE may change
        return conn.execute(  # type: ignore[no-any-return]
            sql("SELECT lessons FROM decisions WHERE id = :id"), {"id": recorded["id"]}
        ).scalar_one()

    seen = None
    with pytest.raises(_RolledBack):
        async with db.transaction(write=True) as session:
            await session.execute(
                sql("UPDATE decisions SET lessons = 'changed' WHERE id = :id"),
                {"id": recorded["id"]},
            )
            seen = await db.read(lessons, session=session)
            raise _RolledBack
    assert seen == ("changed" if not db.is_sqlite else None)
    assert await db.read(lessons) is None  # the change was rolled back
