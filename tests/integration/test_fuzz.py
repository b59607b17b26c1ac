"""Malformed JSON-RPC against the real app over HTTP (issue 8): random bytes, truncated JSON,
deep nesting, huge numbers, NaN, odd unicode, random envelopes, random methods and params, and
mutations of valid params of every real method.

For every answer: never an HTTP 5xx; a 200 body is JSON-RPC (a result, or an error whose code
is in docs/PROTOCOL.md's table); no error leaks exception text, a path or SQL; and afterwards
the server still serves normally. Since the database and the vector index are healthy throughout, an
InternalError (-32603), StorageError (-32005) or QueryFailed (-32003) means bad input slipped
past validation: that fails too. The tests at the end pin the input classes that once did
(deep nesting, out-of-range integers and timestamps, NUL characters).

Hypothesis runs in a worker thread (derandomized, no example database); each example's
request is sent into the test's own event loop, where ``serve_app`` runs the app, with a
timeout on every wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import math
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from app.asgi import build_registry, create_app
from app.config import Settings
from app.search.embedder import Embedder
from support.app import AppClient, serve_app

# Slow: long property-based fuzz runs:
# the fast loop (-m "not slow") leaves it out.
pytestmark = pytest.mark.slow

T = TypeVar("T")

TOKEN = "token-alice"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
SPEC_CODES = {
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
    -32002,
    -32003,
    -32004,
    -32005,
    -32007,
    -32008,
    -32010,
}
MAX_BODY = 64 * 1024  # small cap, so that oversized bodies (HTTP 413) are cheap to send
REQUEST_TIMEOUT = 30.0
METHODS = build_registry().names()
INT64 = 2**63 - 1
INT32 = 2**31 - 1

FUZZ = hyp_settings(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)

# What a leak looks like. Checked only when the request itself does not contain it (the
# server may echo a caller's method name or field names back).
LEAK_WORDS = (
    "Traceback",
    "/work",
    ".py",
    "SELECT",
    "INSERT",
    "UPDATE ",
    "DELETE FROM",
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
    "sqlite3",
    "msgspec",
    "chromadb",
    'File "',
    "`",
    "<module>",
    "object at 0x",
)
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception|Warning)\b")

# ---------------------------------------------------------------- the app and the bridge


@pytest.fixture
async def app_client(settings: Settings, embedder: Embedder) -> Any:
    app = create_app(settings.with_overrides(max_body_bytes=MAX_BODY), embedder=embedder)
    async with serve_app(app) as http:
        yield http


class Bridge:
    """Runs coroutines in the test's event loop from Hypothesis' worker thread."""

    def __init__(self, client: AppClient) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.sent = 0
        self.seen: dict[str, int] = {}

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"no answer within {timeout:g} s") from None

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        self.sent += 1
        return self.run(
            self.client.post("/cstp", content=body, headers=AUTH if headers is None else headers)
        )

    def send(self, body: bytes) -> httpx.Response:
        """POST ``body`` and check the answer against every rule of this file."""
        response = self.post(body)
        check_answer(body, response, self)
        return response


async def in_thread(fn: Callable[[], None]) -> None:
    """Run a Hypothesis test function in a worker thread, bounded in time."""
    await asyncio.wait_for(asyncio.to_thread(fn), 600)


# ---------------------------------------------------------------- the rules of an answer


def _parsed(body: bytes) -> tuple[bool, Any]:
    """The request as JSON, by the server's own rules (msgspec: e.g. 1e999 is not a number)."""
    try:
        return True, msgspec.json.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False, None


# The server decodes a body deeper in the stack than this test does, and msgspec gives up at
# Python's recursion limit: a body nested this deep may be a parse error there ("nested too
# deeply") though it decodes here.
DEEP_ENOUGH_TO_REFUSE = 500


def _nesting(body: bytes) -> int:
    """How deep the body's arrays and objects nest (brackets inside strings not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _request_text(body: bytes, parsed: Any, ok: bool) -> str:
    text = body.decode("utf-8", "replace")
    if ok:
        with contextlib.suppress(ValueError, RecursionError):
            text += json.dumps(parsed, ensure_ascii=False)
    return text


def _walk(value: Any) -> Iterator[tuple[Any, int]]:
    """Every value, key and container inside ``value`` with its depth (no recursion)."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        yield item, level
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
            stack.extend((k, level + 1) for k in item)
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)


