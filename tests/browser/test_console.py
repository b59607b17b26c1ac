"""The console in headless Chromium against a real server (issue #41's acceptance): a
reviewer finds, opens and reviews a decision; an approver approves an escalation from the
inbox; hostile text stays text; forms without their CSRF token, or from a signed-out
session, change nothing; the calibration diagram's points are getCalibration's buckets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from support.console import HOSTILE

from .conftest import Served, Shots

pytestmark = pytest.mark.slow


@pytest.fixture
def person(browser: Any) -> Iterator[Any]:
    """A browser of its own (cookies included) for each person of a test."""
    contexts: list[Any] = []

    def open_page() -> Any:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        contexts.append(context)
        page = context.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.dialogs = dialogs
        return page

    yield open_page
    for context in contexts:
        context.close()


def sign_in(page: Any, served: Served, role: str) -> None:
    page.goto(f"{served.base}/console/login")
    page.get_by_label("Token").fill(served.tokens[role])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/decisions$"))


def nav(page: Any, name: str) -> Any:
    """A link of the page's navigation (by its accessible name)."""
    return page.get_by_role("navigation", name="Pages").get_by_role("link", name=name)


def record(served: Served, text: str, confidence: float = 0.8, **more: Any) -> str:
    params = {"decision": text, "confidence": confidence, "category": "architecture", **more}
    return str(served.rpc("cstp.recordDecision", params)["id"])


def test_a_reviewer_finds_opens_and_reviews_a_decision(
    served: Served, person: Any, shots: Shots
) -> None:
    wanted = record(served, "Shard the invoices table by customer region", 0.7)
    record(served, "Cache the product catalogue in Redis", 0.6)
    page = person()
    sign_in(page, served, "reviewer")
    shots.take(page, "decisions")
    page.get_by_label("Search").fill("invoices")
    page.get_by_role("button", name="Search").click()
    page.get_by_role("link", name=re.compile("Shard the invoices table")).click()
    page.wait_for_url(re.compile(f"/console/decisions/{wanted}"))
    page.get_by_label("Outcome").select_option("partial")
    page.get_by_label("Actual result").fill("Two regions were sharded, the third was not")
    page.get_by_label("Lessons").fill("Plan the migration window per region")
    shots.take(page, "decision")
    page.get_by_role("button", name="Record review").click()
    history = page.locator("#reviews ~ ol .review").first
    assert "partial" in history.inner_text()
    assert "Plan the migration window per region" in history.inner_text()
    assert "human" in history.inner_text()

    reviews = served.rpc("cstp.getDecision", {"id": wanted})["decision"]["reviews"]
    assert [(r["outcome"], r["reviewedBy"], r["source"]) for r in reviews] == [
        ("partial", "rita", "human")
    ]
    assert reviews[0]["lessons"] == "Plan the migration window per region"

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile("/console/login$"))
    page.goto(f"{served.base}/console/decisions/{wanted}")
    assert page.url.endswith("/console/login")  # signed out: no page without signing in again


def test_an_approver_approves_and_the_agent_may_go_on(
    served: Served, person: Any, shots: Shots
) -> None:
    intent = {
        "intent": "Deploy the billing service to production",
        "category": "process",
        "stakes": "high",
        "confidence": 0.8,
        "metadata": {"production": True},
        "correlationId": "deploy-billing-1",
    }
    asked = served.rpc("cstp.announceIntent", intent)
    assert asked["guardrailStatus"]["allowed"] is False
    assert asked["guardrailStatus"]["escalation"]["status"] == "pending"

    page = person()
    sign_in(page, served, "approver")
    nav(page, "Approvals").click()
    card = page.locator("article.approval", has_text="Deploy the billing service to production")
    card.get_by_label("Reason").fill("Release window agreed with the on-call lead")
    shots.take(page, "approvals")
    card.get_by_role("button", name="Approve").click()
    page.wait_for_url(re.compile("/console/approvals$"))
    settled = page.locator("table", has_text="Release window agreed")
    assert "approved" in settled.inner_text() and "abe" in settled.inner_text()

    again = served.rpc("cstp.announceIntent", intent)
    assert again["guardrailStatus"]["allowed"] is True
    assert again["guardrailStatus"]["escalation"]["status"] == "approved"

    # A token without ``approve`` sees no inbox, and its address answers 403.
    other = person()
    sign_in(other, served, "reviewer")
    assert nav(other, "Approvals").count() == 0 and nav(other, "Decisions").count() == 1
    answer = other.goto(f"{served.base}/console/approvals")
    assert answer is not None and answer.status == 403


