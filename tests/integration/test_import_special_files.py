"""`cstp import` of a tree holding a named pipe (and a socket) named like a decision file:
each is listed as what it is and skipped, never opened (opening a pipe for reading blocks
until a writer comes: the import hung forever), and the rest of the tree is imported.

The import runs in a thread with a deadline, so the test fails instead of hanging when the
command blocks: after the deadline the test opens the pipe's writing end once, which gives a
reader stuck in open() its end of file and lets the command finish."""

from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from app.config import Settings

GOOD = "decision: Adopt feature flags\ncategory: process\nconfidence: 0.7\ndate: 2025-01-03\n"
DEADLINE = 90.0  # seconds: the import of one file takes a few


def env(settings: Settings) -> dict[str, str]:
    return {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }


def pipe_has_a_reader(path: Path) -> bool:
    """Whether some process holds ``path`` (a named pipe) open for reading now: opening the
    writing end without blocking fails with ENXIO when none does."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)  # the stuck reader now reads end of file
    return True


@pytest.mark.usefixtures("commands_share_the_model")
def test_a_named_pipe_is_listed_and_skipped_never_opened(
    settings: Settings, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    (journal / "2025").mkdir(parents=True)
    (journal / "good.yaml").write_text(GOOD)
    fifo = journal / "2025" / "pipe.yaml"
    os.mkfifo(fifo)
    sock_path = journal / "listening.yml"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))

    outcome: dict[str, Result] = {}

    def run() -> None:
        outcome["result"] = CliRunner().invoke(main, ["import", str(journal)], env=env(settings))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        worker.join(DEADLINE)
        blocked = worker.is_alive()
        if blocked:
            released = pipe_has_a_reader(fifo)
            worker.join(60)
            pytest.fail(
                f"cstp import was still running after {DEADLINE:g} s"
                + (": it was blocked opening the named pipe" if released else "")
            )
    finally:
        listener.close()

    result = outcome["result"]
    assert result.exit_code == 1, result.output  # a file was not imported
    assert "Traceback" not in result.output
    reasons = dict(re.findall(r"could not import (\S+): (.+)", result.output))
    assert reasons == {
        "2025/pipe.yaml": "a named pipe, not a regular file: not read",
        "listening.yml": "a socket, not a regular file: not read",
    }, result.output
    assert "files 3, new 1, already present 0, failed 2" in result.output
    assert not pipe_has_a_reader(fifo)
    exported = [p.read_text() for p in settings.decisions_dir.rglob("*.yaml")]
    assert len(exported) == 1 and "Adopt feature flags" in exported[0]
    assert sock_path.exists()
