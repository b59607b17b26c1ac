"""The audit chain end to end, on SQLite and Postgres: a chain of a few hundred entries built
through the API (record, review, announce, checkGuardrails), verified clean, then tampered
with by someone who dropped the append-only triggers, and caught by ``cstp audit verify``,
which names the entry; checkpoints catch a cut tail; with a key, a chain recomputed without
it is caught; the migration chains rows stored before it; two server processes on one
Postgres database keep one valid chain."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.asgi import create_app
from app.audit import canonical, stored
from app.audit.chain import GENESIS, entry_hash
from app.audit.checkpoints import checkpoint_mac
from app.cli import main
from app.config import Settings, parse_rate_limits
from app.db import migrate
from app.search.embedder import Embedder
from support.app import TOKENS, Rpc, add_token, serve_app
from support.databases import USE_PG, copy_database, run_sql
from support.processes import cstp_servers

# The commands these tests run in this process use the session's model (conftest).
pytestmark = pytest.mark.usefixtures("commands_share_the_model")

ROOT = Path(__file__).resolve().parents[2]
CSTP = Path(sys.executable).with_name("cstp")
KEY = "audit-key-for-the-tests-0123456789"
AUDIT_TABLES = (
    "intents",
    "intent_matches",
    "guardrail_evaluations",
    "guardrail_rule_results",
    "decisions",
    "decision_reasons",
    "decision_tags",
    "decision_reviews",
    "audit_chain",
    "guardrail_rule_sets",
)
LINE = re.compile(
    r"^(?P<after>after )?seq (?P<seq>\d+|-)(?:\.\.(?P<last>\d+))?"
    r"(?: (?P<table>[a-z_]+) (?P<row>\S+))?: (?P<kind>[a-z-]+): "
)


# ---- helpers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    kind: str
    seq: int | None
    table: str | None
    row_id: str | None
    last: int | None


def problems(output: str) -> list[Found]:
    found = []
    for line in output.splitlines():
        m = LINE.match(line)
        if m:
            found.append(
                Found(
                    m["kind"],
                    None if m["seq"] == "-" else int(m["seq"]),
                    m["table"],
                    m["row"],
                    int(m["last"]) if m["last"] else None,
                )
            )
    return found


def env_of(url: str, key: str | None = KEY) -> dict[str, str | None]:
    return {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": key, "CSTP_AUDIT_KEY_FILE": None}


async def cstp(url: str, *args: str, key: str | None = KEY) -> Result:
    """``cstp ARGS`` in this process (a thread: the command runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env_of(url, key))


async def verify(url: str, *args: str, key: str | None = KEY) -> tuple[int, list[Found], str]:
    result = await cstp(url, "audit", "verify", *args, key=key)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, problems(result.stdout), result.output


