"""A real server and a real browser for the console's tests (SPEC.md, section 10).

One ``cstp serve`` process per module, on a SQLite file of its own, with an escalate rule and
tokens of every role made by ``cstp tokens create``; headless Chromium from the system's
``chromium`` package, driven by Playwright (never a browser Playwright downloads).

Without a browser on the machine the tests are skipped with the reason, unless
``CSTP_REQUIRE_BROWSER`` is set (``.ci/run`` sets it once it has installed one): then they fail.
``CSTP_CONSOLE_SCREENSHOTS=DIR`` saves a screenshot of each page into DIR as the tests pass
through it (``python3 dev.py screenshots`` regenerates docs/console/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.console import ESCALATE_RULES
from support.processes import CSTP, cstp_servers

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROLES = {"reviewer": "rita", "approver": "abe", "auditor": "aud"}


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Served:
    base: str
    folder: Path
    tokens: dict[str, str]  # role (or "agent") -> token

    def rpc(self, method: str, params: dict[str, Any], role: str = "agent") -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        answer = httpx.post(f"{self.base}/cstp", json=body, headers=headers, timeout=60).json()
        assert "result" in answer, answer
        return answer["result"]


def _cstp(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(CSTP), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("console")
    rules = folder / "rules"
    rules.mkdir()
    (rules / "approvals.yaml").write_text(ESCALATE_RULES, encoding="utf-8")
    env = {
        "CSTP_DATABASE_URL": f"sqlite+aiosqlite:///{folder / 'cstp.db'}",
        "CSTP_AUTH_TOKENS": "alice:token-alice",
        "CSTP_RATE_LIMITS": "default=100000/1",
        "CSTP_DATA_DIR": str(folder / "data"),
        "CSTP_DECISIONS_DIR": str(folder / "decisions"),
        "CSTP_GUARDRAILS_DIR": str(rules),
        "CSTP_LOG_LEVEL": "WARNING",
        "CSTP_AUDIT_KEY": "",
    }
    _cstp(env, "db", "upgrade")
    tokens = {"agent": "token-alice"}
    for role, agent in ROLES.items():
        made = _cstp(env, "tokens", "create", "--agent", agent, "--role", role, "--json")
        tokens[role] = json.loads(made)["token"]
    with cstp_servers(folder, [env]) as bases:
        yield Served(bases[0], folder, tokens)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        if os.environ.get("CSTP_REQUIRE_BROWSER"):
            pytest.fail("no chromium on this machine, and CSTP_REQUIRE_BROWSER is set")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@dataclass
class Shots:
    folder: Path | None

    def take(self, page: Any, name: str) -> None:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(self.folder / f"{name}.png"), full_page=True)


@pytest.fixture(scope="session")
def shots() -> Shots:
    folder = os.environ.get("CSTP_CONSOLE_SCREENSHOTS")
    return Shots(Path(folder) if folder else None)