def _leaks(value: Any, request_text: str) -> list[str]:
    found: list[str] = []
    for item, _level in _walk(value):
        if not isinstance(item, str):
            continue
        for word in LEAK_WORDS:
            if word in item and word not in request_text:
                found.append(f"{word!r} in {item[:200]!r}")
        for match in EXCEPTION_NAME.finditer(item):
            if match.group(0) not in request_text:
                found.append(f"{match.group(0)!r} in {item[:200]!r}")
    return found


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


def _notification(item: Any) -> bool:
    """A valid request without an id: run, never answered (an invalid one gets an error)."""
    return (
        isinstance(item, dict)
        and "id" not in item
        and item.get("jsonrpc") == "2.0"
        and isinstance(item.get("method"), str)
    )


def check_answer(body: bytes, response: httpx.Response, bridge: Bridge) -> None:
    status = response.status_code
    context = f"request {body[:300]!r} -> HTTP {status} {response.text[:500]!r}"
    assert status < 500, context
    bridge.seen[str(status)] = bridge.seen.get(str(status), 0) + 1
    if status == 413:
        assert len(body) > MAX_BODY, context
        return
    assert status in (200, 204), context
    ok, request = _parsed(body)
    if status == 204:
        assert response.content == b"", context
        items = request if isinstance(request, list) else [request]
        assert ok and items and all(_notification(i) for i in items), context
        return
    answer = response.json()
    answers = answer if isinstance(answer, list) else [answer]
    if (
        ok
        and isinstance(answer, dict)
        and answer.get("error", {}).get("message") == "Parse error: nested too deeply"
        and _nesting(body) >= DEEP_ENOUGH_TO_REFUSE
    ):
        ok, request = False, None
    assert answers, context
    request_text = _request_text(body, request, ok)
    for one in answers:
        assert isinstance(one, dict) and one.get("jsonrpc") == "2.0", context
        assert "id" in one and _valid_id(one["id"]), context
        assert ("result" in one) != ("error" in one), context
        if "result" in one:
            continue
        error = one["error"]
        code = error.get("code")
        assert isinstance(code, int) and not isinstance(code, bool), context
        assert code in SPEC_CODES, context
        assert isinstance(error.get("message"), str) and error["message"], context
        assert not _leaks(error, request_text), (_leaks(error, request_text), context)
        bridge.seen[str(code)] = bridge.seen.get(str(code), 0) + 1
        assert code not in (-32603, -32005, -32003), f"healthy server answered {code}: {context}"
    if not ok:
        assert len(answers) == 1 and answers[0]["error"]["code"] == -32700, context
        assert answers[0]["id"] is None, context
    elif isinstance(request, dict):
        assert isinstance(answer, dict), context
        if _valid_id(request.get("id")) and request.get("jsonrpc") == "2.0":
            assert answer["id"] == request.get("id"), context
    elif isinstance(request, list) and 0 < len(request) <= 50:
        assert isinstance(answer, list), context
        assert len(answers) == sum(1 for i in request if not _notification(i)), context


def encode(value: Any, ascii_only: bool = True) -> bytes:
    text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def still_serving(bridge: Bridge) -> None:
    """A normal call after the storm: recorded, found again, and the app is healthy."""
    params = {
        "decision": "Keep serving after malformed input",
        "confidence": 0.6,
        "category": "process",
    }
    answer = bridge.post(
        encode({"jsonrpc": "2.0", "id": "after", "method": "cstp.recordDecision", "params": params})
    ).json()
    assert answer["result"]["success"] is True, answer
    got = bridge.post(
        encode(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "cstp.getDecision",
                "params": {"id": answer["result"]["id"]},
            }
        )
    ).json()
    assert got["result"]["decision"]["decision"] == params["decision"], got
    assert bridge.run(bridge.client.get("/health")).status_code == 200


def report(name: str, bridge: Bridge) -> None:
    print(f"\n{name}: {bridge.sent} requests, answers {dict(sorted(bridge.seen.items()))}")


# ---------------------------------------------------------------- strategies

