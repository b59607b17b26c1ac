"""The pages of the people around the agents (SPEC.md, section 10): the approvals inbox,
the ready queue, calibration, guardrails and the audit trail's state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath
from litestar.response import Redirect, Template

from app.audit import live
from app.scopes import APPROVE, AUDIT, REVIEW_ANY

from . import charts
from . import repository as reads
from .core import Console, Refused, page, see_other

MONTHS = 12  # Brier over time: this many calendar months, the current one last
INBOX = 100  # pending approvals shown at once (oldest deadline first)
SETTLED = 25  # decided and expired approvals shown below them


@get("/approvals")
async def approvals(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    console.require(person, APPROVE)
    pending = await console.call(
        person, "cstp.listApprovals", {"status": "pending", "limit": INBOX}
    )
    recent = await console.call(person, "cstp.listApprovals", {"limit": SETTLED + INBOX})
    settled = [a for a in recent["approvals"] if a["status"] != "pending"][:SETTLED]
    waiting = sorted(pending["approvals"], key=lambda a: a["expiresAt"])
    return page(
        person,
        "approvals.html",
        {"pending": waiting, "pending_total": pending["total"], "settled": settled},
    )


@post("/approvals/{approval_id:str}", status_code=303)
async def decide(request: Request[Any, Any, Any], approval_id: FromPath[str]) -> Redirect:
    console: Console = request.app.state.console
    person, form = await console.acting(request)
    params: dict[str, Any] = {"id": approval_id, "verdict": form.get("verdict", "")}
    if form.get("reason", "").strip():
        params["reason"] = form["reason"]
    await console.call(person, "cstp.decideApproval", params)
    return see_other("/console/approvals")


@get("/ready")
async def ready(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    agent = (request.query_params.get("agent") or "").strip()
    params: dict[str, Any] = {"limit": 200}
    if agent:
        params["agent"] = agent
    found = await console.call(person, "cstp.ready", params)
    return page(
        person,
        "ready.html",
        {
            "items": found["items"],
            "total": found["total"],
            "agent": agent or person.principal.agent,
            "may_choose": person.principal.may(REVIEW_ANY),
        },
    )


@get("/calibration")
async def calibration_page(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    args = request.query_params
    chosen = {k: args[k].strip() for k in ("agent", "category") if (args.get(k) or "").strip()}
    figures = await console.call(person, "cstp.getCalibration", {"filters": chosen})
    drift = await console.call(person, "cstp.checkDrift", chosen)
    now = console.services.runtime.now()
    starts = charts.month_starts(now, MONTHS)
    monthly = await reads.brier_by_month(
        console.services.db,
        person.principal.workspace,
        chosen.get("agent"),
        chosen.get("category"),
        [*starts, now + timedelta(seconds=1)],
    )
    groups = drift["groups"]
    return page(
        person,
        "calibration.html",
        {
            "f": figures,
            "chosen": chosen,
            "reliability": charts.reliability(figures["buckets"]),
            "over_time": charts.brier_over_time(
                [(start, *month) for start, month in zip(starts, monthly, strict=True)],
                any(g["drifted"] for g in groups),
            ),
            "groups": groups,
        },
    )


@get("/guardrails")
async def guardrails(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    rules = await console.call(person, "cstp.listGuardrails", {})
    audits = person.principal.may(AUDIT)
    evaluations = (
        await reads.recent_evaluations(console.services.db, person.principal.workspace)
        if audits
        else []
    )
    return page(
        person, "guardrails.html", {"g": rules, "audits": audits, "evaluations": evaluations}
    )


@get("/audit")
async def audit(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    console.require(person, AUDIT)
    return await _audit_page(console, person, None)


async def _audit_page(console: Console, person: Any, report: Any) -> Template:
    workspace = person.principal.workspace
    db = console.services.db
    return page(
        person,
        "audit.html",
        {
            "head": await reads.chain_head(db, workspace),
            "intents": await reads.recent_intents(db, workspace),
            "report": report,
            "keyed": console.services.settings.audit_key is not None,
        },
    )


@post("/audit/verify", status_code=200)
async def verify_chain(request: Request[Any, Any, Any]) -> Template:
    """Verify the whole chain now, as ``cstp audit verify`` does, in the background
    (app.audit.live: the server's calls go on meanwhile; one at a time in a process).
    Problems are counted by kind and placed by sequence number; the rows they name may be
    another workspace's, so only the numbers are shown (``cstp audit verify`` names them)."""
    console: Console = request.app.state.console
    person, _ = await console.acting(request)
    console.require(person, AUDIT)
    settings = console.services.settings
    try:
        report = await live.verify_chain(settings.database_url, settings.audit_key)
    except live.Busy:
        raise Refused(
            429, "Busy", "A verification is already running; try again shortly."
        ) from None
    kinds: dict[str, int] = {}
    for problem in report.problems:
        kinds[problem.kind] = kinds.get(problem.kind, 0) + 1
    summary = {
        "ok": report.ok,
        "first": report.first,
        "last": report.last,
        "checked": report.checked,
        "kinds": sorted(kinds.items()),
        "seqs": sorted({p.seq for p in report.problems if p.seq is not None})[:50],
    }
    return await _audit_page(console, person, summary)