def test_hostile_text_is_shown_as_text_and_runs_nothing(served: Served, person: Any) -> None:
    hostile = record(served, f"{HOSTILE} Rotate the signing keys monthly")
    page = person()
    sign_in(page, served, "reviewer")
    page.goto(f"{served.base}/console/decisions/{hostile}")
    assert HOSTILE in page.locator("h1").inner_text()
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    page.goto(f"{served.base}/console/decisions?q=signing+keys")
    assert HOSTILE in page.locator("table").inner_text()
    page.wait_for_timeout(300)  # a dialog would open as the page loads
    assert page.dialogs == []


def test_forms_without_their_token_or_session_change_nothing(served: Served, person: Any) -> None:
    target = record(served, "Retire the legacy reporting cron job")
    page = person()
    sign_in(page, served, "reviewer")
    page.goto(f"{served.base}/console/decisions/{target}")
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    form = {"outcome": "failure", "lessons": "forged"}

    forged = page.request.post(f"{served.base}/console/decisions/{target}/review", form=form)
    assert forged.status == 403
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile("/console/login$"))
    late = page.request.post(
        f"{served.base}/console/decisions/{target}/review", form={**form, "csrf": csrf}
    )
    assert late.url.endswith("/console/login")  # redirected to sign in, nothing done
    assert served.rpc("cstp.getDecision", {"id": target})["decision"]["reviews"] == []


def test_the_reliability_diagram_is_get_calibrations_buckets(
    served: Served, person: Any, shots: Shots
) -> None:
    for n, (confidence, outcome) in enumerate(
        [(0.9, "success"), (0.9, "failure"), (0.65, "success"), (0.3, "failure"), (0.35, "success")]
    ):
        made = record(served, f"Calibration sample {n}: pick the queue size", confidence)
        served.rpc("cstp.reviewDecision", {"id": made, "outcome": outcome})
    page = person()
    sign_in(page, served, "agent")
    nav(page, "Calibration").click()
    shots.take(page, "calibration")
    drawn = page.locator("svg#reliability circle.point")
    points = {
        drawn.nth(i).get_attribute("data-bucket"): (
            int(drawn.nth(i).get_attribute("data-count") or 0),
            float(drawn.nth(i).get_attribute("data-confidence") or 0),
            float(drawn.nth(i).get_attribute("data-accuracy") or 0),
        )
        for i in range(drawn.count())
    }
    buckets = served.rpc("cstp.getCalibration", {})["buckets"]
    expected = {
        b["bucket"]: (b["count"], b["meanConfidence"], b["accuracy"])
        for b in buckets
        if b["count"] and b["accuracy"] is not None
    }
    assert points == expected and len(points) >= 3


def test_every_page_of_an_auditor(served: Served, person: Any, shots: Shots) -> None:
    page = person()
    sign_in(page, served, "auditor")
    for name in ("ready", "guardrails", "audit"):
        nav(page, name.capitalize()).click()
        page.wait_for_url(re.compile(f"/console/{name}$"))
        shots.take(page, name)
    page.get_by_role("button", name="Verify the chain").click()
    assert "Chain intact" in page.locator("#verification").inner_text()
    shots.take(page, "audit-verified")
    page.locator("form[action$='/replay'] button").first.click()
    assert "reproduces the stored verdict" in page.locator("main").inner_text()
    shots.take(page, "replay")
    page.goto(f"{served.base}/console/login")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile("/console/login$"))
    shots.take(page, "login")
