"""The console over HTTP (SPEC.md, section 10), on both databases: sessions and their
cookie, CSRF, scopes, escaping, the headers, and that every action is the same audited call
as over JSON-RPC. tests/browser drives the same pages in a real browser."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings, parse_rate_limits
from support.app import AppClient, Rpc
from support.console import ESCALATE_RULES, HOSTILE, cstp, token
from support.waiting import poll_until

pytestmark = pytest.mark.usefixtures("commands_share_the_model")

PAGES = [
    "/console/decisions",
    "/console/decisions/abcd1234",
    "/console/approvals",
    "/console/ready",
    "/console/calibration",
    "/console/guardrails",
    "/console/audit",
]
DEPLOY = {
    "intent": f"Deploy billing {HOSTILE}",
    "category": "process",
    "confidence": 0.8,
    "metadata": {"production": True},
    "correlationId": "deploy-1",
}


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text[:500]
    return found.group(1)


async def sign_in(http: AppClient, token_value: str) -> httpx.Response:
    form = await http.get("/console/login")
    return await http.post("/console/login", data={"token": token_value, "csrf": csrf_of(form)})


async def person(client: AppClient, token_value: str) -> AppClient:
    """A browser of its own (its own cookies), signed in with ``token_value``."""
    http = AppClient(client.app)
    answer = await sign_in(http, token_value)
    assert answer.status_code == 303 and answer.headers["location"] == "/console/decisions"
    return http


async def record(rpc: Rpc, text: str, confidence: float = 0.8, **more: Any) -> str:
    params = {"decision": text, "confidence": confidence, "category": "architecture", **more}
    return str((await rpc.ok("cstp.recordDecision", params))["id"])


@pytest.fixture
def escalating(settings: Settings, tmp_path: Path) -> Settings:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "approvals.yaml").write_text(ESCALATE_RULES, encoding="utf-8")
    return dataclasses.replace(settings, guardrails_dir=rules)


# ---- sessions ---------------------------------------------------------------------------


async def test_without_a_session_every_page_sends_to_sign_in(client: AppClient) -> None:
    for path in PAGES:
        answer = await client.get(path)
        assert (answer.status_code, answer.headers["location"]) == (303, "/console/login"), path
    posted = await client.post("/console/decisions/abcd1234/review", data={"outcome": "success"})
    assert posted.headers["location"] == "/console/login"


async def test_sign_in_sets_a_strict_http_only_cookie_and_shows_no_token(
    client: AppClient,
) -> None:
    answer = await sign_in(client, "token-alice")
    assert answer.status_code == 303
    cookie = next(c for c in answer.headers.get_list("set-cookie") if "cstp_session=" in c)
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/console"} <= flags
    assert any(f.startswith("max-age=") for f in flags)
    assert "secure" not in flags  # plain HTTP here; behind TLS the cookie is Secure
    page = await client.get("/console/decisions")
    assert page.status_code == 200 and "alice" in page.text
    assert "token-alice" not in page.text and "token-alice" not in str(page.url)


async def test_a_bad_token_or_a_forged_sign_in_form_signs_nobody_in(client: AppClient) -> None:
    form = await client.get("/console/login")
    wrong = await client.post("/console/login", data={"token": "nope", "csrf": csrf_of(form)})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    assert "nope" not in wrong.text
    # The sign-in form's value must match its cookie: another site cannot post it.
    stranger = AppClient(client.app)
    forged = await stranger.post("/console/login", data={"token": "token-alice", "csrf": "x"})
    assert forged.status_code == 403
    assert (await stranger.get("/console/decisions")).status_code == 303


async def test_signing_out_ends_the_session_for_a_copied_cookie_too(client: AppClient) -> None:
    await sign_in(client, "token-alice")
    cookie = client.cookies.get("cstp_session")
    page = await client.get("/console/decisions")
    out = await client.post("/console/logout", data={"csrf": csrf_of(page)})
    assert (out.status_code, out.headers["location"]) == (303, "/console/login")
    copied = AppClient(client.app)
    copied.cookies.set("cstp_session", cookie or "", path="/console")
    assert (await copied.get("/console/decisions")).headers["location"] == "/console/login"


async def test_a_revoked_token_ends_its_sessions(client: AppClient, database_url: str) -> None:
    made = json.loads(await cstp(database_url, "tokens", "create", "--agent", "tim", "--json"))
    http = await person(client, made["token"])
    assert (await http.get("/console/ready")).status_code == 200
    await cstp(database_url, "tokens", "revoke", made["id"])

    async def out() -> tuple[bool, Any]:
        answer = await http.get("/console/ready")
        return answer.status_code == 303, answer.status_code

    await poll_until(out, 5, "the revoked token's session to end")


# ---- forms --------------------------------------------------------------------------------


async def test_a_review_in_the_console_is_a_human_review_by_the_token_agent(
    client: AppClient, rpc: Rpc, database_url: str
) -> None:
    decision = await record(rpc, "Use a queue for the mail jobs")
    http = await person(client, await token(database_url, "rita", "--role", "reviewer"))
    page = await http.get(f"/console/decisions/{decision}")
    assert 'name="outcome"' in page.text and "Record review" in page.text
    form = {"csrf": csrf_of(page), "outcome": "failure", "lessons": "Queues need a dead letter"}
    done = await http.post(f"/console/decisions/{decision}/review", data=form)
    assert done.headers["location"] == f"/console/decisions/{decision}#reviews"
    got = (await rpc.ok("cstp.getDecision", {"id": decision}))["decision"]
    assert [(r["outcome"], r["reviewedBy"], r["source"]) for r in got["reviews"]] == [
        ("failure", "rita", "human")
    ]
    shown = (await http.get(f"/console/decisions/{decision}")).text
    assert "Queues need a dead letter" in shown and "human" in shown
    # The call is audited and chained like any other: the chain still verifies.
    assert "ok" in await cstp(database_url, "audit", "verify")


async def test_a_form_without_its_csrf_token_changes_nothing(client: AppClient, rpc: Rpc) -> None:
    decision = await record(rpc, "Retire the reporting cron job")
    http = await person(client, "token-alice")
    other = await person(client, "token-alice")  # a second session of the same token
    theirs = csrf_of(await other.get(f"/console/decisions/{decision}"))
    for form in ({"outcome": "success"}, {"outcome": "success", "csrf": theirs}):
        answer = await http.post(f"/console/decisions/{decision}/review", data=form)
        assert answer.status_code == 403 and "did not come from your current session" in answer.text
    got = (await rpc.ok("cstp.getDecision", {"id": decision}))["decision"]
    assert got["reviews"] == []


async def test_forms_are_held_to_the_apis_limits(client: AppClient, rpc: Rpc) -> None:
    decision = await record(rpc, "Split the monolith's billing module")
    http = await person(client, "token-alice")
    csrf = csrf_of(await http.get(f"/console/decisions/{decision}"))
    long = {"csrf": csrf, "outcome": "success", "lessons": "x" * 20_001}
    refused = await http.post(f"/console/decisions/{decision}/review", data=long)
    assert refused.status_code == 400 and "lessons" in refused.text
    bad = await http.post(
        f"/console/decisions/{decision}/review", data={"csrf": csrf, "outcome": "great"}
    )
    assert bad.status_code == 400 and "outcome" in bad.text
    huge = await http.post(
        f"/console/decisions/{decision}/review", data={"csrf": csrf, "lessons": "y" * 2_000_000}
    )
    assert huge.status_code == 413
    assert (await rpc.ok("cstp.getDecision", {"id": decision}))["decision"]["reviews"] == []


async def test_the_consoles_calls_share_the_agents_rate_limit(
    settings: Settings, embedder: Any
) -> None:
    from app.asgi import create_app
    from support.app import serve_app

    limited = dataclasses.replace(
        settings, rate_limits=parse_rate_limits("default=100000/1,cstp.listDecisions=2/60")
    )
    async with serve_app(create_app(limited, embedder=embedder)) as http:
        await sign_in(http, "token-alice")
        codes = [(await http.get("/console/decisions")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        rpc = await Rpc(http).error("cstp.listDecisions", {})
        assert rpc["code"] == -32002  # the same budget, spent in the console


# ---- scopes, approvals -------------------------------------------------------------------


async def test_an_approver_decides_in_the_inbox_and_the_agent_goes_on(
    escalating: Settings, embedder: Any, database_url: str
) -> None:
    from app.asgi import create_app
    from support.app import serve_app

    async with serve_app(create_app(escalating, embedder=embedder)) as client:
        rpc = Rpc(client)
        asked = (await rpc.ok("cstp.announceIntent", DEPLOY))["guardrailStatus"]
        approval = asked["escalation"]["approvalId"]
        approver = await person(client, await token(database_url, "abe", "--role", "approver"))
        inbox = await approver.get("/console/approvals")
        assert inbox.status_code == 200 and html.escape(HOSTILE) in inbox.text
        assert HOSTILE not in inbox.text
        form = {"csrf": csrf_of(inbox), "verdict": "approve", "reason": "Window agreed"}
        done = await approver.post(f"/console/approvals/{approval}", data=form)
        assert done.headers["location"] == "/console/approvals"
        again = (await rpc.ok("cstp.announceIntent", DEPLOY))["guardrailStatus"]
        assert again["allowed"] is True and again["escalation"]["status"] == "approved"
        got = (await rpc.ok("cstp.getApproval", {"id": approval}))["approval"]
        assert (got["decidedBy"], got["reason"]) == ("abe", "Window agreed")
        twice = await approver.post(f"/console/approvals/{approval}", data=form)
        assert twice.status_code == 409  # decided: -32008, as over JSON-RPC

        # Without ``approve``: no inbox in the navigation, 403 on its address and its form.
        agent = await person(client, "token-alice")
        page = await agent.get("/console/decisions")
        assert 'href="/console/approvals"' not in page.text
        assert (await agent.get("/console/approvals")).status_code == 403
        form["csrf"] = csrf_of(page)
        assert (await agent.post(f"/console/approvals/{approval}", data=form)).status_code == 403


async def test_audit_pages_need_the_audit_scope(
    client: AppClient, rpc: Rpc, database_url: str
) -> None:
    intent = {"intent": "Pin the base image digest", "category": "tooling", "correlationId": "i-1"}
    await rpc.ok("cstp.announceIntent", intent)
    decision = await record(rpc, "Pin the base image digest", correlationId="i-1")
    agent = await person(client, "token-alice")
    assert (await agent.get("/console/audit")).status_code == 403
    assert "Linked intent" not in (await agent.get(f"/console/decisions/{decision}")).text
    auditor = await person(client, await token(database_url, "aud", "--role", "auditor"))
    audit = await auditor.get("/console/audit")
    assert audit.status_code == 200 and "Entries of this workspace" in audit.text
    verified = await auditor.post("/console/audit/verify", data={"csrf": csrf_of(audit)})
    assert verified.status_code == 200 and "Chain intact" in verified.text
    linked = (await auditor.get(f"/console/decisions/{decision}")).text
    assert "Linked intent" in linked and "No announcement is linked" not in linked
    chain = linked[linked.index("Audit chain entries") :]
    assert chain.count("<td>decisions</td>") == 1 and "holds" in chain
    assert "/replay" in linked  # its guardrail evaluation, with a replay button
    evaluation = re.search(r'action="(/console/evaluations/[^/"]+/replay)"', linked)
    assert evaluation is not None
    replayed = await auditor.get(evaluation.group(1))
    assert "reproduces the stored verdict" in replayed.text


async def test_another_workspaces_decision_is_not_found(
    client: AppClient, rpc: Rpc, database_url: str
) -> None:
    decision = await record(rpc, "Move the logs to object storage")
    other = await person(client, await token(database_url, "wes", "--workspace", "team-b"))
    answer = await other.get(f"/console/decisions/{decision}")
    assert answer.status_code == 404
    listed = await other.get("/console/decisions?q=object+storage")
    assert decision not in listed.text


# ---- pages ---------------------------------------------------------------------------------


async def test_caller_text_is_escaped_and_the_headers_forbid_scripts_and_frames(
    client: AppClient, rpc: Rpc
) -> None:
    decision = await record(rpc, f"{HOSTILE} Rotate the signing keys", tags=["<b>t</b>"])
    http = await person(client, "token-alice")
    for path in (
        f"/console/decisions/{decision}",
        "/console/decisions?q=signing+keys",
        "/console/decisions",
        f"/console/decisions?category={HOSTILE}",
    ):
        page = await http.get(path)
        assert HOSTILE not in page.text and "<b>t</b>" not in page.text, path
        if page.status_code == 200:
            assert html.escape(HOSTILE) in page.text, path
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src" not in policy
        assert page.headers["x-frame-options"] == "DENY"
    login = await AppClient(client.app).get("/console/login")
    assert login.headers["x-frame-options"] == "DENY"
    assert "<script" not in login.text
    # error pages, redirects and the stylesheet too, not only the pages a handler renders
    stranger = AppClient(client.app)
    for answer in (
        await http.get("/console/audit"),  # 403: no audit scope
        await http.get("/console/decisions/nothere1"),  # 404
        await stranger.get("/console/ready"),  # 303 to sign in
        await stranger.get("/console/static/console.css"),
    ):
        assert answer.status_code in (200, 303, 403, 404), answer
        assert answer.headers["x-frame-options"] == "DENY", answer
        assert "default-src 'none'" in answer.headers["content-security-policy"], answer


async def test_search_filters_and_paging(client: AppClient, rpc: Rpc) -> None:
    for n in range(30):
        await record(rpc, f"Tune the worker pool, step {n}", stakes="low")
    found = await record(rpc, "Adopt zstd compression for the event archive", stakes="high")
    http = await person(client, "token-alice")
    first = await http.get("/console/decisions")
    assert "31 decisions, page 1 of 2" in first.text and 'rel="next"' in first.text
    second = await http.get("/console/decisions?page=2")
    assert "page 2 of 2" in second.text and 'rel="prev"' in second.text
    searched = await http.get("/console/decisions?q=zstd+compression")
    assert f"/console/decisions/{found}" in searched.text
    high = await http.get("/console/decisions?stakes=high")
    assert "1 decision" in high.text and f"/console/decisions/{found}" in high.text
    bad = await http.get("/console/decisions?stakes=enormous")
    assert bad.status_code == 400 and "stakes" in bad.text
    assert (await http.get("/console/decisions?page=zero")).status_code == 200
    assert (await http.get("/console/decisions/nothere1")).status_code == 404


async def test_the_calibration_diagram_draws_get_calibrations_buckets(
    client: AppClient, rpc: Rpc
) -> None:
    for confidence, outcome in [(0.9, "success"), (0.9, "failure"), (0.6, "success")]:
        made = await record(rpc, f"Pick a cache size at {confidence}", confidence)
        await rpc.ok("cstp.reviewDecision", {"id": made, "outcome": outcome})
    http = await person(client, "token-alice")
    page = (await http.get("/console/calibration")).text
    svg = page[page.index('<svg id="reliability"') : page.index("</svg>")]
    drawn = {
        m["bucket"]: (int(m["count"]), float(m["confidence"]), float(m["accuracy"]))
        for m in re.finditer(
            r'data-bucket="(?P<bucket>[^"]+)" data-count="(?P<count>\d+)" '
            r'data-confidence="(?P<confidence>[^"]+)" data-accuracy="(?P<accuracy>[^"]+)"',
            svg,
        )
    }
    buckets = (await rpc.ok("cstp.getCalibration", {}))["buckets"]
    assert drawn == {
        b["bucket"]: (b["count"], b["meanConfidence"], b["accuracy"]) for b in buckets if b["count"]
    }
    assert len(drawn) == 2
    over_time = page[page.index('<svg id="brier-over-time"') :]
    assert 'data-brier="' in over_time  # this month's point
