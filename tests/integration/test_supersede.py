"""Supersede links (SPEC.md, section 9): recordDecision ``supersedes``; a superseded decision
shows ``supersededBy``, leaves announceIntent's similar decisions and suggestions, and leaves
queryDecisions and listDecisions unless ``includeSuperseded``; the link is a chained audit
row, and ``cstp audit verify`` holds the decision's copy to it. On SQLite and Postgres."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from app.db import migrate
from app.scopes import Principal
from app.search.reindex import reindex
from app.search.repository import reindex as reindex_rows
from support.app import Rpc, add_token
from support.databases import USE_PG, run_sql

pytestmark = pytest.mark.usefixtures("commands_share_the_model")

MODES = ("semantic", "keyword", "hybrid")


async def cstp(url: str, *args: str) -> Result:
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def record(rpc: Rpc, text: str, **more: Any) -> str:
    params = {"decision": text, "confidence": 0.7, "category": "architecture", **more}
    return str((await rpc.ok("cstp.recordDecision", params))["id"])


async def decision(rpc: Rpc, decision_id: str) -> dict[str, Any]:
    return dict((await rpc.ok("cstp.getDecision", {"id": decision_id}))["decision"])


async def found(rpc: Rpc, query: str, mode: str, limit: int = 10, **more: Any) -> list[str]:
    params = {"query": query, "limit": limit, "retrievalMode": mode, **more}
    result = await rpc.ok("cstp.queryDecisions", params)
    return [d["id"] for d in result["decisions"]]


OLD = "Cache the catalogue pages in Redis with a one hour expiry"
NEW = "Stop caching catalogue pages; render them on demand from the read replica"


async def test_a_superseded_decision_leaves_searches_and_lists_unless_asked_for(
    rpc: Rpc, services: Any
) -> None:
    old = await record(rpc, OLD, context="The catalogue is slow under load", tags=["cache"])
    other = await record(rpc, "Keep the catalogue search on Postgres full-text search")
    await rpc.ok(
        "cstp.reviewDecision",
        {"id": old, "outcome": "failure", "lessons": "Stale prices were shown for an hour"},
    )
    started = services.runtime.now()
    new = await record(rpc, NEW, supersedes=[old])

    got_old, got_new = await decision(rpc, old), await decision(rpc, new)
    assert got_old["supersededBy"] == new and got_old["supersedes"] == []
    assert got_new["supersededBy"] is None and got_new["supersedes"] == [old]

    # announceIntent, for the superseded decision's own text: never among the similar
    # decisions, nor in the suggestions (its failure is no longer advice)
    announced = await rpc.ok(
        "cstp.announceIntent", {"intent": OLD, "context": "The catalogue is slow under load"}
    )
    similar = [d["id"] for d in announced["similarDecisions"]]
    assert old not in similar and new in similar
    assert not any(OLD[:40] in s for s in announced["suggestions"])
    in_category = await rpc.ok("cstp.announceIntent", {"intent": OLD, "category": "architecture"})
    assert old not in [d["id"] for d in in_category["similarDecisions"]]

    # queryDecisions, in every mode: left out, unless includeSuperseded
    for mode in MODES:
        assert old not in await found(rpc, OLD, mode), mode
        assert old in await found(rpc, OLD, mode, includeSuperseded=True), mode
        filtered = {"filters": {"category": "architecture", "tags": ["cache"]}}
        assert await found(rpc, OLD, mode, **filtered) == [], mode
        assert await found(rpc, OLD, mode, includeSuperseded=True, **filtered) == [old]
    shown = await rpc.ok(
        "cstp.queryDecisions", {"query": OLD, "includeSuperseded": True, "limit": 10}
    )
    flagged = {d["id"]: d.get("supersededBy") for d in shown["decisions"]}
    assert flagged[old] == new and flagged[new] is None  # the key only on a superseded one

    # listDecisions: left out of the page and the total, unless includeSuperseded
    listed = await rpc.ok("cstp.listDecisions", {})
    assert {d["id"] for d in listed["decisions"]} == {new, other} and listed["total"] == 2
    everything = await rpc.ok("cstp.listDecisions", {"includeSuperseded": True})
    assert everything["total"] == 3
    items = {d["id"]: d for d in everything["decisions"]}
    assert items[old]["supersededBy"] == new and "supersededBy" not in items[new]

    # the index entry was re-indexed through the outbox with the flag searches leave out
    metadata = await services.index.get_metadata([old, new], workspace="default")
    assert metadata[old].get("superseded") is True and "superseded" not in metadata[new]
    # and a reindex keeps it; one running while the link was made copies the entry again
    async with services.db.transaction(write=False) as session:
        touched = reindex_rows.touched_since("default", started)
        assert await reindex_rows.ids_after(session, None, touched, 10) == sorted([old, new])
    assert await reindex(services) == 3
    metadata = await services.index.get_metadata([old], workspace="default")
    assert metadata[old].get("superseded") is True
    assert old not in await found(rpc, OLD, "semantic")


async def test_a_page_stays_full_when_the_nearest_decisions_are_superseded(rpc: Rpc) -> None:
    """Twelve superseded decisions nearer the query than any other: more than a probe's
    overfetch, so the search must look further, not answer a short page."""
    stale = [await record(rpc, f"{OLD}, variant {n}") for n in range(12)]
    new = await record(rpc, NEW, supersedes=stale)
    kept = await record(rpc, "Put a CDN in front of the catalogue images")
    for mode in ("semantic", "hybrid"):
        ids = await found(rpc, OLD, mode, limit=2)
        assert sorted(ids) == sorted([new, kept]), mode
        assert len(await found(rpc, OLD, mode, limit=2, includeSuperseded=True)) == 2
    announced = await rpc.ok("cstp.announceIntent", {"intent": OLD})
    assert {d["id"] for d in announced["similarDecisions"]} == {new, kept}


async def test_supersedes_names_decisions_of_the_callers_workspace_only(
    rpc: Rpc, client: Any
) -> None:
    mine = await record(rpc, "Use a queue for the mailer")
    theirs_rpc = Rpc(client, add_token(client, "token-w2", "carol", "agent", workspace="w2"))
    theirs = await record(theirs_rpc, "Use a queue for the mailer, in w2")

    for ids, who in (([theirs], theirs), ([mine, "0badc0de"], "0badc0de")):
        error = await rpc.error(
            "cstp.recordDecision",
            {"decision": "x y z", "confidence": 0.5, "category": "process", "supersedes": ids},
        )
        assert error["code"] == -32007 and error["data"] == {"id": who}, error
    error = await theirs_rpc.error(
        "cstp.recordDecision",
        {"decision": "x y z", "confidence": 0.5, "category": "process", "supersedes": [mine]},
    )
    assert error["code"] == -32007 and error["data"] == {"id": mine}
    for bad in ([mine, mine], ["nothex!!"], [mine] * 21):
        error = await rpc.error(
            "cstp.recordDecision",
            {"decision": "x y z", "confidence": 0.5, "category": "process", "supersedes": bad},
        )
        assert error["code"] == -32602 and "supersedes" in str(error.get("data")), error
    assert (await rpc.ok("cstp.listDecisions", {}))["total"] == 1  # nothing else recorded
    assert (await decision(rpc, mine))["supersededBy"] is None

    # another agent's decision: superseding it, like reviewing it, needs review:any
    params = {"decision": "Use a stream instead", "confidence": 0.6, "category": "process"}
    refused = await rpc.error("cstp.recordDecision", {**params, "supersedes": [mine]}, "token-bob")
    assert refused["code"] == -32010 and refused["data"] == {"scope": "review:any"}
    assert (await decision(rpc, mine))["supersededBy"] is None
    lead = Principal("lead", scopes=frozenset({"read", "record", "review:any"}))
    client.app.state.tokens.add("token-lead", lead)
    replaced = await rpc.ok("cstp.recordDecision", {**params, "supersedes": [mine]}, "token-lead")
    assert (await decision(rpc, mine))["supersededBy"] == replaced["id"]


async def test_the_newest_supersedes_and_verify_holds_the_copy_to_the_links(
    rpc: Rpc, database_url: str
) -> None:
    old = await record(rpc, "Deploy on Fridays with a canary")
    first = await record(rpc, "Deploy Monday to Thursday only", supersedes=[old])
    second = await record(rpc, "Deploy any day behind a feature flag", supersedes=[old, first])
    assert (await decision(rpc, old))["supersededBy"] == second
    assert (await decision(rpc, first))["supersededBy"] == second
    # concurrent calls superseding one decision: the row shows the latest link, whatever
    # batch or order they were written in (verify checks that below)
    racers = await asyncio.gather(
        *(record(rpc, f"Deploy policy, take {n}", supersedes=[second]) for n in range(6))
    )
    assert (await decision(rpc, second))["supersededBy"] in racers

    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 0, verified.output

    # superseded_by is not frozen (a link sets it), but verify holds it to the chained links
    await run_sql(
        database_url, f"UPDATE decisions SET superseded_by = '{first}' WHERE id = '{old}'"
    )
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 1
    (line,) = [x for x in verified.output.splitlines() if ": supersede: " in x]
    assert f"decisions {old}: supersede: superseded_by is '{first}', not '{second}'" in line
    await run_sql(
        database_url, f"UPDATE decisions SET superseded_by = '{second}' WHERE id = '{old}'"
    )
    assert (await cstp(database_url, "audit", "verify")).exit_code == 0

    # a link deleted (by whoever took the append-only trigger away) is named twice: the
    # superseding decision's digest no longer holds, and the copy has no link left
    drop = (
        "DROP TRIGGER trg_decision_supersedes_append_only ON decision_supersedes"
        if USE_PG
        else "DROP TRIGGER trg_decision_supersedes_no_delete"
    )
    await run_sql(database_url, drop)
    await run_sql(database_url, f"DELETE FROM decision_supersedes WHERE decision_id = '{first}'")
    verified = await cstp(database_url, "audit", "verify")
    assert verified.exit_code == 1
    assert f"decisions {first}: changed" in verified.output
    lines = [x for x in verified.output.splitlines() if ": supersede: " in x]
    assert len(lines) == 0  # old's latest link (second's) is still there: its copy holds
    await run_sql(database_url, f"DELETE FROM decision_supersedes WHERE superseded_id = '{first}'")
    verified = await cstp(database_url, "audit", "verify")
    assert f"decisions {first}: supersede: superseded_by is '{second}', yet no" in verified.output
    assert f"decisions {second}: changed" in verified.output


async def test_links_are_append_only_and_the_downgrade_keeps_them(
    rpc: Rpc, database_url: str
) -> None:
    old = await record(rpc, "Use tabs")
    await record(rpc, "Use spaces", supersedes=[old])
    for statement in (
        "UPDATE decision_supersedes SET position = 3",
        "DELETE FROM decision_supersedes",
        f"UPDATE decisions SET decision = 'Use both' WHERE id = '{old}'",  # still frozen
    ):
        with pytest.raises(Exception, match="append-only"):
            await run_sql(database_url, statement)
    head = await migrate.current(database_url)
    with pytest.raises(RuntimeError, match="below revision 0019: supersede links are stored"):
        await migrate.downgrade(database_url, "0018")
    assert await migrate.current(database_url) == head  # the refused downgrade changed nothing
