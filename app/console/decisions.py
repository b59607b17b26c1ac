"""Decisions: the list (hybrid search or filters, paged), one decision with everything the
server holds about it, and the review form (SPEC.md, section 10)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath
from litestar.response import Redirect, Template

from app.guardrails.replay import CannotReplay, replay
from app.scopes import AUDIT, REVIEW_ANY, REVIEW_OWN

from . import repository as reads
from .core import Console, Refused, page, see_other
from .sessions import Person

PAGE_SIZE = 25
SEARCH_LIMIT = 50  # queryDecisions' own most
FILTERS = ("category", "stakes", "status", "agent")
OUTCOMES = ("success", "partial", "failure", "abandoned")


def _page_number(raw: str | None) -> int:
    return int(raw) if raw is not None and raw.isdigit() and 0 < int(raw) < 100_000 else 1


@get("/decisions")
async def decisions(request: Request[Any, Any, Any]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    args = request.query_params
    q = (args.get("q") or "").strip()
    filters = {key: args[key].strip() for key in FILTERS if (args.get(key) or "").strip()}
    number = _page_number(args.get("page"))
    if q:
        found = await console.call(
            person, "cstp.queryDecisions", {"query": q, "limit": SEARCH_LIMIT, "filters": filters}
        )
        items, total, pages = found["decisions"], len(found["decisions"]), 1
    else:
        params = {"limit": PAGE_SIZE, "offset": (number - 1) * PAGE_SIZE, **filters}
        listed = await console.call(person, "cstp.listDecisions", params)
        items, total = listed["decisions"], listed["total"]
        pages = max(1, -(-total // PAGE_SIZE))
    return page(
        person,
        "decisions.html",
        {
            "q": q,
            "filters": filters,
            "items": items,
            "total": total,
            "number": number,
            "pages": pages,
            "searched": bool(q),
        },
    )


def may_review(person: Person, decision: dict[str, Any]) -> bool:
    principal = person.principal
    own = decision["recordedBy"] == principal.agent and principal.may(REVIEW_OWN)
    return own or principal.may(REVIEW_ANY)


@get("/decisions/{decision_id:str}")
async def decision(request: Request[Any, Any, Any], decision_id: FromPath[str]) -> Template:
    console: Console = request.app.state.console
    person = await console.person(request)
    try:
        got = await console.call(person, "cstp.getDecision", {"id": decision_id})
    except Refused as exc:
        if exc.status == 400:  # not an id at all: as unknown as an id of no decision
            raise Refused(404, "Not found", "No such decision.") from None
        raise
    found = got["decision"]
    intents: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    audits = person.principal.may(AUDIT)
    if audits:
        db, workspace = console.services.db, person.principal.workspace
        intents, evaluations = await reads.linked(db, workspace, found)
        secret = console.services.settings.audit_key
        entries = await reads.decision_entries(db, workspace, found["id"], secret)
    return page(
        person,
        "decision.html",
        {
            "d": found,
            "reviews": list(reversed(found.get("reviews") or [])),
            "may_review": may_review(person, found),
            "outcomes": OUTCOMES,
            "audits": audits,
            "intents": intents,
            "evaluations": evaluations,
            "entries": entries,
        },
    )


@post("/decisions/{decision_id:str}/review", status_code=303)
async def review(request: Request[Any, Any, Any], decision_id: FromPath[str]) -> Redirect:
    console: Console = request.app.state.console
    person, form = await console.acting(request)
    params: dict[str, Any] = {"id": decision_id, "outcome": form.get("outcome", "")}
    for name in ("actualResult", "lessons", "notes"):
        if form.get(name, "").strip():
            params[name] = form[name]
    await console.call(person, "cstp.reviewDecision", params)
    return see_other(f"/console/decisions/{decision_id}#reviews")


@get("/evaluations/{evaluation_id:str}/replay")
async def replay_evaluation(
    request: Request[Any, Any, Any], evaluation_id: FromPath[str]
) -> Template:
    """An evaluation evaluated again with its own stored rule set (``cstp guardrails replay``):
    the same verdict, or every difference."""
    console: Console = request.app.state.console
    person = await console.person(request)
    console.require(person, AUDIT)
    if len(evaluation_id) > 64:
        raise Refused(404, "Not found", "No such evaluation.")
    try:
        result = await console.services.db.read(lambda conn: replay(conn, evaluation_id))
    except CannotReplay:
        result = None
    if result is None or result.evaluation["workspace"] != person.principal.workspace:
        raise Refused(404, "Not found", "No such evaluation, or its rule set is not stored.")
    return page(person, "replay.html", {"r": result, "id": evaluation_id})