BIG_NUMBERS = st.sampled_from(
    [
        0,
        -1,
        -(2**31),
        2**31,
        INT64,
        -INT64 - 1,
        2**64,
        10**30,
        -(10**30),
        10**400,
        1e308,
        -1e308,
        5e-324,
        1.0000001,
        -0.0,
        0.1 + 0.2,
        math.inf,
        -math.inf,
        math.nan,
    ]
)
ODD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\t\n",
        "\x00",
        "a\x00b",
        "\u202e\u202d",
        "\ufeff",
        "\ud7ff",
        "\U0001f600" * 10,
        "é" * 300,
        "🦄" * 100,
        "'; DROP TABLE decisions; --",
        "../../etc/passwd",
        "%s%n%x",
        "null",
        "NaN",
        "1e999",
        "<script>",
        "\\u0000",
        "2026-13-45",
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-14:00",
        "2026-01-01",
        "2026-01-01T00:00:00",
        "deadbeef",
        "DEADBEEF",
        "0" * 8,
        "x" * 129,
        "x" * 257,
        "x" * 4097,
        "x" * 20_001,
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    BIG_NUMBERS,
    st.text(max_size=30),
    ODD_TEXT,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(
                st.text(max_size=12),
                st.sampled_from(
                    ["id", "jsonrpc", "method", "params", "decision", "query", "filters"]
                ),
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
HUGE_TEXT = st.integers(min_value=10_000, max_value=80_000).map(lambda n: "y" * n)
BAD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    BIG_NUMBERS,
    st.integers(),
    st.floats(),
    ODD_TEXT,
    st.text(max_size=40),
    HUGE_TEXT,
    st.just([]),
    st.just({}),
    st.just([{}]),
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=3),
    JSON_VALUES,
)
EXTREME_INTS = st.sampled_from(
    [-1, 0, 2**31 - 1, 2**31, 2**53 + 1, INT64, INT64 + 1, 2**64, -INT64 - 2, 10**30]
)
EXTREME_FLOATS = st.sampled_from([-0.0, -1e-9, 1.0000000001, 2.0, -1.0, 1e308, 5e-324, 0.5])
EXTREME_TEXT = st.one_of(
    ODD_TEXT,
    HUGE_TEXT,
    st.text(max_size=20).map(lambda t: t + "\x00"),
    st.text(min_size=1, max_size=20),
)


def same_kind_extreme(original: Any) -> st.SearchStrategy[Any]:
    """A value of the field's own type, at or past its edges (passes a type check)."""
    if isinstance(original, bool):
        return st.sampled_from([0, 1, "true", "false", None])
    if isinstance(original, int):
        return EXTREME_INTS
    if isinstance(original, float):
        return st.one_of(EXTREME_FLOATS, EXTREME_INTS)
    if isinstance(original, str):
        return EXTREME_TEXT
    if isinstance(original, list):
        return st.one_of(
            st.just([]),
            st.just([None]),
            st.lists(st.just(original[:1] or ["t"]), min_size=101, max_size=101).map(
                lambda ls: [x[0] for x in ls]
            ),
            st.lists(EXTREME_TEXT, min_size=1, max_size=3),
        )
    if isinstance(original, dict):
        return st.sampled_from([{}, {"": None}, {"\x00": 1}, {"k": [[[]]]}])
    return BAD_VALUES


IDS = st.one_of(
    st.integers(), st.text(max_size=20), st.none(), st.floats(allow_nan=False, allow_infinity=False)
)


def nested(depth: int, leaf: str = "") -> str:
    return "[" * depth + leaf + "]" * depth


