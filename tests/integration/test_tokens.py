"""Tokens kept in the database (SPEC.md, section 7): ``cstp tokens create|list|revoke``, the
server letting a created token in with its role's (or its own) scopes, refusing it with 401
within 2 seconds of its revocation and once it expires, on /cstp and /mcp; the secret
nowhere in the database; the grants in the audit chain, and tampering with them or with a
token's row caught by ``cstp audit verify`` (and refused by the server)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from app.access.lookup import TokenLookup, TokenStoreUnavailable
from app.cli import main
from app.db.engine import Database
from app.runtime import utc_now
from support.app import AppClient, Rpc
from support.databases import USE_PG, run_sql
from support.processes import cstp_servers
from support.waiting import poll_until

CREATED_KEYS = {"id", "token", "workspace", "agent", "role", "scopes", "expiresAt"}
LISTED_KEYS = {
    "id",
    "workspace",
    "agent",
    "role",
    "scopes",
    "status",
    "createdAt",
    "createdBy",
    "expiresAt",
    "revokedAt",
}
DECISION = {
    "decision": "Use a queue for the mail jobs",
    "confidence": 0.8,
    "category": "architecture",
    "stakes": "low",
}
MCP_HEADERS = {"Host": "127.0.0.1:9991", "Accept": "application/json, text/event-stream"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
AUDIT_DOC = Path(__file__).resolve().parents[2] / "docs" / "AUDIT.md"


# ---- helpers ------------------------------------------------------------------------------------


async def cstp(url: str, *args: str, folder: Path | None = None) -> Result:
    """``cstp ARGS`` in this process (a thread: the command runs its own event loop), on
    the test's database, without an audit key (as the test app)."""
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    if folder is not None:
        env["CSTP_DATA_DIR"] = str(folder / "cli-data")
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def create(url: str, *args: str) -> dict[str, Any]:
    result = await cstp(url, "tokens", "create", *args, "--json")
    assert result.exit_code == 0, result.output
    created: dict[str, Any] = json.loads(result.stdout)
    return created


async def listed(url: str, *args: str) -> list[dict[str, Any]]:
    result = await cstp(url, "tokens", "list", "--json", *args)
    assert result.exit_code == 0, result.output
    tokens: list[dict[str, Any]] = json.loads(result.stdout)
    return tokens


async def revoke(url: str, token_id: str) -> Result:
    return await cstp(url, "tokens", "revoke", token_id)


async def status_of(client: AppClient, secret: str) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": "cstp.listDecisions", "params": {}}
    response = await client.post("/cstp", json=body, headers={"Authorization": f"Bearer {secret}"})
    return response.status_code


async def mcp_status(client: AppClient, secret: str) -> int:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {secret}"}
    return (await client.post("/mcp", json=LIST_TOOLS, headers=headers)).status_code


async def verify(url: str) -> tuple[int, str]:
    result = await cstp(url, "audit", "verify")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout


async def tamper(url: str, *statements: str) -> None:
    """As a database owner can: the triggers that refuse the change dropped first."""
    drops = (
        [
            "DROP TRIGGER IF EXISTS trg_api_tokens_no_update",
            "DROP TRIGGER IF EXISTS trg_api_token_grants_no_update",
        ]
        if url.startswith("sqlite")
        else [
            "DROP TRIGGER IF EXISTS trg_api_tokens_revoke_only ON api_tokens",
            "DROP TRIGGER IF EXISTS trg_api_token_grants_append_only ON api_token_grants",
        ]
    )
    for statement in (*drops, *statements):
        await run_sql(url, statement)


# ---- the commands -------------------------------------------------------------------------------


