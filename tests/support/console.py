"""What the console's tests share: an escalate rule to approve, a hostile decision text, and
the `cstp` commands that make their tokens."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from app.cli import main

#: A production deploy escalates: an approval for the inbox.
ESCALATE_RULES = """
guardrails:
  - id: prod-deploy
    description: A production deploy needs a person's approval
    action: escalate
    timeout: 2h
    conditions:
      - {field: production, operator: "==", value: true}
    message: A production deploy needs approval
"""

#: Text that would run if a page did not escape it.
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


async def cstp(url: str, *args: str) -> str:
    """``cstp ARGS`` in this process (a thread: the command runs its own event loop) on the
    test's database, without an audit key (as the test app); its stdout, once it succeeded."""
    env = {"CSTP_DATABASE_URL": url, "CSTP_AUDIT_KEY": None, "CSTP_AUDIT_KEY_FILE": None}
    done = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    assert done.exit_code == 0, done.output
    return str(done.stdout)


async def token(url: str, agent: str, *args: str) -> str:
    """The secret of a token made by ``cstp tokens create --agent AGENT ARGS``."""
    made = await cstp(url, "tokens", "create", "--agent", agent, *args, "--json")
    return str(json.loads(made)["token"])
