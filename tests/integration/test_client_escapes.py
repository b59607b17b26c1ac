"""The terminal client never prints a control character an agent wrote: titles, tags,
projects, contexts, reasons and review notes holding ESC sequences (clear screen, window
title, clipboard), 8-bit C1 codes or bidirectional overrides reach the operator's terminal
as visible escapes (``\\x1b``), in people's output and in ``--json``, through CliRunner and
through a real pipe. Against a real ``cstp serve`` on a free port (SQLite: this is about what
the client prints, not what is stored).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from support.processes import wait_until_up

# Slow: a `cstp serve` process for the module.
pytestmark = pytest.mark.slow

TOKEN = "escape-token"
CSTP = Path(sys.executable).with_name("cstp")

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;owned\x07"  # OSC 0: the window title
CLIPBOARD = "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # OSC 52: write the clipboard
C1_CSI = "\x9b31m"  # the 8-bit CSI some terminals obey
RLO = "\u202e"  # right-to-left override: reorders the rest of the line
DECISION = f"Use a queue{CLEAR}{TITLE}{CLIPBOARD}{C1_CSI}{RLO} for billing retries"
# Any character a terminal may act on, but the newline that ends each printed line.
ACTIVE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("client-escapes")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTP_")}
    env.update(
        {
            "CSTP_DATA_DIR": str(root / "data"),
            "CSTP_DECISIONS_DIR": str(root / "decisions"),
            "CSTP_AUTH_TOKENS": f"alice:{TOKEN}",
            "CSTP_RATE_LIMITS": "default=100000/1",
            "CSTP_LOG_LEVEL": "WARNING",
        }
    )
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(CSTP), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, f"{base}/health", 45.0, lambda: log_path.read_text(errors="replace"))
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cli(server: str) -> Any:
    runner = CliRunner()

    def run(*args: str) -> str:
        result: Result = runner.invoke(
            main, list(args), env={"CSTP_URL": server, "CSTP_TOKEN": TOKEN}
        )
        assert result.exit_code == 0, (result.exit_code, result.output)
        return result.output

    return run


def safe(output: str) -> str:
    found = ACTIVE.search(output)
    assert found is None, f"{found.group()!r} reached the terminal in:\n{output!r}"
    return output


def test_agent_text_reaches_the_terminal_as_visible_escapes(cli: Any, server: str) -> None:
    recorded = json.loads(
        cli(
            "record",
            DECISION,
            "--confidence",
            "0.8",
            "--category",
            "architecture",
            "--context",
            f"Retries pile up\nwhen the provider is down{CLEAR}",
            "--reason",
            f"analysis:Idempotent{TITLE} consumers",
            "--tag",
            f"billing{CLIPBOARD}",
            "--kpi",
            f"retry-rate{C1_CSI}",
            "--project",
            f"pay{RLO}ments",
            "--json",
        )
    )
    decision_id = recorded["id"]
    cli(
        "review",
        decision_id,
        "success",
        "--notes",
        f"Worked{CLEAR}",
        "--lessons",
        f"Queues{TITLE} help",
        "--kpi",
        f"latency{C1_CSI}=-20%",
    )

    listed = safe(cli("list"))
    assert "Use a queue\\x1b[2J\\x1b]0;owned\\x07" in listed, listed

    shown = safe(cli("get", decision_id))
    for visible in (
        "\\x1b]52;c;ZWNobyBvd25lZA==\\x07",  # the clipboard sequence, shown, not obeyed
        "\\x9b31m",
        "pay\\u202ements",
        "Retries pile up when the provider is down\\x1b[2J",  # a newline is a space
        "Idempotent\\x1b]0;owned\\x07 consumers",
        "Worked\\x1b[2J",
        "latency\\x9b",
    ):
        assert visible in shown, (visible, shown)

    found = safe(cli("query", "queue for billing retries", "--reasons"))
    assert decision_id in found and "\\x1b[2J" in found, found
    announced = safe(cli("announce", "Use a queue for billing retries"))
    assert "Similar action succeeded: Use a queue\\x1b[2J" in announced, announced

    # --json: the same strings to a JSON parser, none of them raw in the text
    as_json = safe(cli("get", decision_id, "--json"))
    decision = json.loads(as_json)["decision"]
    assert decision["decision"] == DECISION
    assert decision["project"] == f"pay{RLO}ments"
    assert decision["reviews"][0]["affectedKpis"] == {f"latency{C1_CSI}": "-20%"}
    listed_json = safe(cli("list", "--json"))
    assert json.loads(listed_json)["decisions"][0]["tags"] == [f"billing{CLIPBOARD}"]

    # through a real pipe, as `cstp get ID | less` would read it
    piped = subprocess.run(
        [str(CSTP), "get", decision_id],
        env={**os.environ, "CSTP_URL": server, "CSTP_TOKEN": TOKEN},
        capture_output=True,
        timeout=60,
        check=True,
    )
    text = safe(piped.stdout.decode("utf-8"))
    assert "Use a queue\\x1b[2J\\x1b]0;owned\\x07" in text, text


@pytest.mark.usefixtures("commands_share_the_model")
def test_import_names_a_hostile_file_name_visibly(tmp_path: Path, database_url: str) -> None:
    """A file name is anyone's text: `cstp import` lists a file it cannot read by its name,
    escaped."""
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / f"bad{TITLE}.yaml").write_text("decision: [unclosed\n")
    env = {
        "CSTP_DATABASE_URL": database_url,
        "CSTP_DATA_DIR": str(tmp_path / "data"),
        "CSTP_DECISIONS_DIR": str(tmp_path / "decisions"),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    result = CliRunner().invoke(main, ["import", str(journal)], env=env)
    assert result.exit_code == 1, result.output
    safe(result.output)
    assert "could not import bad\\x1b]0;owned\\x07.yaml: not valid YAML" in result.output
