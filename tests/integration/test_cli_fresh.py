"""Every ``cstp`` command that uses the database, on a fresh install and on databases in every
other state: it either brings the database to the newest revision (a fresh data dir, a
database with no tables) or stops with one line on stderr that names the fix (an older
revision, a revision this version does not know), never a traceback. The same for what is
out of reach: a database server, a Chroma server, the client's server.

SQLite by default (the database under CSTP_DATA_DIR, as on a fresh install); with
CSTP_TEST_DATABASE_URL a freshly created, empty Postgres database per test. The import runs as
a real ``cstp`` process; the other commands through click's CliRunner, with the embedding
model loaded once for the session (the commands run unchanged otherwise).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result

from app.cli import main
from app.db import migrate
from support.databases import PG_URL, USE_PG, pg_admin_dsn, run_sql, with_db

# Slow: every database command in four states, many as real `cstp` processes:
# the fast loop (-m "not slow") leaves it out.
pytestmark = pytest.mark.slow

CSTP = Path(sys.executable).with_name("cstp")
T = TypeVar("T")
HEAD = migrate.head_revision()
# The revision before the newest, and the first one: an older schema that holds data.
_SCRIPT = ScriptDirectory.from_config(migrate.alembic_config())
OLDER = _SCRIPT.get_revision(HEAD).down_revision  # type: ignore[union-attr]  # head exists
FIRST = [s.revision for s in _SCRIPT.walk_revisions()][-1]
UNKNOWN = "ffff0000newer"
STATES = ("fresh", "empty", "older", "newer")


def _sync(coro: Awaitable[T]) -> T:
    """Run ``coro`` on a loop of its own (the test session's loop is left alone)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@dataclass
class Install:
    """A data dir, decisions dir and database as a test sets them up; ``env`` is what a
    ``cstp`` command gets (SQLite: no CSTP_DATABASE_URL, the default file in the data dir)."""

    root: Path
    url: str

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def decisions_dir(self) -> Path:
        return self.root / "decisions"

    @property
    def env(self) -> dict[str, str]:
        env = {"CSTP_DATA_DIR": str(self.data_dir), "CSTP_DECISIONS_DIR": str(self.decisions_dir)}
        if USE_PG:
            env["CSTP_DATABASE_URL"] = self.url
        return env

    def revision(self) -> str | None:
        return _sync(migrate.current(self.url))

    def put_in(self, state: str) -> None:
        """``fresh``: nothing at all (SQLite: not even the data dir; Postgres: a database just
        created). ``empty``: the database exists and has no tables (SQLite: an empty file).
        ``older``: at OLDER with a decision in it. ``newer``: at a revision this code does
        not know, as a newer cstp would leave it."""
        if state == "fresh":
            return
        if not USE_PG:
            self.data_dir.mkdir(parents=True)
            (self.data_dir / "cstp.db").touch()
        if state == "older":
            _sync(migrate.upgrade(self.url, OLDER))
            sqlite = not USE_PG
            when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
            _sync(
                run_sql(
                    self.url,
                    "INSERT INTO decisions (id, summary, decision, category, confidence, stakes,"
                    " status, created_at, recorded_by) VALUES ('0a0b0c0d', 'Keep it', 'Keep it',"
                    " 'process', 0.7, 'medium', 'pending', :at, 'legacy-agent')",
                    at=when.replace(tzinfo=None) if sqlite else when,
                )
            )
        elif state == "newer":
            _sync(migrate.upgrade(self.url))
            _sync(run_sql(self.url, "UPDATE alembic_version SET version_num = :v", v=UNKNOWN))


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Install]:
    """A fresh install: no data dir, and (Postgres) a new, empty database, dropped after."""
    if not USE_PG:
        yield Install(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'data' / 'cstp.db'}")
        return
    name = f"cstp_fresh_{uuid.uuid4().hex[:12]}"
    _sync(_pg_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield Install(tmp_path, with_db(PG_URL, name))
    finally:
        _sync(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, embedder: Any) -> CliRunner:
    """CliRunner with the session's embedding model (loading it is the slow part of a
    command's start) and none of the caller's CSTP_* variables."""
    monkeypatch.setattr("app.search.embedder.load_default_embedder", lambda: embedder)
    for name in list(os.environ):
        if name.startswith("CSTP_"):
            monkeypatch.delenv(name)
    return CliRunner()


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


def _invoke(runner: CliRunner, args: list[str], env: dict[str, str]) -> Outcome:
    result: Result = runner.invoke(main, args, env=env)
    # An exception that escaped the command would be a traceback for the user.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception,
        result.output,
    )
    return _checked(Outcome(result.exit_code, result.stdout, result.stderr))