@asynccontextmanager
async def connection(url: str) -> AsyncIterator[AsyncConnection]:
    """One transaction on a connection of its own, as a tamperer would open it."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            yield conn
    finally:
        await engine.dispose()


async def drop_triggers(url: str) -> None:
    """What a database owner can do: take the append-only triggers away."""
    async with connection(url) as conn:
        for table in AUDIT_TABLES:
            if url.startswith("sqlite"):
                for verb in ("update", "delete", "replace"):
                    await conn.execute(text(f"DROP TRIGGER IF EXISTS trg_{table}_no_{verb}"))
            else:
                await conn.execute(
                    text(f"DROP TRIGGER IF EXISTS trg_{table}_append_only ON {table}")
                )


async def seq_of(url: str, table: str, row_id: Any) -> int:
    rows = await run_sql(
        url,
        "SELECT seq FROM audit_chain WHERE table_name = :t AND row_id = :r",
        t=table,
        r=str(row_id),
    )
    assert len(rows) == 1, (table, row_id, rows)
    return int(rows[0]["seq"])


async def review_problem(url: str, review_id: int) -> Found:
    """What deleting this review also shows: its decision, reviewed once, keeps an outcome
    no review gave."""
    (row,) = await run_sql(
        url, "SELECT decision_id FROM decision_reviews WHERE id = :i", i=review_id
    )
    decision = str(row["decision_id"])
    return Found("review", await seq_of(url, "decisions", decision), "decisions", decision, None)


async def coverage(url: str) -> tuple[int, int]:
    """(entries, audited rows): equal when every row has its entry."""
    entries = (await run_sql(url, "SELECT COUNT(*) AS n FROM audit_chain"))[0]["n"]
    rows = 0
    for table in canonical.AUDITED:
        rows += (await run_sql(url, f"SELECT COUNT(*) AS n FROM {table}"))[0]["n"]
    return int(entries), rows


def settings_for(url: str, folder: Path, key: str | None = KEY, **more: Any) -> Settings:
    return Settings(
        data_dir=folder / "data",
        database_url=url,
        decisions_dir=folder / "decisions",
        auth_tokens=TOKENS,
        rate_limits=parse_rate_limits("default=100000/1"),
        outbox_poll_seconds=0.2,
        audit_key=key.encode() if key else None,
        **more,
    )


def decision(n: int, **more: Any) -> dict[str, Any]:
    return {
        "decision": f"Decision number {n}: use a queue for job {n}",
        "confidence": [0.3, 0.85, 1, 0.5][n % 4],  # 1: a whole number in a float column
        "category": "architecture",
        "stakes": ["low", "medium", "high", "critical"][n % 4],
        "reasons": [
            {"type": "analysis", "text": f"reason {n}", "strength": 0.9},
            {"type": "pattern", "text": "seen before", "strength": -0.0 + 0.5},
        ],
        "tags": [f"t{n % 3}", "queue", f"t{n % 3}"],
        "kpiIndicators": ["latency"],
        **more,
    }


# ---- a chain of a few hundred entries, built once per module ------------------------------------


@dataclass
class Golden:
    url: str  # the built database (copied by each test)
    source: str  # what copy_database copies: a Postgres database name or a SQLite path
    intent_ids: list[str]
    review_ids: list[int]
    late_checks: list[str]  # evaluation ids of checkGuardrails calls made one at a time
    last_three: list[str]  # the evaluations of the last three calls


async def build_chain(rpc: Rpc, reviewer: str) -> dict[str, list[Any]]:
    """``reviewer``: a token of role reviewer (bob's), which reviews alice's decisions."""
    late: list[str] = []
    for n in range(20):
        await rpc.ok("cstp.checkGuardrails", {"action": {"description": f"early check {n}"}})
    recorded = [(await rpc.ok("cstp.recordDecision", decision(n)))["id"] for n in range(30)]
    together = await asyncio.gather(
        *(rpc.ok("cstp.recordDecision", decision(100 + n)) for n in range(20))
    )  # the group writer commits these in groups: one INSERT of entries per group
    recorded += [r["id"] for r in together]
    for n in range(30):
        params: dict[str, Any] = {
            "intent": f"Decision number {n}: move job {n} to a queue",
            "stakes": "high" if n % 3 else "critical",
            "confidence": 0.3 if n % 5 == 0 else 0.8,
            "metadata": {"affects_production": n % 2 == 0, "weight": 1.5, "n": n},
        }
        if n % 2:
            params["correlationId"] = f"corr-{n}"
        await rpc.ok("cstp.announceIntent", params)
        if n % 2:
            await rpc.ok("cstp.recordDecision", decision(200 + n, correlationId=f"corr-{n}"))
    for bad in ("not-a-stake", "very"):  # failed announcements: an intents row each
        await rpc.error("cstp.announceIntent", {"intent": "x", "stakes": bad})
    outcomes = ["success", "failure", "partial", "abandoned"]
    for n, decision_id in enumerate(recorded[:40]):
        await rpc.ok(
            "cstp.reviewDecision",
            {
                "id": decision_id,
                "outcome": outcomes[n % 4],
                "lessons": f"lesson {n}",
                "affectedKpis": {"latency": n, "ratio": 0.25},
            },
            token=reviewer if n % 2 else None,
        )
    for decision_id in recorded[:5]:  # reviewed twice
        await rpc.ok("cstp.reviewDecision", {"id": decision_id, "outcome": "success"})
    for n in range(20):
        answer = await rpc.ok(
            "cstp.checkGuardrails",
            {"action": {"description": f"late check {n}", "stakes": "high", "confidence": 0.2}},
        )
        late.append(answer["evaluationId"])
    last = []
    for n in range(3):
        answer = await rpc.ok("cstp.checkGuardrails", {"action": {"description": f"last {n}"}})
        last.append(answer["evaluationId"])
    return {"late": late, "last": last}


@pytest.fixture(scope="module")
async def golden(
    template_db: str, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Golden]:
    folder = tmp_path_factory.mktemp("golden")
    async with copy_database(template_db, folder) as url:
        app = create_app(settings_for(url, folder), embedder=embedder)
        async with serve_app(app) as http:
            reviewer = add_token(http, "token-bob-reviewer", "bob", "reviewer")
            made = await build_chain(Rpc(http), reviewer)
        intents = await run_sql(url, "SELECT id FROM intents WHERE outcome = 'ok' ORDER BY id")
        reviews = await run_sql(url, "SELECT id FROM decision_reviews ORDER BY id")
        source = url.rsplit("/", 1)[1] if USE_PG else url.split("///", 1)[1]
        yield Golden(
            url,
            source,
            [r["id"] for r in intents],
            [int(r["id"]) for r in reviews],
            made["late"],
            made["last"],
        )


@pytest.fixture
async def chain(golden: Golden, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh copy of the golden chain's database, to tamper with."""
    async with copy_database(golden.source, tmp_path) as url:
        yield url


# ---- untouched chains ---------------------------------------------------------------------------


async def test_an_untouched_chain_of_a_few_hundred_entries_verifies_clean(
    golden: Golden, chain: str
) -> None:
    entries, rows = await coverage(chain)
    assert entries == rows >= 250
    code, found, output = await verify(chain)
    assert (code, found) == (0, []), output
    assert f"entries 1..{entries} checked (HMAC-SHA256" in output
    # every entry is keyed and links to the one before it
    chained = await run_sql(
        chain, "SELECT seq, prev_hash, hash, keyed FROM audit_chain ORDER BY seq"
    )
    assert [r["seq"] for r in chained] == list(range(1, entries + 1))
    assert chained[0]["prev_hash"] == GENESIS
    assert all(bool(r["keyed"]) for r in chained)
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(chained))
    # from a sequence number on
    code, found, output = await verify(chain, "--from", str(entries - 10))
    assert (code, found) == (0, []), output
    assert f"entries {entries - 10}..{entries} checked" in output