async def test_create_shows_the_secret_once_and_list_never(database_url: str) -> None:
    made = await create(database_url, "--agent", "alice")
    assert set(made) == CREATED_KEYS
    assert made["id"].startswith("tok_") and made["token"].startswith("cstp_")
    assert len(made["token"]) > 40
    assert (made["workspace"], made["agent"], made["role"], made["expiresAt"]) == (
        "default",
        "alice",
        "agent",
        None,
    )
    assert made["scopes"] == ["read", "announce", "record", "review:own"]
    other = await create(
        database_url,
        "--agent",
        "bob",
        "--workspace",
        "team-b",
        "--role",
        "reviewer",
        "--expires-in",
        "2h",
    )
    assert (other["workspace"], other["role"], other["scopes"]) == (
        "team-b",
        "reviewer",
        ["read", "review:any"],
    )
    expires = datetime.fromisoformat(other["expiresAt"].replace("Z", "+00:00"))
    assert 7190 < (expires - datetime.now(UTC)).total_seconds() <= 7200

    tokens = await listed(database_url)
    assert [t["id"] for t in tokens] == [made["id"], other["id"]]
    assert all(set(t) == LISTED_KEYS for t in tokens)
    assert [t["status"] for t in tokens] == ["active", "active"]
    assert tokens[0]["createdBy"] and tokens[0]["revokedAt"] is None
    assert [t["id"] for t in await listed(database_url, "--workspace", "team-b")] == [other["id"]]
    text = await cstp(database_url, "tokens", "list")
    assert text.exit_code == 0 and made["id"] in text.stdout and "team-b" in text.stdout
    assert made["token"] not in text.output and other["token"] not in text.output

    plain = await cstp(database_url, "tokens", "create", "--agent", "carol")
    assert plain.exit_code == 0, plain.output
    secret_lines = [line for line in plain.stdout.splitlines() if line.startswith("token: ")]
    assert len(secret_lines) == 1 and secret_lines[0].split()[1].startswith("cstp_")
    assert "shown once" in plain.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--agent", ""], "agent '' is not an agent name"),
        (["--agent", "two words"], "is not an agent name"),
        (["--agent", "a\x1b[2Jb"], "is not an agent name"),
        (["--agent", "a", "--workspace", "Team"], "workspace 'Team' is not a workspace id"),
        (["--agent", "a", "--workspace", "-x"], "is not a workspace id"),
        (["--agent", "a", "--workspace", "x" * 64], "is not a workspace id"),
        (["--agent", "a", "--workspace", "2026"], "four digits name a year's folder"),
        (["--agent", "a", "--role", "root"], "role 'root' is not one of"),
        (["--agent", "a", "--scopes", "read,fly"], "scope 'fly' is not one of"),
        (["--agent", "a", "--scopes", ","], "--scopes names no scope"),
        (["--agent", "a", "--expires-in", "10m"], "must be a whole number and a unit"),
        (["--agent", "a", "--expires-in", "0s"], "must be between 1s and 3650d"),
        (["--agent", "a", "--expires-in", "4000d"], "must be between 1s and 3650d"),
    ],
)
async def test_a_bad_request_is_one_line_and_writes_nothing(
    database_url: str, args: list[str], says: str
) -> None:
    result = await cstp(database_url, "tokens", "create", *args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], lines
    assert "\x1b" not in result.output
    assert await listed(database_url) == []


async def test_revoking_twice_and_revoking_an_unknown_id(database_url: str) -> None:
    made = await create(database_url, "--agent", "alice")
    first = await revoke(database_url, made["id"])
    assert first.exit_code == 0 and f"revoked {made['id']}" in first.stdout
    again = await revoke(database_url, made["id"])
    assert again.exit_code == 0 and "already revoked" in again.stdout
    (token,) = await listed(database_url)
    assert token["status"] == "revoked" and token["revokedAt"]
    unknown = await revoke(database_url, "tok_0123456789abcdef")
    assert unknown.exit_code == 1
    assert unknown.stderr.strip() == (
        "Error: no token has the id tok_0123456789abcdef (see `cstp tokens list`)"
    )
    # a secret given for an id is refused without being printed back
    mistaken = await revoke(database_url, made["token"])
    assert mistaken.exit_code == 1 and made["token"] not in mistaken.output
    grants = await run_sql(
        database_url, "SELECT action FROM api_token_grants ORDER BY acted_at, action"
    )
    assert [g["action"] for g in grants] == ["create", "revoke"]  # revoked once


