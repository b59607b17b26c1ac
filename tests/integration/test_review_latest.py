"""Which review of a decision is its latest, and that everything shows that one: the decision
row (getDecision's ``outcome`` …), the end of getDecision's ``reviews``, the YAML file, the
index entry and ``cstp audit verify``. The latest is the review made last, the one with the
greatest id, whatever the clocks said: a clock set back between two reviews, a late outbox
pass holding an older row, concurrent reviews through two server processes on Postgres, and a
file that diverged from its row, which ``cstp export`` repairs.

The tests that set the clock run without the background relay: a clock moved past the
leases of earlier events would let it deliver those at any moment, and what it delivers is
settled only when its pass ends, which no test can wait for."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from app.asgi import create_app
from app.audit import snapshot
from app.audit.verify import verify
from app.cli import main
from app.config import Settings
from app.outbox.events import Event
from app.outbox.handlers import run_events
from app.records.repository import load_decisions
from app.runtime import Runtime, iso
from app.search.embedder import Embedder
from support.app import SEED_DECISION, Rpc, serve_app
from support.databases import USE_PG
from support.processes import cstp_servers

T0 = datetime(2026, 5, 4, 10, 30, 0, tzinfo=UTC)
JUST_AFTER = timedelta(microseconds=1)
CSTP = Path(sys.executable).with_name("cstp")


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def file_of(settings: Settings, path: str) -> Path:
    return Path(settings.decisions_dir) / path.removeprefix("decisions/")


def yaml_of(settings: Settings, path: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(file_of(settings, path).read_text(encoding="utf-8"))
    return data


def shown(decision: dict[str, Any]) -> tuple[Any, ...]:
    """The review a getDecision answer's row shows."""
    return (decision["outcome"], decision["reviewNotes"], decision["reviewedAt"])


def last_of_history(decision: dict[str, Any]) -> tuple[Any, ...]:
    last = decision["reviews"][-1]
    return (last["outcome"], last["notes"], last["reviewedAt"])


def in_file(data: dict[str, Any]) -> tuple[Any, ...]:
    """The review a YAML file shows, its time as the wire writes it."""
    at = data.get("reviewed_at")
    return (
        data.get("outcome"),
        data.get("review_notes"),
        iso(at) if isinstance(at, datetime) else at,
    )


async def review_problems(settings: Settings) -> list[str]:
    report = await snapshot.read(settings.database_url, lambda conn: verify(conn, None))
    return [p.line() for p in report.problems]


# ---- one definition of the latest, on both databases ---------------------------------------


async def test_a_clock_set_back_between_two_reviews_leaves_the_second_the_latest(
    settings: Settings, embedder: Embedder
) -> None:
    """A review made after another is the latest even when the clock read an earlier time
    for it (a clock stepped back, or another server process's clock behind this one's); its
    time is then the microsecond after the first one's, so the times keep the reviews' order."""
    clock = Clock(T0)
    app = create_app(
        replace(settings, relay_enabled=False), runtime=Runtime(now=clock), embedder=embedder
    )
    async with serve_app(app) as client:
        rpc = Rpc(client)
        recorded = await rpc.ok("cstp.recordDecision", SEED_DECISION)
        clock.now = T0 + timedelta(days=2)
        await rpc.ok(
            "cstp.reviewDecision", {"id": recorded["id"], "outcome": "success", "notes": "first"}
        )
        clock.now = T0 + timedelta(days=1)  # set back
        second = await rpc.ok(
            "cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure", "notes": "second"}
        )
        assert second["reviewedAt"] == iso(T0 + timedelta(days=2) + JUST_AFTER)
        decision = (await rpc.ok("cstp.getDecision", {"id": recorded["id"]}))["decision"]
        expected = ("failure", "second", second["reviewedAt"])
        assert [h["notes"] for h in decision["reviews"]] == ["first", "second"]  # as made
        assert shown(decision) == last_of_history(decision) == expected
        assert in_file(yaml_of(settings, recorded["path"])) == expected
        metadata = await app.state.services.index.get_metadata(
            [recorded["id"]], workspace="default"
        )
        assert metadata[recorded["id"]]["outcome"] == "failure"
    assert await review_problems(settings) == []


async def test_a_late_pass_holding_an_older_row_leaves_the_latest_file_and_entry(
    settings: Settings, embedder: Embedder
) -> None:
    """An outbox pass that read the row before a review was committed (a retry of the first
    review's events, say) delivers after the second review's own pass: the file and the index
    entry end with the latest review all the same."""
    clock = Clock(T0)
    app = create_app(
        replace(settings, relay_enabled=False), runtime=Runtime(now=clock), embedder=embedder
    )
    services = app.state.services
    async with serve_app(app) as client:
        rpc = Rpc(client)
        recorded = await rpc.ok("cstp.recordDecision", SEED_DECISION)
        clock.now = T0 + timedelta(days=2)
        await rpc.ok(
            "cstp.reviewDecision", {"id": recorded["id"], "outcome": "success", "notes": "first"}
        )
        async with services.db.transaction(write=False) as session:
            older = (await load_decisions(session, [recorded["id"]]))[recorded["id"]]
        clock.now = T0 + timedelta(days=1)
        await rpc.ok(
            "cstp.reviewDecision", {"id": recorded["id"], "outcome": "failure", "notes": "second"}
        )
        events = [
            Event.of(-1, "export", recorded["id"], 1, 0),
            Event.of(-2, "index", recorded["id"], 1, 0),
        ]
        # the fault: a pass that delivers the row as it was before the second review
        results = await run_events(services.relay, events, {recorded["id"]: older})
        assert results == {-1: None, -2: None}
        assert in_file(yaml_of(settings, recorded["path"])) == (
            "failure",
            "second",
            iso(T0 + timedelta(days=2) + JUST_AFTER),
        )
        metadata = await services.index.get_metadata([recorded["id"]], workspace="default")
        assert metadata[recorded["id"]]["outcome"] == "failure"