async def test_without_the_key_a_keyed_chain_cannot_be_verified(chain: str) -> None:
    code, found, output = await verify(chain, key=None)
    assert code == 1, output
    assert [(f.kind, f.seq) for f in found] == [("hash", 1)]
    assert "verify with the audit key set" in output


# ---- (a) to (d): tampering, with the triggers dropped -------------------------------------------


async def test_a_changed_byte_in_an_intent_is_named_by_its_entry(
    golden: Golden, chain: str
) -> None:
    intent_id = golden.intent_ids[len(golden.intent_ids) // 2]
    (row,) = await run_sql(chain, "SELECT intent FROM intents WHERE id = :i", i=intent_id)
    original: str = row["intent"]
    changed = ("E" if original[0] != "E" else "F") + original[1:]
    await drop_triggers(chain)
    await run_sql(chain, "UPDATE intents SET intent = :t WHERE id = :i", t=changed, i=intent_id)
    code, found, output = await verify(chain)
    assert code == 1, output
    assert found == [
        Found("changed", await seq_of(chain, "intents", intent_id), "intents", intent_id, None)
    ]


async def test_a_deleted_review_in_the_middle_is_named_by_its_entry(
    golden: Golden, chain: str
) -> None:
    review_id = golden.review_ids[len(golden.review_ids) // 2]
    expected = await seq_of(chain, "decision_reviews", review_id)
    also = await review_problem(chain, review_id)
    await drop_triggers(chain)
    await run_sql(chain, "DELETE FROM decision_reviews WHERE id = :i", i=review_id)
    code, found, output = await verify(chain)
    assert code == 1, output
    assert found == [also, Found("deleted", expected, "decision_reviews", str(review_id), None)]
    assert "set, yet it has no review" in output


async def test_an_inserted_forged_evaluation_is_found_where_it_would_have_been_chained(
    golden: Golden, chain: str
) -> None:
    """A copy of a real evaluation, allowed this time, stored a microsecond after it: no
    entry covers it, and verify places it right after the entry of the one it copies."""
    original = golden.late_checks[10]
    expected = await seq_of(chain, "guardrail_evaluations", original)
    forged = str(uuid.uuid4())
    (row,) = await run_sql(chain, "SELECT * FROM guardrail_evaluations WHERE id = :i", i=original)
    replaced = {"id": ":forged", "allowed": ":allowed", "violations": "0", "evaluated_at": ":at"}
    copy = ", ".join(replaced.get(c, c) for c in row)
    await drop_triggers(chain)
    await run_sql(
        chain,
        f"INSERT INTO guardrail_evaluations ({', '.join(row)}) SELECT {copy} "
        "FROM guardrail_evaluations WHERE id = :original",
        forged=forged,
        allowed=True,
        at=_plus_a_microsecond(row["evaluated_at"]),
        original=original,
    )
    code, found, output = await verify(chain)
    assert code == 1, output
    assert found == [Found("inserted", expected, "guardrail_evaluations", forged, None)]
    assert f"after seq {expected} guardrail_evaluations {forged}: inserted" in output


async def test_a_cut_tail_is_caught_only_with_a_checkpoint_taken_before(
    golden: Golden, chain: str, tmp_path: Path
) -> None:
    point = tmp_path / "checkpoint.json"
    taken = await cstp(chain, "audit", "checkpoint", "--out", str(point))
    assert taken.exit_code == 0, taken.output
    entries, _ = await coverage(chain)
    assert f'"seq": {entries}' in point.read_text()
    await drop_triggers(chain)
    async with connection(chain) as conn:  # the last three calls, rows and entries
        for evaluation_id in golden.last_three:
            await conn.execute(
                text("DELETE FROM guardrail_rule_results WHERE evaluation_id = :i"),
                {"i": evaluation_id},
            )
            await conn.execute(
                text("DELETE FROM guardrail_evaluations WHERE id = :i"), {"i": evaluation_id}
            )
        await conn.execute(text("DELETE FROM audit_chain WHERE seq > :s"), {"s": entries - 3})
    code, found, output = await verify(chain)
    assert (code, found) == (0, []), output  # a consistent shorter chain: nothing to see
    code, found, output = await verify(chain, "--checkpoint", str(point))
    assert code == 1, output
    assert found == [Found("truncated", entries - 2, None, None, entries)]
    assert f"the chain ends at seq {entries - 3}" in output


async def test_a_checkpoint_catches_a_rewritten_chain_and_an_edited_checkpoint(
    golden: Golden, chain: str, tmp_path: Path
) -> None:
    point = tmp_path / "checkpoint.json"
    assert (await cstp(chain, "audit", "checkpoint", "--out", str(point))).exit_code == 0
    code, found, output = await verify(chain, "--checkpoint", str(point))
    assert (code, found) == (0, []), output
    edited = tmp_path / "edited.json"
    edited.write_text(point.read_text().replace('"seq": ', '"seq": 1', 1))
    code, found, output = await verify(chain, "--checkpoint", str(edited))
    assert code == 1 and [f.kind for f in found] == ["checkpoint"], output
    assert "MAC does not hold" in output


# ---- values in a form the server never stores (app.audit.stored) -------------------------------

NOT_STORED = "a value is not in the form the server stores"


async def _a_row_of(url: str, sql: str) -> Any:
    rows = await run_sql(url, sql)
    assert rows, sql
    return rows[0]["id"]


# (table whose entry covers the row, SQL picking the changed row's id, the change, which
# audited row it belongs to). Read through the column types, each new value would pass for
# the old one; SQL sees another value.
SQLITE_ONLY_FORMS = {
    # a time zone suffix: the same instant for a parser, out of every range of stored times
    "timestamp with an offset": (
        "intents",
        "SELECT id FROM intents WHERE outcome = 'ok' ORDER BY id LIMIT 1",
        "UPDATE intents SET received_at = received_at || '+23:59' WHERE id = :i",
    ),
    # 2 is true for bool(), not for WHERE fired = 1
    "boolean 2": (
        "guardrail_evaluations",
        "SELECT evaluation_id AS id FROM guardrail_rule_results WHERE fired = 1 LIMIT 1",
        "UPDATE guardrail_rule_results SET fired = 2 WHERE evaluation_id = :i AND fired = 1",
    ),
    # an Arabic-Indic digit: int() reads 2, SQL compares text
    "digit of another script": (
        "intents",
        "SELECT intent_id AS id FROM intent_matches WHERE rank = 2 LIMIT 1",
        "UPDATE intent_matches SET rank = '\u0662' WHERE intent_id = :i AND rank = 2",
    ),
    # int() truncates a real: 0.5 reads as 0
    "real in a whole-number column": (
        "guardrail_evaluations",
        "SELECT id FROM guardrail_evaluations WHERE violations = 0 LIMIT 1",
        "UPDATE guardrail_evaluations SET violations = 0.5 WHERE id = :i",
    ),
}
BOTH_FORMS = {
    # a repeated member: Python keeps the last (the original), SQLite's json_extract the first
    "JSON with a repeated member": (
        "intents",
        "SELECT id FROM intents WHERE metadata IS NOT NULL AND outcome = 'ok' LIMIT 1",
        "UPDATE intents SET metadata = CAST('{\"n\": -1, ' || "
        "substr(CAST(metadata AS TEXT), 2) AS {json}) WHERE id = :i",
    ),
}


@pytest.mark.parametrize(
    "form", [*BOTH_FORMS, *(() if USE_PG else SQLITE_ONLY_FORMS)], ids=lambda f: f.replace(" ", "-")
)
async def test_a_value_in_a_form_the_server_never_writes_is_a_changed_row(
    chain: str, form: str
) -> None:
    table, pick, change = {**SQLITE_ONLY_FORMS, **BOTH_FORMS}[form]
    row_id = await _a_row_of(chain, pick)
    await drop_triggers(chain)
    await run_sql(chain, change.replace("{json}", "json" if USE_PG else "TEXT"), i=row_id)
    code, found, output = await verify(chain)
    assert code == 1, output
    assert found == [Found("changed", await seq_of(chain, table, row_id), table, str(row_id), None)]
    assert NOT_STORED in output


@pytest.mark.skipif(USE_PG, reason="Postgres refuses text in a float column")
async def test_an_unreadable_value_is_named_and_the_other_problems_still_reported(
    golden: Golden, chain: str
) -> None:
    """A value no parser takes (text in a float column) is one changed row among the rest,
    not a failure of the whole verification."""
    intent_id = await _a_row_of(
        chain, "SELECT intent_id AS id FROM intent_matches ORDER BY intent_id LIMIT 1"
    )
    review_id = golden.review_ids[len(golden.review_ids) // 2]
    also = await review_problem(chain, review_id)
    await drop_triggers(chain)
    await run_sql(
        chain, "UPDATE intent_matches SET distance = 'abc' WHERE intent_id = :i", i=intent_id
    )
    await run_sql(chain, "DELETE FROM decision_reviews WHERE id = :i", i=review_id)
    code, found, output = await verify(chain)
    assert code == 1, output
    assert sorted(found, key=lambda f: f.seq or 0) == sorted(
        [
            Found("changed", await seq_of(chain, "intents", intent_id), "intents", intent_id, None),
            Found(
                "deleted",
                await seq_of(chain, "decision_reviews", review_id),
                "decision_reviews",
                str(review_id),
                None,
            ),
            also,
        ],
        key=lambda f: f.seq or 0,
    )
    assert "intent_matches.distance: not a floating-point number" in output


@pytest.mark.skipif(USE_PG, reason="Postgres refuses text that is not JSON in a json column")
async def test_an_evaluation_that_cannot_be_read_cannot_be_replayed(
    golden: Golden, chain: str
) -> None:
    evaluation = golden.late_checks[5]
    before = await cstp(chain, "guardrails", "replay", evaluation)
    assert before.exit_code == 0 and "same verdict" in before.output, before.output
    await drop_triggers(chain)
    await run_sql(
        chain, "UPDATE guardrail_evaluations SET facts = '{bad' WHERE id = :i", i=evaluation
    )
    result = await cstp(chain, "guardrails", "replay", evaluation)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output  # 2: cannot replay
    assert "cannot be read" in lines[0] and "cstp audit verify" in lines[0]


@pytest.mark.skipif(USE_PG, reason="Postgres keeps seq a bigint")
@pytest.mark.parametrize("forged_seq", ["'abc'", "2.5"])
async def test_an_entry_whose_seq_is_not_a_whole_number_is_named_and_the_rest_checked(
    golden: Golden, chain: str, forged_seq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text sorts after every number in SQLite, a real among them: either way the entries
    after it are still read (in batches of two here) and a problem further on still found."""
    monkeypatch.setattr("app.audit.verify.BATCH", 2)
    review_id = golden.review_ids[len(golden.review_ids) // 2]
    deleted = await seq_of(chain, "decision_reviews", review_id)
    await drop_triggers(chain)
    await run_sql(chain, f"UPDATE audit_chain SET seq = {forged_seq} WHERE seq = 3")
    await run_sql(chain, "DELETE FROM decision_reviews WHERE id = :i", i=review_id)
    code, found, output = await verify(chain)
    assert code == 1, output
    kinds = {(f.kind, f.seq) for f in found}
    assert ("missing", 3) in kinds and ("deleted", deleted) in kinds, output
    assert ("hash", None) in kinds and "is not a whole number" in output, output
    entries, _ = await coverage(chain)
    assert f"entries 1..{entries} checked" in output


async def test_from_a_sequence_number_checks_that_the_entry_before_it_is_there(
    golden: Golden, chain: str
) -> None:
    review_id = golden.review_ids[len(golden.review_ids) // 2]
    seq = await seq_of(chain, "decision_reviews", review_id)
    also = await review_problem(chain, review_id)
    entries, _ = await coverage(chain)
    await drop_triggers(chain)
    await run_sql(chain, "DELETE FROM decision_reviews WHERE id = :i", i=review_id)
    await run_sql(chain, "DELETE FROM audit_chain WHERE seq = :s", s=seq)
    code, found, output = await verify(chain, "--from", str(seq + 1))
    assert code == 1, output
    assert found == [also, Found("missing", seq, None, None, None)], output
    # beyond the end: what was verified up to there is gone
    code, found, output = await verify(chain, "--from", str(entries + 5))
    assert code == 1, output
    assert found == [also, Found("missing", entries + 1, None, None, entries + 4)], output


async def test_with_the_key_set_a_checkpoint_taken_without_it_is_refused(
    chain: str, tmp_path: Path
) -> None:
    """Without the key a checkpoint's MAC is a plain SHA-256: anyone can write one, e.g. one
    naming an earlier head to hide a cut tail."""
    entries, _ = await coverage(chain)
    (head,) = await run_sql(chain, "SELECT hash FROM audit_chain WHERE seq = :s", s=entries - 3)
    body = {
        "format": "cstp-audit-checkpoint/1",
        "seq": entries - 3,
        "hash": head["hash"],
        "time": "2026-12-03T08:00:00.000000Z",
        "keyed": False,
    }
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({**body, "mac": checkpoint_mac(None, body)}))
    code, found, output = await verify(chain, "--checkpoint", str(forged))
    assert code == 1, output
    assert [(f.kind, f.seq) for f in found] == [("checkpoint", entries - 3)]
    assert "taken without the audit key" in output
    assert (await verify(chain, "--checkpoint", str(forged), key=None))[0] == 1  # keyed chain


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"format": "cstp-audit-checkpoint/1", "seq": 1e400}', "seq is not a whole number"),
        (b"\xff\xfe not text", "not UTF-8 text"),
        (
            b'{"format": "cstp-audit-checkpoint/1", "seq": 3, "hash": "\\u00e9", "time": "",'
            b' "keyed": true, "mac": "00"}',
            "hash is not 64 hexadecimal digits",
        ),
    ],
)
async def test_a_checkpoint_file_that_is_not_one_is_one_line_naming_it(
    chain: str, tmp_path: Path, content: bytes, fragment: str
) -> None:
    point = tmp_path / "point.json"
    point.write_bytes(content)
    result = await cstp(chain, "audit", "verify", "--checkpoint", str(point))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert str(point) in lines[0] and fragment in lines[0]


# ---- (e) a key: recomputing without it is caught ------------------------------------------------


async def recompute(url: str, start: int, *, keyed: bool) -> None:
    """A tamperer's rewrite of the chain from entry ``start`` on, with plain SHA-256: fresh
    digests of the rows as they are now, and links and hashes that all agree."""
    async with connection(url) as conn:
        entries = (
            (await conn.execute(text("SELECT * FROM audit_chain ORDER BY seq"))).mappings().all()
        )
        prev = GENESIS if start == 1 else entries[start - 2]["hash"]
        for e in entries[start - 1 :]:
            audited = canonical.AUDITED[e["table_name"]]
            digests = await conn.run_sync(
                lambda c, a=audited, r=e["row_id"]: stored.digests(c, a, [r])
            )
            digest = digests[e["row_id"]]
            hashed = entry_hash(None, e["seq"], e["table_name"], e["row_id"], digest, prev)
            await conn.execute(
                text(
                    "UPDATE audit_chain SET digest = :d, prev_hash = :p, hash = :h, keyed = :k "
                    "WHERE seq = :s"
                ),
                {"d": digest, "p": prev, "h": hashed, "k": keyed, "s": e["seq"]},
            )
            prev = hashed


async def test_with_a_key_a_chain_recomputed_without_it_is_caught(
    golden: Golden, chain: str
) -> None:
    intent_id = golden.intent_ids[3]
    changed_at = await seq_of(chain, "intents", intent_id)
    await drop_triggers(chain)
    await run_sql(chain, "UPDATE intents SET allowed = NOT allowed WHERE id = :i", i=intent_id)
    await recompute(chain, changed_at, keyed=True)  # still claims to be keyed
    code, found, output = await verify(chain)
    assert code == 1, output
    entries, _ = await coverage(chain)
    assert found == [Found("hash", changed_at, None, None, entries)]
    assert "not the HMAC of its content under the audit key" in output
    # the whole chain rewritten, and marked unkeyed: caught from the first entry
    await recompute(chain, 1, keyed=False)
    code, found, output = await verify(chain)
    assert code == 1 and found == [Found("hash", 1, None, None, entries)], output


async def test_without_a_key_only_a_checkpoint_catches_a_recomputed_chain(
    rpc: Rpc, database_url: str, tmp_path: Path
) -> None:
    """What a plain SHA-256 chain does not protect against: whoever can write the database
    can recompute it. A checkpoint kept elsewhere still shows the rewrite."""
    for n in range(5):
        await rpc.ok("cstp.checkGuardrails", {"action": {"description": f"check {n}"}})
        await rpc.ok("cstp.recordDecision", decision(n))
    point = tmp_path / "checkpoint.json"
    assert (
        await cstp(database_url, "audit", "checkpoint", "--out", str(point), key=None)
    ).exit_code == 0
    code, found, output = await verify(database_url, key=None)
    assert (code, found) == (0, []), output
    assert "(SHA-256, no key)" in output
    (row,) = await run_sql(database_url, "SELECT id FROM decisions ORDER BY created_at LIMIT 1")
    await drop_triggers(database_url)
    await run_sql(
        database_url, "UPDATE decisions SET decision = 'edited' WHERE id = :i", i=row["id"]
    )
    code, found, output = await verify(database_url, key=None)
    assert code == 1 and [f.kind for f in found] == ["changed"], output
    await recompute(database_url, 1, keyed=False)
    code, found, output = await verify(database_url, key=None)
    assert (code, found) == (0, []), output
    code, found, output = await verify(database_url, "--checkpoint", str(point), key=None)
    assert code == 1 and [f.kind for f in found] == ["checkpoint"], output
    assert "the chain was rewritten" in output


# ---- what the chain covers and what it does not -------------------------------------------------


async def test_review_columns_of_a_decision_are_not_covered_its_reasons_and_tags_are(
    rpc: Rpc, database_url: str
) -> None:
    recorded = await rpc.ok("cstp.recordDecision", decision(1))
    await rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure"})
    await rpc.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"})
    code, found, output = await verify(database_url, key=None)
    assert (code, found) == (0, []), output  # the decision row changed, its entry still holds
    expected = await seq_of(database_url, "decisions", recorded["id"])
    await drop_triggers(database_url)
    await run_sql(
        database_url,
        "UPDATE decision_tags SET tag = 'edited' WHERE decision_id = :i AND tag = 'queue'",
        i=recorded["id"],
    )
    code, found, output = await verify(database_url, key=None)
    assert code == 1, output
    assert found == [Found("changed", expected, "decisions", recorded["id"], None)]


async def test_a_row_moved_to_another_workspace_is_caught_wherever_it_is_moved(
    rpc: Rpc, database_url: str
) -> None:
    """A row's workspace is in its digest; an entry's and a child row's are checked against
    their row's (row-level security reads them)."""
    recorded = await rpc.ok("cstp.recordDecision", decision(1))
    expected = await seq_of(database_url, "decisions", recorded["id"])
    await drop_triggers(database_url)
    await run_sql(
        database_url,
        "UPDATE decision_reasons SET workspace = 'elsewhere' WHERE decision_id = :i",
        i=recorded["id"],
    )
    await run_sql(
        database_url,
        "UPDATE audit_chain SET workspace = 'elsewhere' WHERE seq = :s",
        s=expected,
    )
    code, found, output = await verify(database_url, key=None)
    assert code == 1, output
    assert found == [Found("workspace", expected, "decisions", recorded["id"], None)] * 2, output
    assert "the entry says workspace 'elsewhere', the row is in 'default'" in output
    assert "a row of decision_reasons is in workspace 'elsewhere'" in output
    move = "UPDATE decisions SET workspace = 'elsewhere' WHERE id = :i"
    with pytest.raises(DBAPIError, match="workspace never changes"):
        await run_sql(database_url, move, i=recorded["id"])
    on = "" if database_url.startswith("sqlite") else " ON decisions"
    await run_sql(database_url, f"DROP TRIGGER trg_decisions_workspace_frozen{on}")
    await run_sql(database_url, move, i=recorded["id"])
    code, found, output = await verify(database_url, key=None)
    assert Found("changed", expected, "decisions", recorded["id"], None) in found, output


async def test_a_replaced_chain_entry_is_refused_on_sqlite(rpc: Rpc, database_url: str) -> None:
    """REPLACE with a new seq but the same covered row would delete the entry through the
    unique (table_name, row_id) index."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's REPLACE")
    await rpc.ok("cstp.checkGuardrails", {"action": {"description": "x"}})
    with pytest.raises(DBAPIError, match="append-only"):
        await run_sql(
            database_url,
            "REPLACE INTO audit_chain (seq, table_name, row_id, digest, prev_hash, hash, keyed) "
            "SELECT 99, table_name, row_id, digest, prev_hash, hash, keyed FROM audit_chain",
        )


async def test_a_decisions_review_columns_must_copy_its_latest_review(
    golden: Golden, chain: str
) -> None:
    """The chain leaves a decision's review columns out (every review updates them, and the
    triggers let it), but each review is chained: an outcome forged in place, which
    getCalibration would count, is found by comparing the copy with its review."""
    (reviewed,) = await run_sql(
        chain,
        "SELECT decision_id FROM decision_reviews r WHERE outcome = 'failure' AND id = "
        "(SELECT MAX(id) FROM decision_reviews WHERE decision_id = r.decision_id) "
        "ORDER BY id LIMIT 1",
    )
    decision = str(reviewed["decision_id"])
    (pending,) = await run_sql(
        chain, "SELECT id FROM decisions WHERE status = 'pending' ORDER BY id LIMIT 1"
    )
    await run_sql(chain, "UPDATE decisions SET outcome = 'success' WHERE id = :i", i=decision)
    await run_sql(
        chain,
        "UPDATE decisions SET status = 'reviewed', outcome = 'success' WHERE id = :i",
        i=pending["id"],
    )
    code, found, output = await verify(chain)
    assert code == 1, output
    assert sorted(found, key=lambda f: f.seq or 0) == sorted(
        [
            Found("review", await seq_of(chain, "decisions", d), "decisions", d, None)
            for d in (decision, str(pending["id"]))
        ],
        key=lambda f: f.seq or 0,
    )
    assert "outcome not those of its latest review (decision_reviews" in output
    assert "status, outcome set, yet it has no review" in output


async def test_imported_decisions_and_their_reviews_are_chained(
    settings: Settings, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    for i in range(12):
        path = journal / "2025" / f"2025-03-{i + 1:02d}-decision-{i:05d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {
            "id": f"legacy-{i}",
            "decision": f"Adopt tool {i}",
            "category": "tooling",
            "confidence": 0.75,
            "date": f"2025-03-{i + 1:02d}T10:00:00Z",
            "tags": [f"t{i % 3}"],
        }
        if i % 3 == 0:  # a reviewed decision: its review is a history row of its own
            data.update(outcome="partial", lessons="Needed a migration window")
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {
        **env_of(settings.database_url),
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    imported = await asyncio.to_thread(CliRunner().invoke, main, ["import", str(journal)], env=env)
    assert imported.exit_code == 0, imported.output
    entries, rows = await coverage(settings.database_url)
    assert entries == rows == 12 + 4
    code, found, output = await verify(settings.database_url)
    assert (code, found) == (0, []), output


# ---- the migration chains what was stored before it ---------------------------------------------


async def test_the_migration_chains_existing_rows_in_their_order_of_creation(
    golden: Golden, chain: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = await run_sql(chain, "SELECT table_name, row_id FROM audit_chain ORDER BY seq")
    await migrate.downgrade(chain, "0008")
    tables = await run_sql(chain, "SELECT * FROM guardrail_evaluations LIMIT 1")
    assert "rule_set_hash" not in tables[0]
    monkeypatch.setenv("CSTP_AUDIT_KEY", KEY)
    await migrate.upgrade(chain)
    assert await migrate.drift(chain) == []
    code, found, output = await verify(chain)
    assert (code, found) == (0, []), output
    after = await run_sql(chain, "SELECT table_name, row_id FROM audit_chain ORDER BY seq")
    assert sorted(map(tuple, (r.values() for r in after))) == sorted(
        map(tuple, (r.values() for r in before))
    )
    # in order of creation: each entry's row is no newer than the next one's
    times = []
    async with connection(chain) as conn:  # one connection for the few hundred reads
        for r in after:
            audited = canonical.AUDITED[r["table_name"]]
            (row,) = (
                await conn.execute(
                    text(
                        f"SELECT {audited.time} AS t FROM {r['table_name']} "
                        f"WHERE {audited.key} = :k"
                    ),
                    {
                        "k": int(r["row_id"])
                        if r["table_name"] == "decision_reviews"
                        else r["row_id"]
                    },
                )
            ).mappings()
            times.append(_as_text(row["t"]))
    assert times == sorted(times)
    # rows stored before the rule sets were kept cannot be replayed
    result = await cstp(chain, "guardrails", "replay", golden.late_checks[0])
    assert result.exit_code == 2, result.output
    assert "stored before rule sets were kept" in result.output


# ---- two server processes on one Postgres database ----------------------------------------------


@pytest.fixture
def servers(database_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two ``cstp serve`` processes on the test's Postgres database (embedded index each)."""
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    settings = [
        {
            "CSTP_DATABASE_URL": database_url,
            "CSTP_AUDIT_KEY": KEY,
            "CSTP_AUTH_TOKENS": "alice:token-alice,bob:token-bob",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_DATA_DIR": str(tmp_path / f"data{n}"),
            "CSTP_DECISIONS_DIR": str(tmp_path / f"decisions{n}"),
            "CSTP_LOG_LEVEL": "WARNING",
        }
        for n in range(2)
    ]
    with cstp_servers(tmp_path, settings) as bases:
        yield bases


@pytest.mark.slow
async def test_two_server_processes_keep_one_valid_chain(
    servers: list[str], database_url: str
) -> None:
    async def call(client: httpx.AsyncClient, base: str, method: str, params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = await client.post(
            f"{base}/cstp", json=body, headers={"Authorization": "Bearer token-alice"}
        )
        assert answer.status_code == 200, answer.text
        assert "result" in answer.json(), answer.json()
        return answer.json()["result"]

    async def worker(client: httpx.AsyncClient, w: int) -> None:
        for n in range(10):
            here, there = servers[(w + n) % 2], servers[(w + n + 1) % 2]
            cid = f"w{w}-{n}"
            await call(
                client, here, "cstp.announceIntent", {"intent": f"job {cid}", "correlationId": cid}
            )
            recorded = await call(
                client, there, "cstp.recordDecision", decision(n, correlationId=cid)
            )
            await call(
                client, here, "cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"}
            )
            await call(client, there, "cstp.checkGuardrails", {"action": {"description": cid}})

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client, w) for w in range(8)))
    entries, rows = await coverage(database_url)
    assert (
        entries == rows == 8 * 10 * 6
    )  # evaluation + intent, evaluation + decision, review, evaluation
    code, found, output = await verify(database_url)
    assert (code, found) == (0, []), output