def valid_params(known_id: str) -> dict[str, dict[str, Any]]:
    """One full, valid params object per method (every field used)."""
    return {
        "cstp.recordDecision": {
            "decision": "Use a queue between billing and invoicing",
            "confidence": 0.7,
            "category": "architecture",
            "stakes": "high",
            "context": "Invoices arrive late",
            "reasons": [{"type": "analysis", "text": "Decouples the two", "strength": 0.9}],
            "kpiIndicators": ["latency"],
            "mentalState": "deliberate",
            "reviewIn": "2w",
            "tags": ["queue", "billing"],
            "project": "billing",
            "feature": "invoices",
            "pr": 12,
            "file": "src/billing.py",
            "line": 40,
            "commit": "abc123",
            "preDecision": {
                "queryRun": True,
                "similarFound": 1,
                "guardrailsChecked": True,
                "guardrailsPassed": True,
            },
        },
        "cstp.queryDecisions": {
            "query": "queue between services",
            "limit": 5,
            "includeReasons": True,
            "retrievalMode": "semantic",
            "filters": {
                "category": "architecture",
                "stakes": ["high", "low"],
                "status": ["pending"],
                "minConfidence": 0.1,
                "maxConfidence": 0.9,
                "dateAfter": "2020-01-01",
                "dateBefore": "2100-01-01T00:00:00Z",
                "agent": "alice",
                "tags": ["queue"],
                "project": "billing",
                "feature": "invoices",
                "pr": 12,
                "hasOutcome": False,
            },
        },
        "cstp.checkGuardrails": {
            "action": {
                "description": "Deploy billing to production",
                "category": "architecture",
                "stakes": "high",
                "confidence": 0.8,
                "project": "billing",
                "context": {"code_review": True, "affects_production": True},
            },
        },
        "cstp.announceIntent": {
            "intent": "Split the billing service",
            "context": "Too many deploys",
            "category": "architecture",
            "stakes": "medium",
            "confidence": 0.6,
            "agent": {"id": "someone-else", "url": "http://127.0.0.1/agent"},
            "correlationId": "fuzz-intent-1",
            "metadata": {"code_review": True, "ticket": {"id": "OPS-1", "links": [1, 2]}},
            "project": "billing",
        },
        "cstp.reviewDecision": {
            "id": known_id,
            "outcome": "partial",
            "actualResult": "Half the latency",
            "lessons": "Measure first",
            "notes": "ok",
            "affectedKpis": {"latency": -0.5, "by_region": {"eu": [0.1, 0.2]}},
        },
        "cstp.getDecision": {"id": known_id},
        "cstp.listDecisions": {
            "limit": 5,
            "offset": 0,
            "category": "architecture",
            "stakes": "high",
            "status": "pending",
            "agent": "alice",
            "tags": ["queue"],
            "dateFrom": "2020-01-01",
            "dateTo": "2100-01-01T00:00:00Z",
            "search": "queue",
            "sort": "confidence",
            "order": "asc",
            "correlationId": "fuzz-intent-1",
        },
        "rpc.discover": {},
        "cstp.listGuardrails": {"scope": "production"},
        "cstp.getCalibration": {
            "filters": {
                "agent": "alice",
                "category": "architecture",
                "stakes": "high",
                "since": "2020-01-01",
                "until": "2100-01-01",
                "minDecisions": 1,
            },
            "groupBy": "category",
        },
        # an approval no call asked for: -32007 (alice's token has no approve scope: -32010)
        "cstp.getApproval": {"id": "00000000-0000-4000-8000-000000000000"},
        "cstp.listApprovals": {"status": "pending", "limit": 5, "offset": 0},
        "cstp.decideApproval": {
            "id": "00000000-0000-4000-8000-000000000000",
            "verdict": "approve",
            "reason": "Window agreed",
        },
        "cstp.ready": {"limit": 5, "agent": "alice"},
        "cstp.checkDrift": {
            "agent": "alice",
            "category": "architecture",
            "recentDays": 30,
            "baselineDays": 90,
            "minDecisions": 5,
        },
        "cstp.getSessionContext": {
            "task": "queue between services",
            "maxTokens": 500,
            "format": "json",
        },
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and list position inside ``value`` (the places a mutation can hit)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append((*prefix, key))
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.append((*prefix, index))
            found += paths(item, (*prefix, index))
    return found


def mutate(value: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    value = json.loads(json.dumps(value))
    target = value
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = new
    return value


def known_decision(bridge: Bridge) -> str:
    params = {"decision": "Fuzz target decision", "confidence": 0.5, "category": "tooling"}
    answer = bridge.post(
        encode({"jsonrpc": "2.0", "id": 0, "method": "cstp.recordDecision", "params": params})
    ).json()
    return str(answer["result"]["id"])


# ---------------------------------------------------------------- the fuzz tests


async def test_fuzz_raw_bodies(app_client: AppClient) -> None:
    """Bytes that are not (quite) JSON-RPC: random bytes, cut JSON, nesting, odd numbers."""
    bridge = Bridge(app_client)
    good = encode(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "cstp.listDecisions",
            "params": {"limit": 3, "search": "é ☕"},
        },
        ascii_only=False,
    )
    raw = st.one_of(
        st.binary(max_size=300),
        st.integers(min_value=0, max_value=len(good) - 1).map(lambda n: good[:n]),
        st.tuples(st.integers(0, len(good) - 1), st.binary(min_size=1, max_size=3)).map(
            lambda t: good[: t[0]] + t[1] + good[t[0] + 1 :]
        ),
        st.integers(min_value=1, max_value=3000).map(lambda d: nested(d).encode()),
        st.integers(min_value=1, max_value=300).map(
            lambda d: (
                '{"jsonrpc":"2.0","id":1,"method":"cstp.getDecision","params":{"id":'
                + nested(d, '"x"')
                + "}}"
            ).encode()
        ),
        st.integers(min_value=1, max_value=200).map(
            lambda d: (
                '{"jsonrpc":"2.0","id":1,"method":"cstp.queryDecisions","params":'
                + '{"query":"x","filters":' * d
                + "{}"
                + "}" * d
                + "}"
            ).encode()
        ),
        st.sampled_from(
            [
                b"",
                b" ",
                b"null",
                b"NaN",
                b"Infinity",
                b"-Infinity",
                b"1e999",
                b"[]",
                b"{}",
                b"[[]]",
                b"[{}]",
                b"[1,2,3]",
                b'"\\ud800"',
                b'{"jsonrpc":"2.0","id":1e999,"method":"cstp.listGuardrails"}',
                b'{"jsonrpc":"2.0","id":NaN,"method":"cstp.listGuardrails"}',
                b'{"jsonrpc":"2.0","id":123456789012345678901234567890,'
                b'"method":"cstp.listGuardrails"}',
                b'{"jsonrpc":"2.0","method":"cstp.listGuardrails","id":1,"id":2}',
                b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"cstp.listGuardrails"}',
                b'{"jsonrpc":"2.0","id":1,"method":"cstp.listGuardrails"}\x00',
                b"\xff\xfe{\x00}\x00",
                b"[" + b"1," * 20_000 + b"1]",
                b'{"a":"' + b"z" * (MAX_BODY + 1) + b'"}',
            ]
        ),
    )

    @hyp_settings(FUZZ, max_examples=500)
    @given(body=raw)
    def run(body: bytes) -> None:
        bridge.send(body)

    await in_thread(run)
    await in_thread(lambda: still_serving(bridge))
    report("raw bodies", bridge)