def _subprocess(args: list[str], env: dict[str, str], timeout: float = 300) -> Outcome:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    done = subprocess.run(
        [str(CSTP), *args],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def _checked(outcome: Outcome) -> Outcome:
    assert "Traceback" not in outcome.stdout + outcome.stderr, outcome
    return outcome


def _one_line_failure(outcome: Outcome, *fragments: str) -> str:
    """Non-zero, nothing on stdout, exactly one line on stderr that holds ``fragments``."""
    _checked(outcome)
    assert outcome.code != 0, outcome
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1, outcome
    for fragment in fragments:
        assert fragment in lines[0], outcome
    return lines[0]


def _journal(root: Path, count: int) -> Path:
    """``count`` decision files as other journals write them (docs/PROTOCOL.md, "Decision
    files")."""
    for i in range(count):
        month = 1 + i % 12
        path = root / "2025" / f"{month:02d}" / f"2025-{month:02d}-01-decision-{i:04d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            yaml.safe_dump(
                {
                    "id": f"{i:08x}",
                    "decision": f"Adopt practice {i} for service {i % 9}",
                    "category": ["architecture", "process", "tooling"][i % 3],
                    "confidence": round(0.5 + (i % 5) / 10, 2),
                    "stakes": "medium",
                    "date": f"2025-{month:02d}-01T10:00:00Z",
                    "tags": [f"t{i % 4}"],
                }
            ),
            encoding="utf-8",
        )
    return root


# What each command does in each state: None = succeeds (and the database is then at the
# newest revision when the command uses it), else the fragment its one line must hold.
UPGRADE = "run `cstp db upgrade`"
NEWER = f"revision {UNKNOWN}, which this version of cstp does not know"
# A command that reads and never migrates: only a database at the newest revision will do.
AT_HEAD_ONLY: dict[str, str | None] = {
    "fresh": UPGRADE,
    "empty": UPGRADE,
    "older": UPGRADE,
    "newer": NEWER,
}
# A command that brings a new database to the newest revision, as serve does.
MIGRATES_A_NEW_ONE: dict[str, str | None] = {
    "fresh": None,
    "empty": None,
    "older": UPGRADE,
    "newer": NEWER,
}
COMMANDS: dict[str, tuple[list[str], dict[str, str | None]]] = {
    "export": (["export"], MIGRATES_A_NEW_ONE),
    "reindex": (["reindex"], MIGRATES_A_NEW_ONE),
    "outbox": (["outbox"], MIGRATES_A_NEW_ONE),
    "outbox retry": (["outbox", "retry"], MIGRATES_A_NEW_ONE),
    "outbox drain": (["outbox", "drain"], MIGRATES_A_NEW_ONE),
    "db upgrade": (
        ["db", "upgrade"],
        {"fresh": None, "empty": None, "older": None, "newer": NEWER},
    ),
    "db downgrade": (
        ["db", "downgrade", FIRST],
        {
            "fresh": "nothing to downgrade",
            "empty": "nothing to downgrade",
            "older": None,
            "newer": NEWER,
        },
    ),
    "db current": (["db", "current"], {"fresh": None, "empty": None, "older": None, "newer": None}),
    # The auditor's commands read and never migrate: on a database not at the newest revision
    # they say what to run (and create nothing).
    "audit checkpoint": (["audit", "checkpoint"], AT_HEAD_ONLY),
    "audit verify": (["audit", "verify"], AT_HEAD_ONLY),
    "guardrails replay": (["guardrails", "replay", "1"], AT_HEAD_ONLY),
    "db check": (["db", "check"], AT_HEAD_ONLY),
}
# What the database is at after a command that succeeded (None: unchanged).
AFTER = {"db downgrade": FIRST, "db current": None}


