"""Outcomes observed by CI (SPEC.md, section 9): ``cstp webhooks ci-secret`` and
``POST /hooks/ci/<workspace>``, signed with the ``standardwebhooks`` library as a CI job would.

A signed report reviews exactly the unreviewed decisions of its workspace with its ``pr``
(source ``ci``, reviewedBy ``ci``), chained and verified by ``cstp audit verify``; a replay, a
bad signature, a stale timestamp, an unknown workspace, a workspace without a secret and a
malformed body change nothing (every table compared before and after); one delivery sent at
once to two apps on one database (two processes' pools) reviews once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from app.asgi import create_app
from app.ci import hook
from app.cli import main
from app.config import Settings
from app.db import migrate
from app.db.base import Base
from app.search.embedder import Embedder
from app.webhooks.secrets import new_secret
from support.app import AppClient, Rpc, add_token, serve_app
from support.waiting import poll_until

pytestmark = pytest.mark.usefixtures("commands_share_the_model")

REFUSED = {"error": "unauthorized", "message": "the CI report was not accepted"}
OTHER_TOKEN = "token-carol"


# ---- helpers ------------------------------------------------------------------------------------


async def cstp(settings: Settings, *args: str) -> Result:
    """``cstp ARGS`` in this process, on the test's database and data directory (the app's
    webhook key file)."""
    env: dict[str, str | None] = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_WEBHOOK_KEY": None,
        "CSTP_AUDIT_KEY": None,
        "CSTP_AUDIT_KEY_FILE": None,
    }
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


async def ci_secret(settings: Settings, workspace: str) -> str:
    result = await cstp(settings, "webhooks", "ci-secret", "--workspace", workspace, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert list(shown) == ["secret"]
    secret: str = shown["secret"]
    return secret


async def report(
    client: AppClient,
    workspace: str,
    secret: str,
    msg_id: str,
    body: Any,
    *,
    at: datetime | None = None,
    sent: bytes | None = None,
) -> Any:
    """POST a report signed as Standard Webhooks says (``sent``: other bytes than the signed
    ones, to tamper with them)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    at = at or datetime.now(UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, raw),
        "content-type": "application/json",
    }
    return await client.post(f"/hooks/ci/{workspace}", content=sent or raw, headers=headers)


async def record(rpc: Rpc, text_: str, pr: int | None, token: str | None = None) -> str:
    params: dict[str, Any] = {"decision": text_, "confidence": 0.7, "category": "process"}
    if pr is not None:
        params["pr"] = pr
    return str((await rpc.ok("cstp.recordDecision", params, token))["id"])


async def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the schema, in a fixed order."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            tables = {}
            for table in Base.metadata.sorted_tables:
                keys = ", ".join(c.name for c in table.primary_key.columns)
                rows = await conn.execute(text(f"SELECT * FROM {table.name} ORDER BY {keys}"))
                tables[table.name] = [tuple(map(repr, row)) for row in rows]
            return tables
    finally:
        await engine.dispose()