async def test_fuzz_envelopes(app_client: AppClient) -> None:
    """Random JSON values as the whole body, and near-valid envelopes and batches."""
    bridge = Bridge(app_client)
    envelope = st.fixed_dictionaries(
        {},
        optional={
            "jsonrpc": st.one_of(st.just("2.0"), SCALARS),
            "id": IDS | SCALARS,
            "method": st.one_of(st.sampled_from(METHODS), SCALARS),
            "params": JSON_VALUES,
        },
    )
    bodies = st.one_of(
        JSON_VALUES,
        envelope,
        st.lists(st.one_of(envelope, JSON_VALUES), min_size=0, max_size=6),
        st.lists(
            st.just({"jsonrpc": "2.0", "method": "cstp.listGuardrails"}), min_size=1, max_size=3
        ),  # notifications only: 204
        st.integers(min_value=51, max_value=60).map(
            lambda n: [
                {"jsonrpc": "2.0", "id": i, "method": "cstp.listGuardrails"} for i in range(n)
            ]
        ),
    )

    @hyp_settings(FUZZ, max_examples=500)
    @given(body=bodies, ascii_only=st.booleans())
    def run(body: Any, ascii_only: bool) -> None:
        bridge.send(encode(body, ascii_only))

    await in_thread(run)
    await in_thread(lambda: still_serving(bridge))
    report("envelopes", bridge)