def test_downgrading_to_base_says_so(runner: CliRunner, install: Install) -> None:
    install.put_in("older")
    outcome = _invoke(runner, ["db", "downgrade", "base"], install.env)
    assert (outcome.code, outcome.stdout) == (0, "at base (no revision)\n"), outcome
    assert _invoke(runner, ["db", "current"], install.env).stdout.startswith("current: none")


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_database_command_in_every_state_of_the_database(
    runner: CliRunner, install: Install, command: str, state: str
) -> None:
    args, expected = COMMANDS[command]
    install.put_in(state)
    before = None if state == "fresh" and not USE_PG else install.revision()
    outcome = _invoke(runner, args, install.env)
    fix = expected[state]
    if fix is not None:
        _one_line_failure(outcome, fix)
        assert outcome.stdout == ""
        if state == "fresh" and not USE_PG:
            assert not install.data_dir.exists()  # a refusal creates nothing
        else:
            assert install.revision() == before  # and changes nothing
        return
    assert outcome.code == 0, outcome
    if command == "db current":
        shown = {"fresh": "none", "empty": "none", "older": OLDER, "newer": UNKNOWN}[state]
        assert outcome.stdout.startswith(f"current: {shown}"), outcome
        assert outcome.stdout.endswith(f"head: {HEAD}\n"), outcome
        if state == "fresh" and not USE_PG:
            assert not install.data_dir.exists()  # asking creates nothing
        return
    assert install.revision() == AFTER.get(command, HEAD)
    if command == "db upgrade" and state == "older":
        rows = _sync(run_sql(install.url, "SELECT summary FROM decisions"))
        assert rows == [{"summary": "Keep it"}]  # the data is kept


@pytest.mark.parametrize("state", STATES)
def test_import_in_every_state_of_the_database_as_a_process(
    install: Install, tmp_path: Path, state: str
) -> None:
    journal = _journal(tmp_path / "journal", 2)
    install.put_in(state)
    before = None if state == "fresh" and not USE_PG else install.revision()
    outcome = _checked(_subprocess(["import", str(journal)], install.env))
    if state == "older":
        line = _one_line_failure(outcome, f"revision {OLDER}", f"needs {HEAD}", UPGRADE)
        assert line.startswith("Error: the database is at revision")
        assert install.revision() == before
    elif state == "newer":
        _one_line_failure(outcome, NEWER)
        assert install.revision() == before
    else:
        assert outcome.code == 0, outcome
        assert "files 2, new 2, already present 0, failed 0" in outcome.stdout, outcome
        assert "indexed and exported: 4 event(s), 0 to retry" in outcome.stdout, outcome
        assert install.revision() == HEAD


def test_import_of_200_files_on_a_fresh_install_in_one_command(
    install: Install, tmp_path: Path
) -> None:
    journal = _journal(tmp_path / "journal", 200)
    outcome = _checked(_subprocess(["import", str(journal)], install.env))
    assert outcome.code == 0, outcome
    assert "files 200, new 200, already present 0, failed 0" in outcome.stdout, outcome
    assert "indexed and exported: 400 event(s), 0 to retry" in outcome.stdout, outcome
    assert len(list(install.decisions_dir.rglob("*.yaml"))) == 200
    again = _checked(_subprocess(["import", str(journal)], install.env))
    assert again.code == 0 and "new 0, already present 200" in again.stdout, again


CLOSED_PG = "postgresql+asyncpg://cstp:secret@127.0.0.1:{port}/cstp"


@pytest.mark.parametrize(
    "args", [["import", "JOURNAL"], ["db", "upgrade"], ["db", "current"], ["outbox"], ["serve"]]
)
def test_an_unreachable_postgres_is_one_line(
    tmp_path: Path, free_port: int, args: list[str]
) -> None:
    journal = _journal(tmp_path / "journal", 1)
    args = [str(journal) if a == "JOURNAL" else a for a in args]
    env = {
        "CSTP_DATABASE_URL": CLOSED_PG.format(port=free_port),
        "CSTP_DATA_DIR": str(tmp_path / "data"),
    }
    outcome = _checked(_subprocess(args, env))
    if args == ["serve"]:  # the server's own logging (INFO) may come first
        outcome.stderr = outcome.stderr.strip().splitlines()[-1]
    line = _one_line_failure(outcome, f"127.0.0.1:{free_port}/cstp", "connection refused")
    assert "secret" not in line  # credentials are redacted


def test_debug_shows_the_traceback_of_an_unreachable_postgres(
    tmp_path: Path, free_port: int
) -> None:
    env = {
        "CSTP_DATABASE_URL": CLOSED_PG.format(port=free_port),
        "CSTP_DATA_DIR": str(tmp_path / "data"),
    }
    for args, extra in (
        (["--debug", "db", "current"], {}),
        (["db", "current"], {"CSTP_LOG_LEVEL": "debug"}),
    ):
        outcome = _subprocess(args, {**env, **extra})
        assert outcome.code != 0
        assert "Traceback (most recent call last)" in outcome.stderr, outcome
        assert "ConnectionRefusedError" in outcome.stderr, outcome


@pytest.mark.skipif(not USE_PG, reason="needs a Postgres server (CSTP_TEST_DATABASE_URL)")
def test_a_postgres_database_that_does_not_exist_is_one_line(
    runner: CliRunner, tmp_path: Path
) -> None:
    url = with_db(PG_URL, f"cstp_missing_{uuid.uuid4().hex[:8]}")
    env = {"CSTP_DATABASE_URL": url, "CSTP_DATA_DIR": str(tmp_path / "data")}
    for args in (["db", "upgrade"], ["outbox"], ["db", "current"]):
        _one_line_failure(_invoke(runner, args, env), "cannot open the database", "does not exist")