# ---- the walkthrough's SQL in docs/AUDIT.md runs on both databases ------------------------------


def walkthrough_queries() -> dict[str, str]:
    doc = (ROOT / "docs" / "AUDIT.md").read_text(encoding="utf-8")
    section = doc.split("## The hash chain", 1)[1].split("\n## ", 1)[0]
    queries = {}
    for part in re.split(r"^#### ", section, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        block = re.search(r"^```sql\n(.*?)^```", body, flags=re.M | re.S)
        if block:
            queries[heading.strip()] = block.group(1)
    return queries


async def test_the_walkthrough_queries_run(golden: Golden, chain: str) -> None:
    queries = walkthrough_queries()
    assert len(queries) == 4, queries
    params = {
        "seq": await seq_of(chain, "intents", golden.intent_ids[0]),
        "table_name": "intents",
        "row_id": golden.intent_ids[0],
    }
    for heading, sql in queries.items():
        names = set(re.findall(r"(?<!:):([A-Za-z_]\w*)", sql))
        rows = await run_sql(chain, sql, **{n: params[n] for n in names})
        if "no entry covers" in heading:
            assert rows == [], heading  # an untouched database
        else:
            assert rows, heading


# ---- small helpers ------------------------------------------------------------------------------


def _plus_a_microsecond(stored: Any) -> Any:
    if isinstance(stored, str):  # SQLite: naive UTC text
        return (datetime.fromisoformat(stored) + timedelta(microseconds=1)).isoformat(sep=" ")
    return stored + timedelta(microseconds=1)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return canonical.iso_utc(value)