async def test_fuzz_methods_and_params(app_client: AppClient) -> None:
    """Valid envelopes with random method names, and random params for real methods."""
    bridge = Bridge(app_client)
    names = st.one_of(
        st.text(max_size=40),
        st.sampled_from(METHODS),
        st.sampled_from(METHODS).map(str.upper),
        st.sampled_from(METHODS).map(lambda m: m + " "),
        st.sampled_from(
            [
                "rpc.discover",
                "cstp.",
                "cstp",
                "__init__",
                "cstp.__class__",
                "cstp.recordDecision\x00",
                "x" * 300,
            ]
        ),
    )
    params = st.one_of(JSON_VALUES, st.dictionaries(st.text(max_size=15), JSON_VALUES, max_size=6))

    @hyp_settings(FUZZ, max_examples=500)
    @given(method=names, params=params, rid=IDS, with_params=st.booleans())
    def run(method: str, params: Any, rid: Any, with_params: bool) -> None:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if with_params:
            body["params"] = params
        bridge.send(encode(body))

    await in_thread(run)
    await in_thread(lambda: still_serving(bridge))
    report("methods and params", bridge)


async def test_fuzz_mutated_params_of_every_method(app_client: AppClient) -> None:
    """Valid params of each real method with one or two fields broken: wrong types, nulls,
    huge strings, negative and huge numbers, lists for objects, deletions, extra keys."""
    bridge = Bridge(app_client)
    target = await asyncio.to_thread(known_decision, bridge)
    valid = valid_params(target)

    @st.composite
    def mutated(draw: st.DrawFn) -> tuple[str, Any]:
        method = draw(st.sampled_from(METHODS))
        params: Any = valid[method]
        for _ in range(draw(st.integers(min_value=1, max_value=2))):
            spots = paths(params)
            if not spots:
                break
            spot = draw(st.sampled_from(spots))
            original = params
            for step in spot:
                original = original[step]
            bad = draw(st.one_of(same_kind_extreme(original), BAD_VALUES))
            params = mutate(params, spot, bad, delete=draw(st.integers(0, 5)) == 0)
        if draw(st.integers(0, 4)) == 0:
            params = dict(
                params,
                **draw(
                    st.dictionaries(
                        st.one_of(
                            st.text(max_size=12),
                            st.sampled_from(
                                [
                                    "decision_id",
                                    "project_context",
                                    "kpi_indicators",
                                    "review_in",
                                    "pre_decision",
                                    "include_reasons",
                                    "actual_result",
                                    "mental_state",
                                ]
                            ),
                        ),
                        BAD_VALUES,
                        max_size=2,
                    )
                ),
            )
        if draw(st.integers(0, 15)) == 0:
            params = draw(st.sampled_from([[params], None, "params", 1, [], True]))
        return method, params

    @hyp_settings(FUZZ, max_examples=1500)
    @given(call=mutated())
    def run(call: tuple[str, Any]) -> None:
        method, params = call
        bridge.send(encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))

    await in_thread(run)
    await in_thread(lambda: still_serving(bridge))
    report("mutated params", bridge)


async def test_fuzz_authorization_headers(app_client: AppClient) -> None:
    """Anything but a known bearer token is HTTP 401 with a JSON body, before the body is read."""
    bridge = Bridge(app_client)
    body = encode({"jsonrpc": "2.0", "id": 1, "method": "cstp.listGuardrails"})
    headers = st.one_of(
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
        st.sampled_from(
            [
                "Bearer",
                "Bearer ",
                "bearer token-alice",
                "Bearer  token-alice",
                "Bearer token-alice ",
                "Basic dG9rZW4tYWxpY2U=",
                "token-alice",
                "Bearer token-alicE",
                "Bearer token-alic",
                "Bearer token-alice,x",
                "BEARER token-bob",
                "Bearer token-bob  ",
            ]
        ),
    )

    @hyp_settings(FUZZ, max_examples=150)
    @given(header=headers)
    def run(header: str) -> None:
        response = bridge.post(body, {"Authorization": header, "Content-Type": "application/json"})
        # RFC 7235: the scheme is case-insensitive (an HTTP server would also strip the
        # value's surrounding whitespace; the in-process transport passes it as sent)
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip() in ("token-alice", "token-bob"):
            assert response.status_code == 200, (header, response.text)
            return
        assert response.status_code == 401, (header, response.status_code, response.text)
        assert response.headers.get("www-authenticate", "").startswith("Bearer"), header
        assert isinstance(response.json(), dict)
        assert not _leaks(response.json(), header)

    await in_thread(run)
    missing = await app_client.post("/cstp", content=body)
    assert missing.status_code == 401
    await in_thread(lambda: still_serving(bridge))