# ---- the server ---------------------------------------------------------------------------------


async def test_a_created_token_works_with_its_roles_scopes(
    client: AppClient, database_url: str
) -> None:
    agent = await create(database_url, "--agent", "dora")
    reviewer = await create(database_url, "--agent", "rita", "--role", "reviewer")
    as_agent, as_reviewer = Rpc(client, agent["token"]), Rpc(client, reviewer["token"])
    recorded = await as_agent.ok("cstp.recordDecision", DECISION)
    got = await as_reviewer.ok("cstp.getDecision", {"id": recorded["id"]})
    assert got["decision"]["recordedBy"] == "dora"
    refused = await as_reviewer.error("cstp.recordDecision", DECISION)
    assert (refused["code"], refused["data"]) == (-32010, {"scope": "record"})
    await as_reviewer.ok("cstp.reviewDecision", {"id": recorded["id"], "outcome": "success"})
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {reviewer['token']}"}
    tools = (await client.post("/mcp", json=LIST_TOOLS, headers=headers)).json()
    names = {tool["name"] for tool in tools["result"]["tools"]}
    assert "review_decision" in names and "record_decision" not in names
    # the configuration's tokens keep working beside them
    assert await status_of(client, "token-alice") == 200


async def test_a_token_works_in_its_own_workspace_only(
    client: AppClient, rpc: Rpc, database_url: str
) -> None:
    """The token's workspace is the call's: what it records, a token of another workspace
    (here the configuration's, of ``default``) does not see, as if it did not exist."""
    made = await create(database_url, "--agent", "tia", "--workspace", "team-b")
    team_b = Rpc(client, made["token"])
    recorded = await team_b.ok("cstp.recordDecision", DECISION)
    assert (await team_b.ok("cstp.getDecision", {"id": recorded["id"]}))["found"] is True
    missing = await rpc.error("cstp.getDecision", {"id": recorded["id"]})
    assert missing["code"] == -32007
    assert (await rpc.ok("cstp.listDecisions", {}))["total"] == 0
    assert (await team_b.ok("cstp.listDecisions", {}))["total"] == 1
    rows = await run_sql(database_url, "SELECT workspace FROM decisions")
    assert [r["workspace"] for r in rows] == ["team-b"]


async def test_scopes_given_replace_the_roles(client: AppClient, database_url: str) -> None:
    made = await create(database_url, "--agent", "sam", "--scopes", "read")
    assert (made["role"], made["scopes"]) == ("agent", ["read"])
    rpc = Rpc(client, made["token"])
    await rpc.ok("cstp.listDecisions", {})
    refused = await rpc.error("cstp.recordDecision", DECISION)
    assert (refused["code"], refused["data"]) == (-32010, {"scope": "record"})
    refused = await rpc.error("cstp.announceIntent", {"intent": "Add a cache"})
    assert refused["data"] == {"scope": "announce"}


async def test_an_unknown_token_is_401(client: AppClient) -> None:
    assert await status_of(client, "cstp_" + "x" * 43) == 401
    assert await mcp_status(client, "cstp_" + "x" * 43) == 401


