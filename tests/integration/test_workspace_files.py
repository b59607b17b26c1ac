"""Another workspace's decision files, import, export and index: each in its own place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.asgi import create_app
from app.config import Settings
from app.decisions.bulk import export_all
from app.decisions.importer import import_tree
from app.search.index import collection_name
from app.search.reindex import reindex
from support.app import add_token, serve_app
from support.databases import run_sql


def _file(root: Path, name: str, **fields: Any) -> Path:
    data = {
        "decision": "Adopt blue-green deploys for the billing service",
        "category": "architecture",
        "confidence": 0.7,
        "date": "2026-03-04T05:06:07Z",
        **fields,
    }
    path = root / "2026" / "03" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


async def _rpc(client: Any, token: str, method: str, params: dict[str, Any]) -> Any:
    answer = await client.post(
        "/cstp",
        headers={"Authorization": f"Bearer {token}"},
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
    )
    return answer.json()


async def test_a_workspace_imports_exports_and_indexes_its_own_files(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    _file(journal, "legacy.yaml", id="legacy-1")
    _file(journal, "named.yaml", id="legacy-2", workspace="team-b")
    _file(journal, "other.yaml", id="legacy-3", workspace="team-c")
    _file(journal, "bad.yaml", id="legacy-4", workspace="Not A Workspace!")
    app = create_app(settings, embedder=embedder)
    services = app.state.services
    report = await import_tree(services, journal, workspace="team-b")
    assert report.new == 2
    assert sorted(report.failed) == [
        ("2026/03/bad.yaml", "workspace: not a workspace id"),
        ("2026/03/other.yaml", "belongs to workspace team-c: import it with --workspace team-c"),
    ]
    # the same legacy id in default is another decision (derived ids include the workspace)
    _file(tmp_path / "default", "legacy.yaml", id="legacy-1")
    into_default = await import_tree(services, tmp_path / "default")
    assert (into_default.new, into_default.failed) == (1, [])
    assert (await services.relay.drain()).failed == 0
    rows = await run_sql(settings.database_url, "SELECT id, workspace FROM decisions")
    by_workspace = sorted(r["workspace"] for r in rows)
    assert by_workspace == ["default", "team-b", "team-b"]
    for table in ("decision_reasons", "decision_tags", "outbox_events", "audit_chain"):
        stray = await run_sql(
            settings.database_url,
            f"SELECT COUNT(*) AS n FROM {table} t WHERE t.workspace NOT IN ('default', 'team-b')",
        )
        assert stray[0]["n"] == 0, table
    team_ids = {r["id"] for r in rows if r["workspace"] == "team-b"}

    # an id another workspace holds is refused, not counted as already there
    taken = next(iter(team_ids))
    _file(tmp_path / "taken", "taken.yaml", id=taken)
    refused = await import_tree(services, tmp_path / "taken")
    assert refused.new == 0 and refused.existing == 0
    assert refused.failed == [
        ("2026/03/taken.yaml", "its id is taken by a decision of another workspace")
    ]

    # the outbox wrote the files in the workspace's folder, carrying its name
    files = sorted(
        p.relative_to(settings.decisions_dir) for p in settings.decisions_dir.rglob("*.yaml")
    )
    team_files = [p for p in files if p.parts[0] == "team-b"]
    assert len(team_files) == 2 and all(p.parts[1:3] == ("2026", "03") for p in team_files)
    assert all(
        yaml.safe_load((settings.decisions_dir / p).read_text())["workspace"] == "team-b"
        for p in team_files
    )
    default_files = [p for p in files if p.parts[0] != "team-b"]
    assert len(default_files) == 1
    assert "workspace" not in yaml.safe_load(
        (settings.decisions_dir / default_files[0]).read_text()
    )

    # export of one workspace writes its files again, byte for byte
    before = {p: (settings.decisions_dir / p).read_bytes() for p in team_files}
    for p in team_files:
        (settings.decisions_dir / p).unlink()
    exported = await export_all(services, workspace="team-b")
    assert exported == 2
    assert {p: (settings.decisions_dir / p).read_bytes() for p in team_files} == before
    # and the exported tree imports into its workspace again (idempotent), not into default
    again = await import_tree(services, settings.decisions_dir / "team-b", workspace="team-b")
    assert (again.new, again.existing, again.failed) == (0, 2, [])

    # each workspace's index entries are in its own collection, before and after a reindex
    index = services.index
    assert await index.count("team-b") == 2 and await index.count("default") == 1
    assert collection_name("decisions", "team-b") == "decisions-ws-team-b"
    assert await reindex(services) == 3
    assert await index.count("team-b") == 2 and await index.count("default") == 1
    async with serve_app(app) as client:
        token = add_token(client, "token-team-b", "alice", "agent", workspace="team-b")
        found = await _rpc(
            client, token, "cstp.queryDecisions", {"query": "blue green deploys billing"}
        )
        assert {d["id"] for d in found["result"]["decisions"]} == team_ids
        mine = await _rpc(client, "token-alice", "cstp.queryDecisions", {"query": "blue green"})
        assert {d["id"] for d in mine["result"]["decisions"]}.isdisjoint(team_ids)


async def test_reindex_never_drops_a_workspace_collection_named_like_a_leftover(
    settings: Settings, embedder: Any, tmp_path: Path, caplog: Any
) -> None:
    """Workspace ``q-retired-1``'s collection starts like what a killed reindex of ``q``
    leaves behind (``decisions-ws-q-retired-…``): it is a live collection, kept."""
    app = create_app(settings, embedder=embedder)
    services = app.state.services
    for n, workspace in enumerate(("q", "q-retired-1")):
        _file(tmp_path / workspace, f"{n}.yaml", id=f"legacy-{n}")
        report = await import_tree(services, tmp_path / workspace, workspace=workspace)
        assert (report.new, report.failed) == (1, [])
    assert (await services.relay.drain()).failed == 0
    with caplog.at_level("WARNING", logger="cstp.reindex"):
        assert await reindex(services) == 2
    assert "dropped" not in caplog.text
    assert await services.index.count("q") == 1
    assert await services.index.count("q-retired-1") == 1