def test_import_with_chroma_out_of_reach_stores_the_rows_and_says_what_is_left(
    runner: CliRunner, install: Install, tmp_path: Path, free_port: int
) -> None:
    journal = _journal(tmp_path / "journal", 3)
    env = {**install.env, "CSTP_CHROMA_URL": f"http://127.0.0.1:{free_port}"}
    outcome = _invoke(runner, ["import", str(journal)], env)
    assert outcome.code == 1, outcome
    assert "files 3, new 3, already present 0, failed 0" in outcome.stdout, outcome
    assert "indexed and exported: 3 event(s), 3 to retry" in outcome.stdout, outcome
    assert "3 event(s) left to retry: `cstp outbox` shows why" in outcome.stderr, outcome
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == len(set(lines)) <= 3, outcome  # new database, progress, what is left
    rows = _sync(run_sql(install.url, "SELECT COUNT(*) AS n FROM decisions"))
    assert rows == [{"n": 3}]
    reindexed = _invoke(runner, ["reindex"], env)
    assert reindexed.code == 1 and reindexed.stderr.startswith("indexing\n"), reindexed
    reindexed.stderr = reindexed.stderr.removeprefix("indexing\n")  # the progress bar's label
    line = _one_line_failure(reindexed, f"127.0.0.1:{free_port}", "CSTP_CHROMA_URL")
    assert "the vector index" in line


def test_a_bug_is_one_line_and_debug_lets_the_traceback_through(
    runner: CliRunner, install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> int:
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr("app.decisions.bulk.export_all", broken)
    outcome = _invoke(runner, ["export"], install.env)
    lines = outcome.stderr.strip().splitlines()
    assert outcome.code == 1 and lines[-1] == (
        "Error: internal error (RuntimeError); run with --debug for the traceback"
    ), outcome
    assert "a bug" not in outcome.stderr
    debug = runner.invoke(main, ["--debug", "export"], env=install.env)
    assert isinstance(debug.exception, RuntimeError)  # python prints its traceback


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["outbox"], {"CSTP_PORT": "x"}, "CSTP_PORT must be a whole number"),
        (["serve"], {"CSTP_LOG_LEVEL": "LOUD"}, "CSTP_LOG_LEVEL must be one of DEBUG, INFO"),
        (["serve"], {"CSTP_LOG_FORMAT": "yaml"}, "CSTP_LOG_FORMAT must be text or json"),
        (["outbox"], {"CSTP_LOG_LEVEL": "LOUD"}, "CSTP_LOG_LEVEL must be one of DEBUG, INFO"),
        (["db", "upgrade"], {"CSTP_DATABASE_URL": "mysql://x"}, "CSTP_DATABASE_URL must start"),
        (["export"], {"CSTP_RATE_LIMITS": "nonsense"}, "CSTP_RATE_LIMITS"),
        (["db", "upgrade", "0999"], {}, "0999"),
        (["import", "NOWHERE"], {}, "no such directory"),
    ],
)
def test_a_mistake_is_one_line(
    runner: CliRunner,
    install: Install,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    fragment: str,
) -> None:
    args = [str(tmp_path / "nowhere") if a == "NOWHERE" else a for a in args]
    _one_line_failure(_invoke(runner, args, {**install.env, **env}), fragment)


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_serve_refuses_a_port_out_of_range(runner: CliRunner, install: Install, port: str) -> None:
    """Not bound modulo 65536, nor left to uvicorn's error: refused before anything starts."""
    outcome = _invoke(runner, ["serve", "--port", port], install.env)
    assert outcome.code == 2, outcome
    assert "Invalid value for '--port'" in outcome.stderr and "1<=x<=65535" in outcome.stderr
    assert "listening" not in outcome.stderr + outcome.stdout


def test_a_client_command_without_its_server_or_token_is_one_line(
    tmp_path: Path, free_port: int
) -> None:
    down = _subprocess(
        ["list"], {"CSTP_URL": f"http://127.0.0.1:{free_port}", "CSTP_TOKEN": "t"}, timeout=60
    )
    _one_line_failure(down, "cannot reach the CSTP server", "connection refused")
    no_token = _subprocess(["list"], {"CSTP_URL": f"http://127.0.0.1:{free_port}"}, timeout=60)
    _one_line_failure(no_token, "no token")
