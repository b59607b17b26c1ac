"""``cstp db auditor-role``: an auditor's own database role on PostgreSQL, which reads the audit
tables of one workspace through row-level security (revision 0012) and writes nothing.

The rows of two workspaces are inserted with SQL as the tables' owner; the command runs
through click's CliRunner (in a thread: it runs its own event loop); the auditor's session is
a real connection as the role. Roles belong to the whole cluster: each test names its own
with a random suffix and drops them at its end. On SQLite the command refuses in one line.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import asyncpg
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import bindparam, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.cli import main
from app.db import readers
from app.db.base import UtcDateTime
from support.databases import PG_URL, USE_PG, pg_admin_dsn, run_sql

DOC = Path(__file__).resolve().parents[2] / "docs" / "AUDIT.md"
postgres_only = pytest.mark.skipif(not USE_PG, reason="database roles: PostgreSQL only")

AUDIT_TABLES = (
    "api_token_grants",  # revision 0013: the tokens and their grants carry the policy too
    "api_tokens",
    "approval_decisions",  # revision 0016
    "approvals",
    "audit_chain",
    "decision_reasons",
    "decision_reviews",
    "decision_supersedes",  # revision 0019
    "decision_tags",
    "decisions",
    "guardrail_evaluations",
    "guardrail_rule_results",
    "intent_matches",
    "intents",
    "outbox_events",
    "session_briefs",  # revision 0021
)
# What each workspace holds: every count differs, so a count tells whose rows were read.
HELD = {
    "w1": {"intents": 3, "decisions": 1, "intent_matches": 2, "guardrail_evaluations": 1},
    "w2": {"intents": 2, "decisions": 2, "intent_matches": 1, "guardrail_evaluations": 2},
}


async def seed(url: str) -> None:
    """Rows of workspaces w1 and w2 (and one of ``default``), inserted as the tables' owner:
    decisions, evaluations, intents, the matches the intents were shown, and an audit_chain
    entry per row (the chain is not verified here)."""
    seq = 0

    async def chained(table: str, row_id: str, workspace: str) -> None:
        nonlocal seq
        seq += 1
        await run_sql(
            url,
            "INSERT INTO audit_chain (seq, table_name, row_id, digest, prev_hash, hash, keyed, "
            "workspace) VALUES (:seq, :t, :r, 'd', 'p', 'h', false, :w)",
            seq=seq,
            t=table,
            r=row_id,
            w=workspace,
        )

    for workspace, held in [*HELD.items(), ("default", dict.fromkeys(HELD["w1"], 1))]:
        decisions = []
        for n in range(held["decisions"]):
            decision = f"{workspace[:2]}{n:02d}{secrets.token_hex(2)}"[:8]
            decisions.append(decision)
            await run_sql(
                url,
                "INSERT INTO decisions (id, summary, decision, category, confidence, stakes, "
                "status, created_at, recorded_by, workspace) VALUES (:id, :text, :text, "
                "'architecture', 0.8, 'medium', 'pending', now(), 'agent-a', :w)",
                id=decision,
                text=f"{workspace}'s decision {n}",
                w=workspace,
            )
            await chained("decisions", decision, workspace)
        for n in range(held["guardrail_evaluations"]):
            evaluation = str(uuid.uuid4())
            await run_sql(
                url,
                "INSERT INTO guardrail_evaluations (id, agent, source, evaluated_at, "
                "description, facts, allowed, evaluated, violations, warnings, "
                "rule_set_version, workspace) VALUES (:id, 'agent-a', 'checkGuardrails', now(), "
                ":text, '{}', true, 1, 0, 0, 'v1', :w)",
                id=evaluation,
                text=f"{workspace}'s action {n}",
                w=workspace,
            )
            await chained("guardrail_evaluations", evaluation, workspace)
            await run_sql(
                url,
                "INSERT INTO guardrail_rule_results (evaluation_id, guardrail_id, severity, "
                "fired, message, workspace) VALUES (:e, 'no-friday-deploys', 'warn', true, "
                ":message, :w)",
                e=evaluation,
                message=f"{workspace}'s warning {n}",
                w=workspace,
            )
        intents = []
        for n in range(held["intents"]):
            intent = str(uuid.uuid4())
            intents.append(intent)
            await run_sql(
                url,
                "INSERT INTO intents (id, correlation_id, agent, received_at, outcome, intent, "
                "workspace) VALUES (:id, :corr, 'agent-a', now(), 'ok', :text, :w)",
                id=intent,
                corr=f"same-id-{n}",  # the same correlation ids in each workspace
                text=f"{workspace}'s intent {n}",
                w=workspace,
            )
            await chained("intents", intent, workspace)
        for n in range(held["intent_matches"]):
            await run_sql(
                url,
                "INSERT INTO intent_matches (intent_id, decision_id, rank, distance, workspace) "
                "VALUES (:i, :d, :rank, 0.1, :w)",
                i=intents[0],
                d=decisions[0],
                rank=n,
                w=workspace,
            )


def chain_entries(workspace: str) -> int:
    if workspace == "default":
        return 3
    held = HELD[workspace]
    return held["intents"] + held["decisions"] + held["guardrail_evaluations"]


async def cstp(url: str, *args: str, **env: str | None) -> Result:
    """``cstp ARGS`` against ``url``, in a thread: the command runs an event loop of its own."""
    return await asyncio.to_thread(
        CliRunner().invoke, main, list(args), env={"CSTP_DATABASE_URL": url, **env}
    )


def as_role(url: str, role: str, password: str | None = None) -> str:
    return make_url(url).set(username=role, password=password).render_as_string(False)


async def session(url: str, statements: list[str]) -> list[Any]:
    """Each statement in a transaction of its own on one connection, as an auditor typing
    them into psql: a result's rows, or the DBAPIError it raised."""
    engine = create_async_engine(url)
    out: list[Any] = []
    try:
        async with engine.connect() as conn:
            for statement in statements:
                try:
                    async with conn.begin():
                        result = await conn.execute(text(statement))
                        out.append(result.all() if result.returns_rows else [])
                except DBAPIError as exc:
                    out.append(exc)
    finally:
        await engine.dispose()
    return out