async def settled(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The snapshot once every outbox event is done (the relay's results are recorded a
    moment after its pass)."""

    async def done() -> tuple[bool, Any]:
        now = await snapshot(url)
        waiting = [e for e in now["outbox_events"] if "'done'" not in e]
        return not waiting, waiting or now

    found: dict[str, list[tuple[Any, ...]]] = await poll_until(done, 10, "the outbox done")
    return found


async def decision(rpc: Rpc, decision_id: str, token: str | None = None) -> dict[str, Any]:
    got: dict[str, Any] = (await rpc.ok("cstp.getDecision", {"id": decision_id}, token))["decision"]
    return got


@pytest.fixture
def other(client: AppClient) -> str:
    """A token of workspace ``other``."""
    return add_token(client, OTHER_TOKEN, "carol", "agent", workspace="other")


# ---- the acceptance -----------------------------------------------------------------------------


async def test_a_signed_report_reviews_its_prs_unreviewed_decisions_and_nothing_else(
    client: AppClient, rpc: Rpc, settings: Settings, database_url: str, other: str
) -> None:
    secret = await ci_secret(settings, "default")
    other_secret = await ci_secret(settings, "other")
    assert secret.startswith("whsec_") and other_secret != secret

    first = await record(rpc, "Split the importer into two stages", 42)
    second = await record(rpc, "Cache the parsed rule files", 42)
    claimed = await record(rpc, "Retry the index upsert", 42)
    await rpc.ok("cstp.reviewDecision", {"id": claimed, "outcome": "partial"})
    elsewhere = await record(rpc, "Rename the export module", 7)
    no_pr = await record(rpc, "Keep the old CLI flag", None)
    theirs = await record(rpc, "Use a queue for the mails", 42, other)
    before = await settled(database_url)

    body = {"pr": 42, "status": "failure", "url": "https://ci.example/run/9", "commit": "abc1234"}
    answer = await report(client, "default", secret, "msg_1", body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"reviewed": sorted([first, second])}

    for d in (first, second):
        got = await decision(rpc, d)
        assert got["outcome"] == "failure" and got["status"] == "reviewed"
        (review,) = got["reviews"]
        assert review["source"] == "ci" and review["reviewedBy"] == "ci"
        assert review["outcome"] == "failure"
        for part in ("failure", "42", "https://ci.example/run/9", "abc1234"):
            assert part in review["actualResult"]
    kept = await decision(rpc, claimed)
    assert kept["outcome"] == "partial" and [r["source"] for r in kept["reviews"]] == ["agent"]
    for d in (elsewhere, no_pr):
        assert (await decision(rpc, d))["outcome"] is None
    assert (await decision(rpc, theirs, other))["outcome"] is None

    # exactly the reviews (with their chain entries and outbox events) and the id were added
    after = await settled(database_url)
    changed = {t for t in after if after[t] != before[t]}
    assert changed == {
        "decisions",
        "decision_reviews",
        "audit_chain",
        "outbox_events",
        "ci_deliveries",
    }
    assert len(after["decision_reviews"]) == len(before["decision_reviews"]) + 2
    assert len(after["ci_deliveries"]) == 1
    # the YAML files show the CI review (the outbox pass after the commit)
    files = list(settings.decisions_dir.rglob(f"*{first}*.yaml"))
    assert len(files) == 1
    assert "outcome: failure" in files[0].read_text() and "reviewed_by: ci" in files[0].read_text()

    # a decision of pr 42 recorded since, so a replay would have something to review
    late = await record(rpc, "Drop the legacy endpoint", 42)
    unchanged = await settled(database_url)
    now = datetime.now(UTC)
    refusals = {
        "a replay": await report(client, "default", secret, "msg_1", body),
        "a replay, signed anew": await report(client, "default", secret, "msg_1", body, at=now),
        "another secret": await report(client, "default", new_secret(), "msg_2", body),
        "another workspace's secret": await report(client, "default", other_secret, "m3", body),
        "a body changed after signing": await report(
            client, "default", secret, "msg_4", body, sent=json.dumps({**body, "pr": 7}).encode()
        ),
        "10 minutes old": await report(
            client, "default", secret, "msg_5", body, at=now - timedelta(minutes=10)
        ),
        "10 minutes ahead": await report(
            client, "default", secret, "msg_6", body, at=now + timedelta(minutes=10)
        ),
        "a workspace without a CI secret": await report(client, "empty", secret, "msg_7", body),
        "not a workspace id": await report(client, "Not_A_Workspace", secret, "msg_8", body),
    }
    unsigned = await client.post("/hooks/ci/default", json=body)
    refusals["no signature headers"] = unsigned
    for why, refused in refusals.items():
        assert (refused.status_code, refused.json()) == (401, REFUSED), why
    assert await snapshot(database_url) == unchanged
    assert (await decision(rpc, late))["outcome"] is None

    # a new delivery is taken, and reviews what is left of pr 42
    answer = await report(client, "default", secret, "msg_9", {"pr": 42, "status": "success"})
    assert answer.json() == {"reviewed": [late]}
    review = (await decision(rpc, late))["reviews"][0]
    assert review["actualResult"] == "CI reported success for pull request 42"
    assert (await decision(rpc, theirs, other))["outcome"] is None
    await settled(database_url)

    verified = await cstp(settings, "audit", "verify")
    assert verified.exit_code == 0, verified.output
    assert await migrate.drift(database_url) == []


async def test_a_malformed_report_with_a_valid_signature_is_400_and_changes_nothing(
    client: AppClient, rpc: Rpc, settings: Settings, database_url: str
) -> None:
    secret = await ci_secret(settings, "default")
    target = await record(rpc, "Pin the parser version", 5)
    before = await settled(database_url)
    bodies: list[Any] = [
        b"not json",
        b"[1, 2]",
        {"status": "success"},
        {"pr": 5},
        {"pr": "5", "status": "success"},
        {"pr": 5.0, "status": "success"},
        {"pr": True, "status": "success"},
        {"pr": -1, "status": "success"},
        {"pr": 5, "status": "cancelled"},
        {"pr": 5, "status": "success", "url": "javascript:alert(1)"},
        {"pr": 5, "status": "success", "url": "https://ci.example/a b"},
        {"pr": 5, "status": "success", "commit": "not-a-sha"},
    ]
    for n, body in enumerate(bodies):
        answer = await report(client, "default", secret, f"bad_{n}", body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"] == "bad_request"
    long_id = await report(client, "default", secret, "x" * 129, {"pr": 5, "status": "success"})
    assert long_id.status_code == 400
    assert await snapshot(database_url) == before
    assert (await decision(rpc, target))["outcome"] is None
    # the ids of the refused bodies were not taken
    ok = await report(client, "default", secret, "bad_0", {"pr": 5, "status": "success"})
    assert ok.json() == {"reviewed": [target]}


async def test_the_timestamp_tolerance_is_five_minutes() -> None:
    """The library's tolerance, which the hook relies on (hook.TOLERANCE): checked here, so
    that a new version of it that changed it is noticed."""
    assert timedelta(minutes=5) == hook.TOLERANCE
    secret, body = new_secret(), b'{"pr": 1, "status": "success"}'
    now = datetime.now(UTC)

    def verify(at: datetime) -> None:
        headers = {
            "webhook-id": "m",
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": Webhook(secret).sign("m", at, body),
        }
        Webhook(secret).verify(body, headers, json_parse=False)

    verify(now - hook.TOLERANCE + timedelta(seconds=20))
    verify(now + hook.TOLERANCE - timedelta(seconds=20))
    for at in (
        now - hook.TOLERANCE - timedelta(seconds=2),
        now + hook.TOLERANCE + timedelta(seconds=2),
    ):
        with pytest.raises(WebhookVerificationError):
            verify(at)
    assert hook.KEEP_IDS > 2 * hook.TOLERANCE


async def test_a_report_four_minutes_old_is_taken(
    client: AppClient, rpc: Rpc, settings: Settings
) -> None:
    secret = await ci_secret(settings, "default")
    target = await record(rpc, "Move the cron to the queue", 8)
    at = datetime.now(UTC) - timedelta(minutes=4)
    answer = await report(client, "default", secret, "late", {"pr": 8, "status": "success"}, at=at)
    assert answer.json() == {"reviewed": [target]}


async def test_rotating_the_secret_retires_the_old_one(
    client: AppClient, rpc: Rpc, settings: Settings
) -> None:
    old = await ci_secret(settings, "default")
    new = await ci_secret(settings, "default")
    assert old != new
    target = await record(rpc, "Serve the docs from the app", 3)
    body = {"pr": 3, "status": "success"}
    refused = await report(client, "default", old, "r1", body)
    assert refused.status_code == 401
    assert (await report(client, "default", new, "r2", body)).json() == {"reviewed": [target]}
    # the stored secret is sealed: neither secret's text is in the database
    stored = await snapshot(settings.database_url)
    assert not any(new in cell or old in cell for row in stored["ci_secrets"] for cell in row)
    # text output: the secret on stdout, the advice on stderr
    shown = await cstp(settings, "webhooks", "ci-secret", "--workspace", "default")
    assert shown.exit_code == 0 and re.fullmatch(r"secret: whsec_\S+\n", shown.stdout)
    assert "shown once" in shown.stderr
    bad = await cstp(settings, "webhooks", "ci-secret", "--workspace", "Bad_WS")
    assert bad.exit_code != 0 and "Traceback" not in bad.output


async def test_a_body_over_the_cap_is_413(client: AppClient, settings: Settings) -> None:
    secret = await ci_secret(settings, "default")
    big = {"pr": 1, "status": "success", "padding": "x" * settings.max_body_bytes}
    answer = await report(client, "default", secret, "big", big)
    assert answer.status_code == 413


@pytest.fixture
async def second_app(settings: Settings, embedder: Embedder) -> AsyncIterator[AppClient]:
    """Another app on the same database: a second server process's pool and engines."""
    async with serve_app(create_app(settings, embedder=embedder)) as http:
        yield http


async def test_one_delivery_sent_to_two_servers_at_once_reviews_once(
    client: AppClient, second_app: AppClient, rpc: Rpc, settings: Settings, database_url: str
) -> None:
    secret = await ci_secret(settings, "default")
    targets = sorted([await record(rpc, f"Shard the queue, step {n}", 11) for n in range(3)])
    body = json.dumps({"pr": 11, "status": "success"}).encode()
    at = datetime.now(UTC)
    answers = await asyncio.gather(
        *(
            report(app, "default", secret, "once", body, at=at)
            for app in (client, second_app, client, second_app, client, second_app)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 401, 401, 401, 401, 401]
    (taken,) = [a for a in answers if a.status_code == 200]
    assert taken.json() == {"reviewed": targets}
    for d in targets:
        assert len((await decision(rpc, d))["reviews"]) == 1
    stored = await snapshot(database_url)
    assert len(stored["ci_deliveries"]) == 1
    verified = await cstp(settings, "audit", "verify")
    assert verified.exit_code == 0, verified.output


# ---- the documented sending script --------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
FAKE_CURL = """#!/bin/sh
# Records the request it was asked to send (arguments NUL-separated), sends nothing.
for arg in "$@"; do printf '%s\\0' "$arg"; done > "$CURL_ARGS"
echo '{"reviewed":[]}'
"""


def documented_script() -> str:
    """The bash block of docs/OPERATIONS.md that follows its ci-report.sh marker."""
    after = DOCS.read_text().split("<!-- ci-report.sh:", 1)[1]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block is not None
    return block.group(1)


async def test_the_documented_script_signs_a_report_the_server_takes(
    client: AppClient, rpc: Rpc, settings: Settings, tmp_path: Path
) -> None:
    """The script of docs/OPERATIONS.md, run by bash with openssl, with a ``curl`` that only
    records the request; that request, sent to the app, is taken."""
    secret = await ci_secret(settings, "default")
    target = await record(rpc, "Bundle the fonts", 77)
    script = tmp_path / "cstp-report.sh"
    script.write_text(documented_script())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(FAKE_CURL)
    (bin_dir / "curl").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CSTP_URL": "http://cstp.invalid",
        "CSTP_WORKSPACE": "default",
        "CSTP_CI_SECRET": secret,
        "CURL_ARGS": str(tmp_path / "curl-args"),
    }
    run = await asyncio.to_thread(
        subprocess.run,
        ["bash", str(script), "77", "failure", "https://ci.example/r/5", "0a1b2c3d"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    args = (tmp_path / "curl-args").read_bytes().decode().split("\0")[:-1]
    headers = dict(args[i + 1].split(": ", 1) for i, arg in enumerate(args) if arg == "-H")
    body = args[args.index("--data-binary") + 1]
    assert args[-1] == "http://cstp.invalid/hooks/ci/default"
    answer = await client.post("/hooks/ci/default", content=body.encode(), headers=headers)
    assert answer.json() == {"reviewed": [target]}
    review = (await decision(rpc, target))["reviews"][0]
    assert review["actualResult"] == (
        "CI reported failure for pull request 77 at commit 0a1b2c3d: https://ci.example/r/5"
    )
    again = await client.post("/hooks/ci/default", content=body.encode(), headers=headers)
    assert again.status_code == 401
