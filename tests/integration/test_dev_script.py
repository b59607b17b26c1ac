"""``python3 dev.py serve``, stopped as a process manager or a script stops it (SIGTERM to the
process it started): the server itself must stop and free its port, not live on as an
orphaned child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import httpx
import pytest

from support.processes import wait_until_up
from support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=0.5)
    except httpx.HTTPError:
        return False
    return True


def test_sigterm_to_dev_serve_stops_the_server(tmp_path: Path, free_port: int) -> None:
    env = {
        **os.environ,
        "CSTP_DATA_DIR": str(tmp_path / "data"),
        "CSTP_DECISIONS_DIR": str(tmp_path / "decisions"),
        "CSTP_AUTH_TOKENS": "dev:dev-token-for-the-test",
    }
    env.pop("CSTP_DATABASE_URL", None)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "serve", "--port", str(free_port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # so the cleanup below can reach every process it started
    )
    url = f"http://127.0.0.1:{free_port}/health"
    try:
        wait_until_up(proc, url, timeout=120)
        proc.send_signal(signal.SIGTERM)  # to the process the user started, only
        proc.wait(timeout=30)
        wait_until(lambda: (not _answers(url), None), 10, "the port to be freed", interval=0.2)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