async def counts(url: str) -> dict[str, int]:
    tables = ("intents", "intent_matches", "decisions", "guardrail_evaluations", "audit_chain")
    rows = await session(url, [f"SELECT COUNT(*) FROM {table}" for table in tables])
    return {table: row[0][0] for table, row in zip(tables, rows, strict=True)}


def expected(workspace: str) -> dict[str, int]:
    return {**HELD[workspace], "audit_chain": chain_entries(workspace)}


async def admin(sql: str) -> None:
    conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
async def role_names(database_url: str) -> AsyncIterator[Callable[[str], str]]:
    """Unique role names for the test; the roles are dropped at its end, with what they were
    granted in the test's database (before that database is dropped)."""
    made: list[str] = []

    def name(prefix: str) -> str:
        made.append(f"{prefix}_{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield name
    for role in made:
        exists = await run_sql(database_url, "SELECT 1 FROM pg_roles WHERE rolname = :r", r=role)
        if exists:
            await run_sql(database_url, f'DROP OWNED BY "{role}"')
            await admin(f'DROP ROLE "{role}"')


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@postgres_only
async def test_an_auditor_role_reads_its_workspace_only_and_writes_nothing(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    await seed(database_url)
    role = role_names("aud_w1")
    result = await cstp(database_url, "db", "auditor-role", role, "--workspace", "w1")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines() == [
        f"role {role} created (LOGIN NOINHERIT)",
        f"it reads workspace w1: SELECT on {len(AUDIT_TABLES)} audit tables of schema "
        "public, no other privilege there",
    ]
    auditor = as_role(database_url, role)
    other = role_names("aud_w2")
    assert (
        await cstp(database_url, "db", "auditor-role", other, "--workspace", "w2")
    ).exit_code == 0

    assert await counts(auditor) == expected("w1")
    assert await counts(as_role(database_url, other)) == expected("w2")
    # A reader cannot look up another reader's workspace either.
    (mine, theirs) = await session(
        auditor,
        [f"SELECT {readers.FUNCTION}(current_user)", f"SELECT {readers.FUNCTION}('{other}')"],
    )
    assert (mine[0][0], theirs[0][0]) == ("w1", None)
    texts, workspaces, by_id, others = await session(
        auditor,
        [
            "SELECT intent FROM intents ORDER BY intent",
            "SELECT DISTINCT workspace FROM intents UNION SELECT DISTINCT workspace "
            "FROM decisions UNION SELECT DISTINCT workspace FROM audit_chain",
            "SELECT COUNT(*) FROM intents WHERE correlation_id = 'same-id-0'",
            "SELECT COUNT(*) FROM intents WHERE workspace <> 'w1'",
        ],
    )
    assert [row[0] for row in texts] == [f"w1's intent {n}" for n in range(3)]
    assert [row[0] for row in workspaces] == ["w1"]
    assert by_id[0][0] == 1 and others[0][0] == 0
    # The owner's view (and the server's) is not filtered.
    assert (await run_sql(database_url, "SELECT COUNT(*) AS n FROM intents"))[0]["n"] == 6

    refused = await session(
        auditor,
        [
            "INSERT INTO intents (id, correlation_id, agent, received_at, outcome, workspace) "
            "VALUES ('forged', 'forged', 'mallory', now(), 'ok', 'w1')",
            "UPDATE intents SET agent = 'mallory'",
            "DELETE FROM intents",
            "TRUNCATE intents",
            "DELETE FROM audit_chain",
            "UPDATE decisions SET outcome = 'success'",
            f"INSERT INTO {readers.TABLE} (role_name, workspace) VALUES ('{role}', 'w2')",
            f"SELECT * FROM {readers.TABLE}",
            "SELECT * FROM alembic_version",
            "SELECT * FROM guardrail_rule_sets",
            "CREATE TABLE notes (line text)",
            "SET ROLE postgres",
        ],
    )
    for outcome in refused:
        assert isinstance(outcome, DBAPIError), outcome
        assert "permission denied" in str(outcome.orig), outcome
    assert await counts(database_url) == {
        table: expected("w1")[table] + expected("w2")[table] + (1 if table != "audit_chain" else 3)
        for table in expected("w1")
    }

    # Again for w2: the same role now reads w2's rows, and w1's no more.
    again = await cstp(database_url, "db", "auditor-role", role, "--workspace", "w2")
    assert again.exit_code == 0, (again.stdout, again.stderr)
    assert again.stdout.splitlines() == [
        f"role {role} updated (its attributes were already right)",
        f"it reads workspace w2 (was w1): SELECT on {len(AUDIT_TABLES)} audit tables of "
        "schema public, no other privilege there",
    ]
    assert await counts(auditor) == expected("w2")
    (texts,) = await session(auditor, ["SELECT intent FROM intents ORDER BY intent"])
    assert [row[0] for row in texts] == [f"w2's intent {n}" for n in range(2)]


@postgres_only
async def test_an_existing_role_is_brought_down_to_select_on_the_audit_tables(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    await seed(database_url)
    role = role_names("aud_wide")
    await admin(f'CREATE ROLE "{role}" LOGIN CREATEDB BYPASSRLS')
    await run_sql(database_url, f'GRANT ALL ON intents, alembic_version TO "{role}"')
    result = await cstp(database_url, "db", "auditor-role", role, "--workspace", "w1")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines()[0] == (
        f"role {role} updated (NOINHERIT, NOCREATEDB, NOBYPASSRLS)"
    )
    auditor = as_role(database_url, role)
    assert await counts(auditor) == expected("w1")
    rows = await run_sql(
        database_url,
        "SELECT c.relname AS name, has_table_privilege(:r, c.oid, 'SELECT') AS reads, "
        "has_table_privilege(:r, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, "
        "TRIGGER') AS writes FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
        "AND c.relkind = 'r'",
        r=role,
    )
    assert sorted(r["name"] for r in rows if r["reads"]) == sorted(AUDIT_TABLES)
    assert [r["name"] for r in rows if r["writes"]] == []
    (attributes,) = await run_sql(
        database_url,
        "SELECT rolcanlogin, rolinherit, rolcreatedb, rolbypassrls, rolsuper, rolcreaterole "
        "FROM pg_roles WHERE rolname = :r",
        r=role,
    )
    assert attributes == {
        "rolcanlogin": True,
        "rolinherit": False,
        "rolcreatedb": False,
        "rolbypassrls": False,
        "rolsuper": False,
        "rolcreaterole": False,
    }


def scram_login_accepted(verifier: str, password: str) -> bool:
    """A SCRAM-SHA-256 exchange (RFC 5802 section 3) between a client that knows ``password``
    and a server that knows only the stored ``verifier``: whether the server accepts the
    client's proof, and the client the server's signature."""
    method, rest = verifier.split("$", 1)
    assert method == "SCRAM-SHA-256"
    params, keys = rest.split("$")
    iterations, salt = params.split(":")
    stored_key, server_key = (base64.b64decode(k) for k in keys.split(":"))
    auth_message = b"n=,r=client-nonce,r=client-nonceserver-nonce,s=...,i=4096,c=biws"

    def hmac_of(key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, hashlib.sha256).digest()

    # the client
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    client_key = hmac_of(salted, b"Client Key")
    signature = hmac_of(hashlib.sha256(client_key).digest(), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    # the server: recovers the client key from the proof, checks it against the stored key
    recovered = bytes(a ^ b for a, b in zip(proof, hmac_of(stored_key, auth_message), strict=True))
    server_signature = hmac_of(server_key, auth_message)
    return hashlib.sha256(recovered).digest() == stored_key and server_signature == hmac_of(
        hmac_of(salted, b"Server Key"), auth_message
    )


@postgres_only
async def test_the_password_comes_from_the_environment_and_is_stored_as_a_verifier(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    role = role_names("aud_pw")
    password = f"correct horse {secrets.token_hex(8)}"
    result = await cstp(
        database_url,
        "db",
        "auditor-role",
        role,
        "--workspace",
        "w1",
        "--password-env",
        "AUDITOR_PASSWORD",
        AUDITOR_PASSWORD=password,
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines()[0] == f"role {role} created (LOGIN NOINHERIT, password set)"
    assert password not in result.stdout + result.stderr
    (stored,) = await run_sql(
        database_url, "SELECT rolpassword FROM pg_authid WHERE rolname = :r", r=role
    )
    verifier = stored["rolpassword"]
    assert verifier.startswith("SCRAM-SHA-256$4096:") and password not in verifier
    assert scram_login_accepted(verifier, password)
    assert not scram_login_accepted(verifier, password + "!")
    # (The test server's pg_hba trusts local connections, so a login does not check it.)
    assert await counts(as_role(database_url, role, password)) == dict.fromkeys(expected("w1"), 0)

    missing = await cstp(
        database_url, "db", "auditor-role", role, "--workspace", "w1", "--password-env", "NOPE"
    )
    assert one_line_error(missing) == "Error: the environment variable NOPE is not set or empty"


@postgres_only
async def test_roles_row_level_security_would_not_hold_are_refused(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    superuser = role_names("aud_su")
    await admin(f'CREATE ROLE "{superuser}" SUPERUSER')
    owner = (
        await run_sql(database_url, "SELECT tableowner FROM pg_tables WHERE tablename = 'intents'")
    )[0]["tableowner"]
    member = role_names("aud_member")
    await admin(f'CREATE ROLE "{member}" LOGIN IN ROLE "{owner}"')
    me = make_url(database_url).username
    injected = 'aud"; DROP TABLE intents; --'
    refusals = {
        me: f"Error: {me} is the role this command (and the server) connects as: an auditor "
        "needs a role of their own",
        superuser: f"Error: {superuser} is a superuser, which row-level security does not "
        "apply to: choose another name",
        member: f"Error: {member} is a member of {owner}: an auditor role is a member of no "
        "role (REVOKE the memberships first, or choose another name)",
        injected: f"Error: {injected!r} cannot be an auditor role's name: use 1 to 63 "
        "lower-case letters, digits and underscores, starting with a letter or an underscore, "
        "not 'pg_' and not a reserved name",
        "pg_monitor": "Error: 'pg_monitor' cannot be an auditor role's name: use 1 to 63 "
        "lower-case letters, digits and underscores, starting with a letter or an underscore, "
        "not 'pg_' and not a reserved name",
    }
    for role, line in refusals.items():
        result = await cstp(database_url, "db", "auditor-role", role, "--workspace", "w1")
        assert one_line_error(result) == line
    bad_workspace = await cstp(database_url, "db", "auditor-role", "aud_x", "--workspace", "W 1")
    assert one_line_error(bad_workspace) == (
        "Error: 'W 1' is not a workspace id: lower-case letters, digits and '-', a letter or "
        "digit first, at most 63 characters"
    )
    assert await run_sql(database_url, f"SELECT * FROM {readers.TABLE}") == []
    assert await run_sql(database_url, "SELECT COUNT(*) AS n FROM intents") == [{"n": 0}]


@postgres_only
async def test_revoke_takes_the_role_out_of_the_audit_tables(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    await seed(database_url)
    role = role_names("aud_gone")
    granted = await cstp(database_url, "db", "auditor-role", role, "--workspace", "w1")
    assert granted.exit_code == 0, granted.stderr
    result = await cstp(database_url, "db", "auditor-role", role, "--revoke")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines() == [
        f"role {role} no longer reads workspace w1: its privileges on schema public are "
        "revoked and it cannot log in (DROP ROLE removes it)"
    ]
    assert await run_sql(database_url, f"SELECT * FROM {readers.TABLE}") == []
    (attributes,) = await run_sql(
        database_url,
        "SELECT rolcanlogin, (SELECT bool_or(has_table_privilege(:r, c.oid, 'SELECT')) "
        "FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r') "
        "AS reads FROM pg_roles WHERE rolname = :r",
        r=role,
    )
    assert attributes == {"rolcanlogin": False, "reads": False}
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="not permitted"):
        await asyncpg.connect(pg_admin_dsn(as_role(database_url, role)))
    again = await cstp(database_url, "db", "auditor-role", role, "--revoke")
    assert one_line_error(again) == (
        f"Error: {role} is not an auditor role (it is not listed in {readers.TABLE})"
    )


def test_on_sqlite_the_command_says_it_needs_postgres(tmp_path: Path) -> None:
    path = tmp_path / "cstp.db"
    result = CliRunner().invoke(
        main,
        ["db", "auditor-role", "aud_w1", "--workspace", "w1"],
        env={"CSTP_DATABASE_URL": f"sqlite+aiosqlite:///{path}"},
    )
    assert one_line_error(result) == (
        "Error: `cstp db auditor-role` needs PostgreSQL (database roles and row-level "
        "security); this database is SQLite"
    )
    assert not path.exists()


def documented_queries(section: str, level: str = "###") -> dict[str, str]:
    """``heading`` → the first ```sql block under it, in the ``## section`` of AUDIT.md."""
    doc = DOC.read_text(encoding="utf-8")
    body = doc.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    queries = {}
    for part in re.split(rf"^{level} ", body, flags=re.M)[1:]:
        heading, _, rest = part.partition("\n")
        block = re.search(r"^```sql\n(.*?)^```", rest, flags=re.M | re.S)
        if block:
            queries[heading.strip()] = block.group(1)
    return queries


@postgres_only
async def test_the_documented_queries_run_as_a_reader_on_its_workspace(
    database_url: str, role_names: Callable[[str], str]
) -> None:
    """docs/AUDIT.md's auditor session, as written, as a reader of w1; the cookbook and the
    coverage query of the walkthrough run as the reader too."""
    await seed(database_url)
    role = role_names("aud_doc")
    assert (
        await cstp(database_url, "db", "auditor-role", role, "--workspace", "w1")
    ).exit_code == 0
    auditor = as_role(database_url, role)
    session_queries = documented_queries("An auditor's SQL session (PostgreSQL)")
    answers = dict(
        zip(session_queries, await session(auditor, list(session_queries.values())), strict=True)
    )
    for heading, answer in answers.items():
        assert not isinstance(answer, Exception), (heading, answer)
    rows = {heading: [tuple(row) for row in answer] for heading, answer in answers.items()}
    assert rows == {
        "Which workspace this session reads": [(role, "w1")],
        "Announcements of the last seven days, by agent and outcome": [("agent-a", "ok", 3, 0)],
        "Guardrail checks that blocked or warned, with the rules that fired": [
            (
                ANY,
                "agent-a",
                "checkGuardrails",
                "w1's action 0",
                "warn",
                "no-friday-deploys",
                "w1's warning 0",
            )
        ],
        "The latest decisions, announced or not, and how they turned out": [
            (ANY, ANY, "agent-a", "w1's decision 0", 0.8, False, "pending", None)
        ],
        "The chain entries of this workspace": [
            ("decisions", 1, ANY, ANY),
            ("guardrail_evaluations", 1, ANY, ANY),
            ("intents", 3, ANY, ANY),
        ],
    }

    uncovered = documented_queries("The hash chain", "####")["Audited rows that no entry covers"]
    cookbook = documented_queries("SQL cookbook")
    (decision,) = (await session(auditor, ["SELECT id FROM decisions"]))[0]
    params = {
        "agent": "agent-a",
        "correlation_id": "same-id-0",
        "decision_id": decision[0],
        "since": datetime.now(UTC) - timedelta(days=30),
        "until": datetime.now(UTC) + timedelta(days=1),
    }
    engine = create_async_engine(auditor)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text(uncovered))).all() == []
            for heading, sql in cookbook.items():
                query = text(sql)
                names = set(re.findall(r"(?<!:):([a-z_]+)", sql))
                query = query.bindparams(
                    *(bindparam(n, type_=UtcDateTime()) for n in names & {"since", "until"})
                )
                try:
                    await conn.execute(query, {n: params[n] for n in names})
                except DBAPIError as exc:  # name the query that failed
                    pytest.fail(f"{heading}: {exc.orig}")
    finally:
        await engine.dispose()