async def test_a_revoked_token_is_refused_within_two_seconds(
    client: AppClient, database_url: str
) -> None:
    made = await create(database_url, "--agent", "eve")
    secret = made["token"]
    assert await status_of(client, secret) == 200  # in this process's cache now
    assert await mcp_status(client, secret) == 200
    result = await revoke(database_url, made["id"])
    assert result.exit_code == 0, result.output
    revoked_at = time.monotonic()

    async def refused() -> tuple[bool, Any]:
        codes = (await status_of(client, secret), await mcp_status(client, secret))
        return codes == (401, 401), codes

    await poll_until(refused, 2.0, "the revoked token refused on /cstp and /mcp", interval=0.02)
    assert time.monotonic() - revoked_at < 2.0
    response = await client.post(
        "/cstp",
        json={"jsonrpc": "2.0", "id": 1, "method": "cstp.listDecisions"},
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert response.status_code == 401
    assert response.json() == {"error": "unauthorized", "message": "invalid bearer token"}
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_an_expired_token_is_refused(client: AppClient, database_url: str) -> None:
    made = await create(database_url, "--agent", "fay", "--expires-in", "1s")
    expires = datetime.fromisoformat(made["expiresAt"].replace("Z", "+00:00"))
    seen: list[tuple[datetime, int, int]] = []

    async def refused() -> tuple[bool, Any]:
        before = datetime.now(UTC)
        codes = (await status_of(client, made["token"]), await mcp_status(client, made["token"]))
        seen.append((before, *codes))
        return codes == (401, 401), codes

    await poll_until(refused, 5.0, "the expired token refused", interval=0.02)
    # refused from its expiry on (every call sees it: the cache keeps the expiry, not a verdict)
    assert all(
        at < expires for at, cstp_code, mcp_code in seen if (cstp_code, mcp_code) != (401, 401)
    )
    (token,) = await listed(database_url)
    assert token["status"] == "expired"


async def test_the_database_and_the_logs_hold_no_secret(
    client: AppClient, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = []
    for n, args in enumerate(
        (["--role", "reviewer"], ["--expires-in", "1h"], ["--scopes", "read,record"])
    ):
        made = await create(database_url, "--agent", f"agent-{n}", *args)
        secrets.append(made["token"])
        await Rpc(client, made["token"]).call("cstp.listDecisions", {})
    first = (await listed(database_url))[0]["id"]
    assert (await revoke(database_url, first)).exit_code == 0
    assert await status_of(client, "cstp_not-a-token") == 401
    stored = await stored_bytes(database_url)
    digests = [hashlib.sha256(s.encode()).hexdigest().encode() for s in secrets]
    assert all(d in stored for d in digests)  # the search looked at the right place
    for secret in secrets:
        body = secret.removeprefix("cstp_").encode()
        assert body not in stored and body[:16] not in stored
        assert secret not in caplog.text


async def stored_bytes(url: str) -> bytes:
    """Every byte of the database: the SQLite file and its journal, or every row of every
    Postgres table as text."""
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file())
    tables = await run_sql(
        url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    )
    out = []
    for table in tables:
        rows = await run_sql(url, f'SELECT CAST(t AS text) AS row FROM "{table["table_name"]}" t')
        out.extend(str(r["row"]).encode() for r in rows)
    return b"\n".join(out)


async def test_a_token_store_out_of_reach_is_503_not_401(client: AppClient, tmp_path: Path) -> None:
    """A token the server cannot look up is neither let in nor called invalid: a client told
    401 would throw a good token away."""
    gone = Database(f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'cstp.db'}")
    client.app.state.tokens.use_database(TokenLookup(gone, utc_now))
    try:
        assert await status_of(client, "cstp_" + "y" * 43) == 503
        assert await mcp_status(client, "cstp_" + "y" * 43) == 503
        assert await status_of(client, "token-alice") == 200  # configured tokens: no lookup
    finally:
        await gone.dispose()


async def test_the_cache_shares_reads_keeps_them_a_second_and_stays_bounded(
    services: Any,
) -> None:
    """Concurrent calls with one secret share one read; a second later it is read again;
    each cache keeps at most its bound, so random secrets cannot push a real token out."""
    clock = [100.0]
    lookup = TokenLookup(services.db, utc_now, max_entries=5, monotonic=lambda: clock[0])
    reads = 0
    real_read = services.db.read

    async def counted(work: Any, session: Any = None) -> Any:
        nonlocal reads
        reads += 1
        return await real_read(work, session)

    services.db.read = counted
    try:
        unknown = hashlib.sha256(b"nobody").digest()
        assert await asyncio.gather(*(lookup.principal(unknown) for _ in range(20))) == [None] * 20
        assert reads == 1
        clock[0] += 0.99
        assert await lookup.principal(unknown) is None and reads == 1
        clock[0] += 0.01
        assert await lookup.principal(unknown) is None and reads == 2
        for n in range(50):
            await lookup.principal(hashlib.sha256(str(n).encode()).digest())
        assert lookup.sizes == (0, 5)
    finally:
        services.db.read = real_read
    gone = Database("sqlite+aiosqlite:////nonexistent-dir/cstp.db")
    try:
        with pytest.raises(TokenStoreUnavailable):
            await TokenLookup(gone, utc_now).principal(unknown)
    finally:
        await gone.dispose()


# ---- the audit chain ----------------------------------------------------------------------------


def documented_grants_query() -> str:
    """The query docs/AUDIT.md shows under the tokens' tables."""
    doc = AUDIT_DOC.read_text(encoding="utf-8")
    section = doc.split("### `api_tokens` and `api_token_grants`", 1)[1]
    query = re.search(r"^```sql\n(.*?)^```", section, flags=re.M | re.S)
    assert query is not None
    return query.group(1)


async def test_grants_are_chained_and_verify_holds(client: AppClient, database_url: str) -> None:
    made = await create(database_url, "--agent", "gus")
    await revoke(database_url, made["id"])
    grants = await run_sql(
        database_url,
        "SELECT g.id, g.action, g.token_id, g.workspace, g.acted_by, c.seq FROM api_token_grants g "
        "JOIN audit_chain c ON c.table_name = 'api_token_grants' AND c.row_id = g.id "
        "ORDER BY c.seq",
    )
    assert [(g["action"], g["token_id"]) for g in grants] == [
        ("create", made["id"]),
        ("revoke", made["id"]),
    ]
    assert all(g["acted_by"] and g["workspace"] == "default" for g in grants)
    code, output = await verify(database_url)
    assert code == 0, output
    # the query docs/AUDIT.md shows for them, as written
    rows = await run_sql(database_url, documented_grants_query())
    assert [(r["token_id"], r["action"], r["agent"]) for r in rows] == [
        (made["id"], "create", "gus"),
        (made["id"], "revoke", "gus"),
    ]


async def test_a_changed_grant_is_named_by_its_entry(database_url: str) -> None:
    made = await create(database_url, "--agent", "hal", "--role", "reviewer")
    (grant,) = await run_sql(
        database_url,
        "SELECT g.id, c.seq FROM api_token_grants g JOIN audit_chain c "
        "ON c.table_name = 'api_token_grants' AND c.row_id = g.id",
    )
    # widen both the grant and the token, as an insider covering their tracks would
    await tamper(
        database_url,
        f"UPDATE api_token_grants SET role = 'agent' WHERE id = '{grant['id']}'",
        f"UPDATE api_tokens SET role = 'agent' WHERE id = '{made['id']}'",
    )
    code, output = await verify(database_url)
    assert code == 1, output
    assert f"seq {grant['seq']} api_token_grants {grant['id']}: changed:" in output


async def test_a_token_row_that_disagrees_with_its_grants_is_reported_and_refused(
    client: AppClient, database_url: str
) -> None:
    revoked = await create(database_url, "--agent", "ivy")
    widened = await create(database_url, "--agent", "jon", "--role", "reviewer")
    assert (await revoke(database_url, revoked["id"])).exit_code == 0
    await tamper(
        database_url,
        f"UPDATE api_tokens SET revoked_at = NULL WHERE id = '{revoked['id']}'",
        f"UPDATE api_tokens SET role = 'agent' WHERE id = '{widened['id']}'",
    )
    code, output = await verify(database_url)
    assert code == 1, output
    assert (
        f"api_tokens {revoked['id']}: token: a grant records its revocation, yet revoked_at "
        "is empty" in output
    )
    assert f"api_tokens {widened['id']}: token: role not what the grant of its creation" in output
    assert await status_of(client, revoked["token"]) == 401
    assert await status_of(client, widened["token"]) == 401


async def test_a_token_value_the_server_never_writes_is_reported_and_refused(
    client: AppClient, database_url: str
) -> None:
    """SQLite stores any value in any column: a token whose expiry was made text that is no
    time is reported by verify, and refused by the server (401, not a failed call)."""
    if not database_url.startswith("sqlite"):
        pytest.skip("Postgres refuses text that is not a time in a timestamptz column")
    made = await create(database_url, "--agent", "lou", "--expires-in", "1h")
    await tamper(
        database_url, f"UPDATE api_tokens SET expires_at = 'never' WHERE id = '{made['id']}'"
    )
    code, output = await verify(database_url)
    assert code == 1, output
    assert f"api_tokens {made['id']}: token: a value is not in the form the server stores" in output
    assert await status_of(client, made["token"]) == 401


async def test_the_database_refuses_to_delete_or_widen_a_token(database_url: str) -> None:
    made = await create(database_url, "--agent", "kim", "--role", "reviewer")
    for statement in (
        f"UPDATE api_tokens SET role = 'agent' WHERE id = '{made['id']}'",
        f"DELETE FROM api_tokens WHERE id = '{made['id']}'",
        "UPDATE api_token_grants SET role = 'agent'",
        "DELETE FROM api_token_grants",
    ):
        with pytest.raises(Exception, match=r"append-only|never deleted|only to be revoked"):
            await run_sql(database_url, statement)
    assert (await revoke(database_url, made["id"])).exit_code == 0
    with pytest.raises(Exception, match="only to be revoked"):
        await run_sql(database_url, "UPDATE api_tokens SET revoked_at = NULL")


# ---- several server processes -------------------------------------------------------------------


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[list[str]]:
    if not USE_PG:
        pytest.skip("several server processes on one database: Postgres")
    settings = [
        {
            "CSTP_DATABASE_URL": database_url,
            "CSTP_AUTH_TOKENS": "alice:token-alice",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_DATA_DIR": str(tmp_path / f"data{n}"),
            "CSTP_DECISIONS_DIR": str(tmp_path / f"decisions{n}"),
            "CSTP_LOG_LEVEL": "WARNING",
            "CSTP_AUDIT_KEY": "",
        }
        for n in range(2)
    ]
    with cstp_servers(tmp_path, settings) as bases:
        yield bases


@pytest.mark.slow
async def test_two_server_processes_both_refuse_a_revoked_token_within_two_seconds(
    two_servers: list[str], database_url: str
) -> None:
    made = await create(database_url, "--agent", "lea")
    body = {"jsonrpc": "2.0", "id": 1, "method": "cstp.listDecisions", "params": {}}
    headers = {"Authorization": f"Bearer {made['token']}"}
    async with httpx.AsyncClient(timeout=30) as http:

        async def codes() -> list[int]:
            answers = await asyncio.gather(
                *(http.post(f"{base}/cstp", json=body, headers=headers) for base in two_servers)
            )
            return [a.status_code for a in answers]

        assert await codes() == [200, 200]
        result = await revoke(database_url, made["id"])
        assert result.exit_code == 0, result.output
        revoked_at = time.monotonic()

        async def refused() -> tuple[bool, Any]:
            seen = await codes()
            return seen == [401, 401], seen

        await poll_until(refused, 2.0, "both servers refuse the revoked token", interval=0.02)
        assert time.monotonic() - revoked_at < 2.0
