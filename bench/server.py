"""Run the real server (``cstp serve``) as a subprocess on a free loopback port, and a fresh
Postgres database for it when asked.

The server gets its own process group, so stopping it also stops anything it started; it is
stopped by its own pid/group id only, whatever happened to the harness.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK_DB_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


T = TypeVar("T")


class BenchError(RuntimeError):
    """The benchmark cannot go on (server did not start, a phase ran out of time, ...)."""


def is_working_tree(path: Path) -> bool:
    """Whether ``path`` holds this project's server (``app/cli/``, or ``app/cli.py`` in older
    commits), e.g. a ``git worktree add`` of another commit, for the tools that run two
    versions side by side."""
    app = path / "app"
    return (app / "cli" / "__init__.py").is_file() or (app / "cli.py").is_file()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def server_env(
    base: Mapping[str, str],
    *,
    data_dir: Path,
    decisions_dir: Path,
    token: str,
    port: int,
    database_url: str | None,
    max_batch: int,
    settings: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of the server: the caller's CSTP_* settings are dropped on purpose, so a
    developer's own CSTP_CHROMA_URL or rate limits never leak into the measurement; the
    harness's own ``settings`` (CSTP_* variables) are set last."""
    env = {k: v for k, v in base.items() if not k.startswith("CSTP_")}
    env.update(
        {
            "CSTP_DATA_DIR": str(data_dir),
            "CSTP_DECISIONS_DIR": str(decisions_dir),
            "CSTP_AUTH_TOKENS": f"bench:{token}",
            "CSTP_RATE_LIMITS": "default=1000000000/1",
            "CSTP_LOG_LEVEL": "WARNING",
            "CSTP_HOST": HOST,
            "CSTP_PORT": str(port),
            "CSTP_MAX_BATCH": str(max(50, max_batch)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if database_url:
        env["CSTP_DATABASE_URL"] = database_url
    env.update(settings or {})
    return env


class ServerProcess:
    """``python -m app.cli serve`` (what the ``cstp serve`` script runs) with output to a file."""

    def __init__(
        self, env: Mapping[str, str], port: int, log_path: Path, source: Path = REPO_ROOT
    ) -> None:
        self.env = dict(env)
        self.source = source  # the working tree whose ``app`` package the server runs
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.needed_sigkill = False
        self.stop_seconds: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "serve",
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                ],
                cwd=self.source,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.stop)  # last line of defence if the harness dies unexpectedly

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM to the server's own process group, SIGKILL after ``grace`` seconds.

        uvicorn shuts down gracefully and then re-raises the signal, so -15 is a clean exit."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            start = time.monotonic()
            self._signal(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.needed_sigkill = True
                self._signal(proc.pid, signal.SIGKILL)
                proc.wait(5)
            self.stop_seconds = round(time.monotonic() - start, 2)
        # whatever the server started in its group goes too (the group id is the server's pid)
        self._signal(proc.pid, signal.SIGKILL)
        return proc.returncode

    @staticmethod
    def _signal(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_problems(self) -> list[str]:
        """Lines of the server log that report errors (the log level is WARNING)."""
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return []
        keys = ("ERROR", "CRITICAL", "Traceback", "Exception")
        return [line for line in text.splitlines() if any(k in line for k in keys)]

    async def wait_healthy(
        self,
        timeout: float,  # noqa: ASYNC109 - a deadline the failure reports, with the server's log
    ) -> dict[str, object]:
        """Poll /health until it answers (the server migrates and loads the model first)."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                if not self.running():
                    code = self.proc.returncode if self.proc else None
                    raise BenchError(
                        f"the server exited with code {code} before it was "
                        f"healthy; its log ends with:\n{self.log_tail()}"
                    )
                try:
                    response = await http.get(f"{self.base_url}/health")
                    if response.status_code == 200:
                        return dict(response.json())
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise BenchError(
            f"the server was not healthy within {timeout:.0f} s; its log ends with:\n"
            f"{self.log_tail()}"
        )


# ---- Postgres: one fresh database per run, dropped afterwards ----


def _admin_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def check_database_url(url: str) -> None:
    parts = urlsplit(url)
    if not url.startswith("postgresql+asyncpg://"):
        raise BenchError("--database-url must start with postgresql+asyncpg://")
    if parts.hostname not in LOOPBACK_DB_HOSTS:
        raise BenchError(f"--database-url must point at this machine, not {parts.hostname!r}")


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def create_database(url: str) -> str:
    """Create ``cstp_bench_<random>`` on the server of ``url``; returns its name."""
    import asyncpg

    name = f"cstp_bench_{secrets.token_hex(6)}"
    conn = await asyncpg.connect(_admin_dsn(url), timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name


async def drop_database(url: str, name: str) -> None:
    import asyncpg

    if not name.startswith("cstp_bench_"):
        raise BenchError(f"refusing to drop {name!r}: not a benchmark database")
    conn = await asyncpg.connect(_admin_dsn(url), timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@dataclass
class Prepared:
    """A server ready to start on a fresh temporary data dir (and a fresh Postgres database
    when asked): what both harnesses set up the same way."""

    tmp: Path
    token: str
    server: ServerProcess
    pg_name: str | None
    database: str  # "sqlite" or "postgres:<name>", for the report

    def cstp(self, *args: str) -> str:
        """``cstp ARGS`` on this server's database (its own working tree and settings); its
        stdout. A failure is a BenchError with the end of what it printed."""
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *args],
            cwd=self.server.source,
            env=self.server.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BenchError(f"cstp {args[0]} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def drop_database(self, database_url: str | None, log: Callable[[str], None]) -> None:
        """Drop the Postgres database made for the run, saying so either way."""
        if not (self.pg_name and database_url):
            return
        try:
            asyncio.run(drop_database(database_url, self.pg_name))
            log(f"[postgres] dropped database {self.pg_name}")
        except Exception as exc:  # tell the operator, do not hide it
            log(f"[postgres] could not drop {self.pg_name}: {exc}")

    def run(
        self,
        work: Callable[[Prepared], Coroutine[Any, Any, T]],
        database_url: str | None,
        out: Path,
        log: Callable[[str], None],
    ) -> T | None:
        """``work(self)`` to its end, then the server stopped, its Postgres database dropped
        and its log kept beside ``out`` whatever happened; None when ``work`` stopped with a
        BenchError (said in the log): the single-run harnesses' main."""
        try:
            return asyncio.run(work(self))
        except BenchError as exc:
            log(f"error: {exc}")
            return None
        finally:
            self.server.stop()
            self.drop_database(database_url, log)
            self.finish(out, False, log)

    def finish(self, out: Path, keep_data: bool, log: Callable[[str], None]) -> None:
        """Keep the server's log beside the result; remove the data dir unless asked to keep it."""
        if self.server.log_path.exists():
            shutil.copyfile(self.server.log_path, out.with_suffix(".server.log"))
        if keep_data:
            log(f"[data] kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def prepare_server(
    prefix: str,
    database_url: str | None,
    max_batch: int,
    settings: Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
    source: Path = REPO_ROOT,
) -> Prepared:
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    token = secrets.token_urlsafe(24)
    port = free_port()
    pg_name: str | None = None
    url: str | None = None
    if database_url:
        check_database_url(database_url)
        pg_name = asyncio.run(create_database(database_url))
        url = with_database(database_url, pg_name)
        log(f"[postgres] created database {pg_name}")
    env = server_env(
        os.environ,
        data_dir=tmp / "data",
        decisions_dir=tmp / "decisions",
        token=token,
        port=port,
        database_url=url,
        max_batch=max_batch,
        settings=settings,
    )
    server = ServerProcess(env, port, tmp / "server.log", source)
    return Prepared(tmp, token, server, pg_name, f"postgres:{pg_name}" if pg_name else "sqlite")