@pytest.mark.usefixtures("commands_share_the_model")
async def test_cstp_export_repairs_files_that_diverged_from_their_rows(
    settings: Settings, embedder: Embedder
) -> None:
    """A file that shows another review than its row (left by an older server, or edited by
    hand), later than the row's or on a decision never reviewed, is written again from the
    row by ``cstp export``."""
    clock = Clock(T0)
    app = create_app(
        replace(settings, relay_enabled=False), runtime=Runtime(now=clock), embedder=embedder
    )
    async with serve_app(app) as client:
        rpc = Rpc(client)
        reviewed = await rpc.ok("cstp.recordDecision", SEED_DECISION)
        pending = await rpc.ok(
            "cstp.recordDecision", {**SEED_DECISION, "decision": "Use SQLite for agent memory"}
        )
        clock.now = T0 + timedelta(days=1)
        await rpc.ok(
            "cstp.reviewDecision", {"id": reviewed["id"], "outcome": "success", "notes": "kept"}
        )
    rows = {r["id"]: file_of(settings, r["path"]) for r in (reviewed, pending)}
    good = {decision_id: path.read_bytes() for decision_id, path in rows.items()}
    diverged = {
        reviewed["id"]: {
            "outcome": "failure",
            "notes": "not the row's",
            "reviewed_at": iso(T0 + timedelta(days=30)),  # later than the row's
        },
        pending["id"]: {
            "status": "reviewed",
            "outcome": "partial",
            "reviewed_at": iso(T0 + timedelta(days=30)),
            "reviewed_by": "bob",
        },
    }
    for decision_id, changes in diverged.items():
        data = yaml.safe_load(good[decision_id])
        data.update(changes)
        rows[decision_id].write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    env = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    result = await asyncio.to_thread(CliRunner().invoke, main, ["export"], env=env)
    assert result.exit_code == 0, result.output
    assert {decision_id: path.read_bytes() for decision_id, path in rows.items()} == good


# ---- concurrent reviews through two server processes on one Postgres database ---------------


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """Two ``cstp serve`` processes on the test's Postgres database writing one YAML tree
    (each with its own embedded index); their URLs and the tree."""
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    tree = tmp_path / "decisions"
    settings = [
        {
            "CSTP_DATABASE_URL": database_url,
            "CSTP_AUTH_TOKENS": "alice:token-alice,bob:token-bob",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_DATA_DIR": str(tmp_path / f"data{n}"),
            "CSTP_DECISIONS_DIR": str(tree),
            "CSTP_LOG_LEVEL": "WARNING",
        }
        for n in range(2)
    ]
    with cstp_servers(tmp_path, settings) as bases:
        yield bases, tree


ROUNDS = 20
REVIEWS = 12
OUTCOMES = ("success", "partial", "failure", "abandoned")


@pytest.mark.slow
async def test_concurrent_reviews_through_two_processes_show_the_latest(
    two_servers: tuple[list[str], Path],
) -> None:
    bases, tree = two_servers

    async def call(
        client: httpx.AsyncClient, base: str, method: str, params: Any, token: str = "token-alice"
    ) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = await client.post(
            f"{base}/cstp", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        assert "result" in answer.json(), answer.json()
        return answer.json()["result"]

    disagreements = []
    async with httpx.AsyncClient(timeout=60) as client:
        for r in range(ROUNDS):
            recorded = await call(
                client, bases[r % 2], "cstp.recordDecision", {**SEED_DECISION, "tags": [f"r{r}"]}
            )
            await asyncio.gather(
                *(
                    call(
                        client,
                        bases[k % 2],
                        "cstp.reviewDecision",
                        {
                            "id": recorded["id"],
                            "outcome": OUTCOMES[k % 4],
                            "notes": f"round {r} review {k}",
                        },
                        # the recorder's own token (an agent reviews its own decisions); the
                        # notes tell the reviews apart
                        token="token-alice",
                    )
                    for k in range(REVIEWS)
                )
            )
            answers = [
                (await call(client, base, "cstp.getDecision", {"id": recorded["id"]}))["decision"]
                for base in bases
            ]
            data = yaml.safe_load(
                (tree / recorded["path"].removeprefix("decisions/")).read_text(encoding="utf-8")
            )
            seen = {
                "row": shown(answers[0]),
                "history": last_of_history(answers[0]),
                "other server's row": shown(answers[1]),
                "YAML file": in_file(data),
            }
            assert len(answers[0]["reviews"]) == REVIEWS
            if len(set(seen.values())) != 1:
                disagreements.append((r, seen))
    assert disagreements == [], f"{len(disagreements)} of {ROUNDS} rounds disagree: {disagreements}"