# ---------------------------------------------------------------- the known bugs, pinned


async def _call(client: AppClient, body: bytes) -> tuple[int, Any]:
    response = await asyncio.wait_for(
        client.post("/cstp", content=body, headers=AUTH), REQUEST_TIMEOUT
    )
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def _rpc(method: str, params: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})


async def test_deeply_nested_json_is_a_jsonrpc_error_not_a_crash(app_client: AppClient) -> None:
    bodies = [
        nested(1000).encode(),
        nested(30_000).encode(),  # 60 KB: under the body cap
        (
            '{"jsonrpc":"2.0","id":1,"method":"cstp.getDecision","params":{"x":'
            + nested(700)
            + "}}"
        ).encode(),
        (
            '{"jsonrpc":"2.0","id":1,"method":"cstp.announceIntent","params":{"intent":"x",'
            '"metadata":{"k":' + nested(5000) + "}}}"
        ).encode(),
    ]
    answers = [await _call(app_client, body) for body in bodies]
    for status, answer in answers:
        assert status == 200, answers
        errors = answer if isinstance(answer, list) else [answer]
        assert all(e["error"]["code"] in (-32700, -32600, -32602) for e in errors), answers


async def test_out_of_range_integers_are_invalid_params(app_client: AppClient) -> None:
    base = {"decision": "Out of range", "confidence": 0.5, "category": "process"}
    cases = [
        ("cstp.listDecisions", {"offset": 2**64}, "offset"),
        ("cstp.recordDecision", dict(base, pr=2**63), "pr"),
        ("cstp.recordDecision", dict(base, line=2**70), "line"),
        (
            "cstp.recordDecision",
            dict(base, preDecision={"similarFound": 2**63}),
            "preDecision.similarFound",
        ),
        ("cstp.queryDecisions", {"query": "x", "filters": {"pr": 2**63}}, "filters.pr"),
    ]
    answers = [(m, (await _call(app_client, _rpc(m, p)))[1]) for m, p, _f in cases]
    for (_method, _p, field), (_m, answer) in zip(cases, answers, strict=True):
        error = answer.get("error", {})
        assert error.get("code") == -32602 and error["data"]["field"] == field, answers


async def test_timestamps_past_the_calendar_are_invalid_params(app_client: AppClient) -> None:
    early, late = "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00"
    cases = [
        ("cstp.queryDecisions", {"query": "x", "filters": {"dateAfter": early}}),
        ("cstp.queryDecisions", {"query": "x", "filters": {"dateBefore": late}}),
        ("cstp.listDecisions", {"dateTo": late}),
        ("cstp.getCalibration", {"filters": {"since": early}}),
    ]
    answers = [(await _call(app_client, _rpc(m, p)))[1] for m, p in cases]
    assert all(a.get("error", {}).get("code") == -32602 for a in answers), answers


async def test_nul_characters_are_refused_naming_the_field_on_both_databases(
    app_client: AppClient,
) -> None:
    """Postgres text cannot hold NUL: a NUL in a param the server reads is -32602 on both
    databases, and nothing is stored; one in a param it does not know is ignored (SPEC 2)."""
    base = {"decision": "NUL test", "confidence": 0.5, "category": "process"}
    cases = [
        ("cstp.recordDecision", dict(base, decision="a\x00b"), "decision"),
        ("cstp.recordDecision", dict(base, tags=["a\x00b"]), "tags[0]"),
        ("cstp.announceIntent", {"intent": "a\x00b"}, "intent"),
        ("cstp.checkGuardrails", {"action": {"description": "a\x00b"}}, "action.description"),
        ("cstp.listDecisions", {"search": "a\x00b"}, "search"),
    ]
    for method, params, field in cases:
        status, answer = await _call(app_client, _rpc(method, params))
        assert status == 200 and isinstance(answer, dict), (method, status, answer)
        assert answer["error"]["code"] == -32602, (method, answer)
        assert answer["error"]["data"]["field"] == field, (method, answer)
    status, listed = await _call(app_client, _rpc("cstp.listDecisions", {}))
    assert listed["result"]["total"] == 0
    status, answer = await _call(
        app_client, _rpc("cstp.recordDecision", dict(base, clientNote="ignored\x00here"))
    )
    assert status == 200 and answer["result"]["success"] is True, answer
