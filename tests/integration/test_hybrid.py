"""Keyword and hybrid retrieval (queryDecisions' retrievalMode) on both databases: every
filter holds in every mode, exact tokens are found by words, the keyword index is there the
moment recordDecision answers (it is kept by the database in the same transaction), and a
database migrated from revision 0007 finds its old decisions by keyword.

Run on SQLite by default and on Postgres with CSTP_TEST_DATABASE_URL (``database_url``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.asgi import create_app
from app.config import Settings
from app.db import migrate
from app.runtime import Runtime, iso
from support.app import TOKENS, Rpc, add_token, serve_app

T = TypeVar("T")
MODES = ("semantic", "keyword", "hybrid")
START = datetime(2026, 5, 1, 8, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


# ---------------------------------------------------------------- a corpus with exact tokens

CATEGORIES = ["architecture", "process", "integration", "tooling", "security"]
STAKES = ["low", "medium", "high", "critical"]
CONFIDENCES = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]
TAGS = ["db", "infra", "perf", "cost"]
PROJECTS = [None, "payments", "search"]
FEATURES = [None, "checkout", "refunds"]
PRS = [None, 7, 42]
OUTCOMES = [None, None, "success", "failure"]
SUBJECTS = [
    "Move the billing queue to a managed broker",
    "Cache the product catalogue at the edge",
    "Rotate the database credentials every month",
    "Retry the payment webhooks with backoff",
    "Split the search indexer into its own service",
    "Pin the build toolchain in CI",
]


def token_of(i: int) -> str:
    """A token found in decision ``i`` only, of the kinds agents search by."""
    kind = i % 5
    if kind == 0:
        return f"OPS-{1400 + i}"
    if kind == 1:
        return f"E{1000 + i}"
    if kind == 2:
        return f"ERR_CONN_RESET_{i}"
    if kind == 3:
        return f"billing/invoice_worker_{i}.py"
    return f"psycopg 3.1.{i}"


def unique_part(token: str) -> str:
    """The word of a token that no other decision holds (a version's number)."""
    return token.split()[-1]


@dataclass
class Recorded:
    index: int
    category: str
    stakes: str
    confidence: float
    agent: str
    tags: list[str]
    project: str | None
    feature: str | None
    pr: int | None
    outcome: str | None
    created_at: datetime
    token: str
    where: str  # decision, context or reason: where the token is
    id: str = ""

    @property
    def status(self) -> str:
        return "reviewed" if self.outcome is not None else "pending"

    def params(self) -> dict[str, Any]:
        subject = SUBJECTS[self.index % len(SUBJECTS)]
        decision = f"{subject} ({self.index})"
        context = f"Raised in planning round {self.index}"
        reason = f"Measured over the last quarter, case {self.index}"
        if self.where == "decision":
            decision = f"{decision}, see {self.token}"
        elif self.where == "context":
            context = f"{context}; {self.token} in the logs"
        else:
            reason = f"{reason}; {self.token} under load"
        params: dict[str, Any] = {
            "decision": decision,
            "confidence": self.confidence,
            "category": self.category,
            "stakes": self.stakes,
            "context": context,
            "reasons": [{"type": "empirical", "text": reason}],
            "tags": self.tags,
        }
        for key in ("project", "feature", "pr"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        return params


def build_corpus(n: int = 30) -> list[Recorded]:
    rng = random.Random(21)
    return [
        Recorded(
            index=i,
            category=rng.choice(CATEGORIES),
            stakes=rng.choice(STAKES),
            confidence=rng.choice(CONFIDENCES),
            agent=rng.choice(["alice", "bob"]),
            tags=rng.sample(TAGS, rng.randint(0, 3)),
            project=rng.choice(PROJECTS),
            feature=rng.choice(FEATURES),
            pr=rng.choice(PRS),
            outcome=rng.choice(OUTCOMES),
            created_at=START + timedelta(days=i, hours=(i * 7) % 13, minutes=i),
            token=token_of(i),
            where=("decision", "context", "reason")[i % 3],
        )
        for i in range(n)
    ]


# ---------------------------------------------------------------- filters and their reference

Predicate = Callable[[Recorded], bool]


def reference(filters: dict[str, Any]) -> Predicate:
    """The filters' meaning (PROTOCOL.md), written here independently of the server."""

    def holds(d: Recorded) -> bool:
        for name, value in filters.items():
            if name == "category" and d.category != value:
                return False
            if name == "stakes" and d.stakes not in value:
                return False
            if name == "status" and d.status not in value:
                return False
            if name == "minConfidence" and not d.confidence >= value:
                return False
            if name == "maxConfidence" and not d.confidence <= value:
                return False
            if name == "dateAfter" and not d.created_at >= datetime.fromisoformat(value):
                return False
            if name == "dateBefore" and not d.created_at < datetime.fromisoformat(value):
                return False
            if name == "agent" and d.agent != value:
                return False
            if name == "tags" and not set(value) <= set(d.tags):
                return False
            if name in ("project", "feature", "pr") and getattr(d, name) != value:
                return False
            if name == "hasOutcome" and (d.outcome is not None) != value:
                return False
        return True

    return holds


DAYS = [START + timedelta(days=d) for d in (0, 7, 15, 22, 40)]
FILTER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "category": st.sampled_from(CATEGORIES),
    "stakes": st.lists(st.sampled_from(STAKES), min_size=1, max_size=3, unique=True),
    "status": st.lists(st.sampled_from(["pending", "reviewed"]), min_size=1, unique=True),
    "minConfidence": st.sampled_from(CONFIDENCES),
    "maxConfidence": st.sampled_from(CONFIDENCES),
    "dateAfter": st.sampled_from([iso(d) for d in DAYS]),
    "dateBefore": st.sampled_from([iso(d) for d in DAYS]),
    "agent": st.sampled_from(["alice", "bob"]),
    "tags": st.lists(st.sampled_from(TAGS), min_size=1, max_size=2, unique=True),
    "project": st.sampled_from(["payments", "search"]),
    "feature": st.sampled_from(["checkout", "refunds"]),
    "pr": st.sampled_from([7, 42]),
    "hasOutcome": st.booleans(),
}
filters_strategy = st.dictionaries(
    st.sampled_from(sorted(FILTER_VALUES)), st.none(), max_size=4
).flatmap(lambda chosen: st.fixed_dictionaries({k: FILTER_VALUES[k] for k in chosen}))


# ---------------------------------------------------------------- running Hypothesis


class Bridge:
    """Runs coroutines in the test's event loop from Hypothesis' worker thread."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(60)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError("no answer within 60 s") from None


PROPERTY = hyp_settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=120,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# Slow: a long fuzz run (120 examples, 3 modes each); the filter tests of test_search and
# test_index_filters stay in the fast loop.
@pytest.mark.slow
async def test_every_mode_keeps_every_filter_and_finds_exact_tokens(
    settings: Settings, embedder: Any
) -> None:
    """Random filter combinations and queries, in every mode: every result satisfies every
    filter; and a decision that satisfies them and holds the query's exact token is found
    by keyword and hybrid search (limit 5, among 30 decisions). The query is the token,
    alone or with a word of the decision's subject: BM25 ranks a decision holding two of a
    query's commoner words above one holding its rare token, when their weights add up to
    more."""
    corpus = build_corpus()
    clock = Clock(START)
    app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    token_of_agent = {agent: token for token, agent in TOKENS.items()}
    async with serve_app(app) as client:
        rpc = Rpc(client)
        for d in corpus:
            clock.now = d.created_at
            result = await rpc.ok("cstp.recordDecision", d.params(), token=token_of_agent[d.agent])
            d.id = result["id"]
        clock.now = START + timedelta(days=90)
        reviewer = add_token(client, "token-bob-reviewer", "bob", "reviewer")  # any decision
        for d in corpus:
            if d.outcome is not None:
                await rpc.ok(
                    "cstp.reviewDecision",
                    {"id": d.id, "outcome": d.outcome, "lessons": f"Lesson {d.index}"},
                    token=reviewer,
                )
        by_id = {d.id: d for d in corpus}
        bridge = Bridge()
        seen = {"checked": 0, "found": 0}

        @PROPERTY
        @given(
            filters=filters_strategy,
            target=st.integers(0, len(corpus) - 1),
            extra=st.integers(0, 3),
            whole=st.booleans(),
        )
        def check(filters: dict[str, Any], target: int, extra: int, whole: bool) -> None:
            d = corpus[target]
            token = d.token if whole else unique_part(d.token)
            # the token, alone or with a word of the decision's own subject
            words = SUBJECTS[d.index % len(SUBJECTS)].split()
            query = f"{token} {words[extra]}" if extra else token
            holds = reference(filters)
            for mode in MODES:
                answer = bridge.run(
                    rpc.ok(
                        "cstp.queryDecisions",
                        {"query": query, "limit": 5, "filters": filters, "retrievalMode": mode},
                    )
                )
                assert answer["retrievalMode"] == mode
                got = [item["id"] for item in answer["decisions"]]
                assert len(got) == len(set(got)), (mode, got)
                broken = [by_id[i].index for i in got if not holds(by_id[i])]
                assert not broken, (mode, filters, query, broken)
                scores = [item["score"] for item in answer["decisions"]]
                assert scores == sorted(scores, reverse=True), (mode, scores)
                if mode == "keyword":
                    assert all("distance" not in item for item in answer["decisions"])
                if mode == "semantic":
                    assert all("distance" in item for item in answer["decisions"])
                if mode != "semantic" and holds(d):
                    seen["checked"] += 1
                    assert d.id in got, (mode, filters, query, [by_id[i].index for i in got])
                    seen["found"] += 1

        await asyncio.wait_for(asyncio.to_thread(check), 600)
        assert seen["checked"] >= 40, seen  # the token check ran, not only the filter check


# ---------------------------------------------------------------- exact tokens, injection

EXACT = [
    ("OPS-1432", "Escalated as OPS-1432 after the outage"),
    ("E1042", "Clients get E1042 when the pool is empty"),
    ("ERR_CONN_RESET", "The logs show ERR_CONN_RESET under load"),
    ("billing/invoice_worker.py", "The change is mostly in billing/invoice_worker.py"),
    ("psycopg 3.1.18", "Requires psycopg 3.1.18 or newer"),
]


async def test_exact_tokens_are_found_by_words_in_every_field(rpc: Rpc) -> None:
    """Ticket ids, error codes, file names and versions, in a decision's text, context,
    reasons or tags, are found by keyword (first) and hybrid search; the other decisions
    are only near in meaning."""
    ids = {}
    for n, (token, sentence) in enumerate(EXACT):
        params: dict[str, Any] = {
            "decision": f"Keep the service healthy, step {n}",
            "confidence": 0.6,
            "category": "tooling",
        }
        field_name = ("decision", "context", "reasons", "context", "reasons")[n]
        if field_name == "decision":
            params["decision"] = sentence
        elif field_name == "context":
            params["context"] = sentence
        else:
            params["reasons"] = [{"type": "analysis", "text": sentence}]
        ids[token] = (await rpc.ok("cstp.recordDecision", params))["id"]
    tagged = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Keep the service healthy, tagged",
            "confidence": 0.6,
            "category": "tooling",
            "tags": ["INC-77"],
        },
    )
    for token, _ in [*EXACT, ("INC-77", "")]:
        wanted = ids.get(token, tagged["id"])
        for mode in ("keyword", "hybrid"):
            answer = await rpc.ok(
                "cstp.queryDecisions", {"query": token, "limit": 3, "retrievalMode": mode}
            )
            assert answer["decisions"][0]["id"] == wanted, (token, mode, answer["decisions"])
    # case and a trailing punctuation mark do not matter; a different number does
    assert (
        await rpc.ok("cstp.queryDecisions", {"query": "ops-1432.", "retrievalMode": "keyword"})
    )["decisions"][0]["id"] == ids["OPS-1432"]
    other = await rpc.ok("cstp.queryDecisions", {"query": "E1043", "retrievalMode": "keyword"})
    assert other["decisions"] == []


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"unterminated',
        "a AND b OR NOT c",
        "NEAR(a b, 3)",
        "decision:x context:y",
        "{decision context}: x",
        "col* ^start -minus +plus",
        "'; DROP TABLE decisions; --",
        "a & b | !c <-> d",
        "(((",
        "\\",
        "ünïcödé ☕ 中文",
        "—",
        " ".join(f"w{i}" for i in range(200)),
    ],
)
async def test_full_text_syntax_in_a_query_is_only_words(shared_rpc: Rpc, query: str) -> None:
    """No query text is full-text syntax: every mode answers (never an error) and keyword
    search finds what holds the words. (One app for the module: the other queries' records
    hold "record" too, so the search asks for all of them, as many as there are queries.)"""
    recorded = await shared_rpc.ok(
        "cstp.recordDecision",
        {"decision": f"Record of {query[:200]}", "confidence": 0.5, "category": "process"},
    )
    for mode in MODES:
        answer = await shared_rpc.ok("cstp.queryDecisions", {"query": query, "retrievalMode": mode})
        assert answer["retrievalMode"] == mode
    by_words = await shared_rpc.ok(
        "cstp.queryDecisions",
        {"query": f"record {query}", "retrievalMode": "keyword", "limit": 50},
    )
    assert recorded["id"] in [d["id"] for d in by_words["decisions"]]


# ---------------------------------------------------------------- no outbox, no staleness


async def test_keyword_results_are_there_when_record_decision_answers(
    settings: Settings, embedder: Any, free_port: int
) -> None:
    """The keyword index is written by the database in the decision's own transaction: a
    decision is found by keyword search the moment recordDecision answers, even while the
    vector index is down (recorded with indexed: false) - when hybrid search is -32003."""
    down = replace(settings, chroma_url=f"http://127.0.0.1:{free_port}")
    app = create_app(down, embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        for n in range(5):
            token = f"SEC-{9000 + n}"
            recorded = await rpc.ok(
                "cstp.recordDecision",
                {
                    "decision": f"Revoke the leaked key ({token})",
                    "confidence": 0.9,
                    "category": "security",
                    "reasons": [{"type": "constraint", "text": "Exposed in a public gist"}],
                    "tags": ["incident"],
                },
            )
            assert recorded["indexed"] is False
            found = await rpc.ok(
                "cstp.queryDecisions",
                {"query": token, "retrievalMode": "keyword", "filters": {"tags": ["incident"]}},
            )
            assert [d["id"] for d in found["decisions"]] == [recorded["id"]]
            by_reason = await rpc.ok(
                "cstp.queryDecisions", {"query": "public gist", "retrievalMode": "keyword"}
            )
            assert recorded["id"] in [d["id"] for d in by_reason["decisions"]]
        error = await rpc.error("cstp.queryDecisions", {"query": "SEC-9000"})
        assert error["code"] == -32003  # hybrid (the default) needs the vector index


async def test_keyword_results_are_there_for_a_batch_of_records(rpc: Rpc) -> None:
    """Decisions recorded together (one group transaction) are each found at once."""
    batch = [
        {
            "jsonrpc": "2.0",
            "id": n,
            "method": "cstp.recordDecision",
            "params": {
                "decision": f"Ship the hotfix for PAY-{500 + n}",
                "confidence": 0.7,
                "category": "process",
                "reasons": [{"type": "analysis", "text": f"Customers saw E{700 + n}"}],
                "tags": [f"wave-{n}"],
            },
        }
        for n in range(12)
    ]
    answers = (await rpc.raw(batch)).json()
    ids = {a["id"]: a["result"]["id"] for a in answers}
    for n, decision_id in ids.items():
        for query in (f"PAY-{500 + n}", f"E{700 + n}", f"wave-{n}"):
            found = await rpc.ok(
                "cstp.queryDecisions", {"query": query, "limit": 1, "retrievalMode": "keyword"}
            )
            assert [d["id"] for d in found["decisions"]] == [decision_id], query


# ---------------------------------------------------------------- the param


@pytest.mark.parametrize("value", ["fuzzy", "", "SEMANTIC", 42, True, ["hybrid"]])
async def test_an_unknown_retrieval_mode_is_invalid_params(shared_rpc: Rpc, value: Any) -> None:
    error = await shared_rpc.error(
        "cstp.queryDecisions", {"query": "anything", "retrievalMode": value}
    )
    assert error["code"] == -32602, error
    assert error["data"]["field"] == "retrievalMode", error


async def test_the_answer_names_the_mode_and_scores_order_it(rpc: Rpc) -> None:
    for text_ in ("Adopt a message queue for order events", "Cache product pages"):
        await rpc.ok(
            "cstp.recordDecision", {"decision": text_, "confidence": 0.5, "category": "tooling"}
        )
    default = await rpc.ok("cstp.queryDecisions", {"query": "queue for events"})
    assert default["retrievalMode"] == "hybrid"
    for mode in MODES:
        answer = await rpc.ok(
            "cstp.queryDecisions", {"query": "queue for events", "retrievalMode": mode}
        )
        assert answer["retrievalMode"] == mode
        items = answer["decisions"]
        assert items, mode
        scores = [i["score"] for i in items]
        assert scores == sorted(scores, reverse=True)
        if mode == "semantic":
            assert all(abs(i["score"] - (1 - i["distance"])) < 1e-5 for i in items)
        if mode == "keyword":
            assert all("distance" not in i and i["score"] > 0 for i in items)
        if mode == "hybrid":
            assert items[0]["title"] == "Adopt a message queue for order events"
            assert all(
                i["score"] >= 1 - i["distance"] - 1e-6 for i in items if "distance" in i
            )  # a keyword bonus never lowers the score


# ---------------------------------------------------------------- migration 0008


@dataclass
class Old:
    id: str
    decision: str
    context: str | None
    reasons: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)


OLD = [
    Old("0a0b0c01", "Adopt blue-green deploys for the auth service", "After INC-4411", ["x"]),
    Old("0a0b0c02", "Split the ledger tables", None, ["Lock waits: SQLSTATE 40001"], ["db"]),
    Old("0a0b0c03", "Freeze schema changes", "Audit season", [], ["audit-2026"]),
]


async def _fill_at_0007(url: str) -> None:
    sqlite = url.startswith("sqlite")
    when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for old in OLD:
            await conn.execute(
                text(
                    "INSERT INTO decisions (id, summary, decision, category, confidence, stakes,"
                    " status, created_at, recorded_by, context, project)"
                    " VALUES (:id, :d, :d, 'process', 0.7, 'high', 'pending', :at,"
                    " 'legacy-agent', :context, 'auth')"
                ),
                {
                    "id": old.id,
                    "d": old.decision,
                    "context": old.context,
                    "at": when.replace(tzinfo=None) if sqlite else when,
                },
            )
            for n, reason in enumerate(old.reasons):
                await conn.execute(
                    text(
                        "INSERT INTO decision_reasons (decision_id, position, type, text,"
                        " strength) VALUES (:id, :n, 'empirical', :t, 0.9)"
                    ),
                    {"id": old.id, "n": n, "t": reason},
                )
            for n, tag in enumerate(old.tags):
                await conn.execute(
                    text(
                        "INSERT INTO decision_tags (decision_id, tag, position)"
                        " VALUES (:id, :tag, :n)"
                    ),
                    {"id": old.id, "tag": tag, "n": n},
                )
    await engine.dispose()


async def test_decisions_of_revision_0007_are_found_by_keyword_after_the_upgrade(
    database_url: str, settings: Settings, embedder: Any
) -> None:
    """Migration 0008 fills the keyword index from the decisions already stored (their
    text, context, reasons and tags); its downgrade drops it and nothing else, and
    upgrading again fills it again, with what was recorded in between."""
    await migrate.downgrade(database_url, "0007")
    await _fill_at_0007(database_url)
    await migrate.upgrade(database_url)
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        for query, wanted in [
            ("INC-4411", "0a0b0c01"),
            ("blue-green deploys", "0a0b0c01"),
            ("SQLSTATE 40001", "0a0b0c02"),
            ("audit-2026", "0a0b0c03"),
            ("ledger", "0a0b0c02"),
        ]:
            found = await rpc.ok(
                "cstp.queryDecisions",
                {
                    "query": query,
                    "limit": 1,
                    "retrievalMode": "keyword",
                    "filters": {"project": "auth"},
                },
            )
            assert [d["id"] for d in found["decisions"]] == [wanted], query
        # recorded after the upgrade: the triggers keep the index
        new = await rpc.ok(
            "cstp.recordDecision",
            {
                "decision": "Adopt canary releases after INC-4411",
                "confidence": 0.8,
                "category": "process",
                "project": "auth",
            },
        )
        found = await rpc.ok(
            "cstp.queryDecisions", {"query": "INC-4411", "retrievalMode": "keyword"}
        )
        assert {d["id"] for d in found["decisions"]} == {"0a0b0c01", new["id"]}
    await migrate.downgrade(database_url, "0007")
    engine = create_async_engine(database_url)
    async with engine.connect() as conn:
        names = await conn.run_sync(lambda c: c.dialect.get_table_names(c))
        count = (await conn.execute(text("SELECT COUNT(*) FROM decisions"))).scalar()
    await engine.dispose()
    assert not any(n.startswith("decision_search") for n in names), names
    assert count == len(OLD) + 1
    await migrate.upgrade(database_url)
    assert await migrate.drift(database_url) == []
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as client:
        found = await Rpc(client).ok(
            "cstp.queryDecisions", {"query": "INC-4411", "retrievalMode": "keyword"}
        )
        assert {d["id"] for d in found["decisions"]} == {"0a0b0c01", new["id"]}
