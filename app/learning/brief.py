"""cstp.getSessionContext (SPEC.md, section 9): what an agent should know as a session starts.

The brief holds the agent's calibration by category, the decisions most relevant to its task
(the workspace's, by the same hybrid search as announceIntent; without a task, the latest
reviewed ones), its work list (ready), its recent failures and the rules in force (shadow ones
marked). It is a function of the stored state and the clock only, built in a fixed order, so
the same state gives the same brief.

It never exceeds ``maxTokens`` counted with the embedding model's own tokenizer: while it is
over, the least important item goes (the last rule, then failures, relevant decisions,
calibration rows, work items, in that order), and the brief says how many were left out.
Each brief is stored as sent (``session_briefs``) and chained: an auditor can read exactly
what the agent was shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from msgspec import Meta

from app.audit.canonical import covered
from app.audit.chain import append
from app.calibration.repository import aggregate
from app.calibration.schemas import Filters, figures
from app.operations.context import CallContext
from app.records.filters import SearchFilters
from app.search.embedder import token_counter
from app.search.service import similar
from app.wire import Struct

from . import repository
from .ready import ReadyParams, ready

RELEVANT = 5
READY = 10
FAILURES = 5
NOTE_CHARS = 280  # a lesson or result longer than this is cut: a brief is a summary
# What goes first when the brief is over budget: the sections, least important first.
DROP_ORDER = ("rules", "recentFailures", "relevant", "calibration", "ready")


class SessionContextParams(Struct):
    task: Annotated[str, Meta(max_length=4000)] | None = None
    max_tokens: Annotated[int, Meta(ge=200, le=8000)] = 1500
    format: Literal["markdown", "json"] = "markdown"


class SessionContextResult(Struct):
    context: str | dict[str, Any]
    tokens: int
    brief_id: str


def _cut(text: str | None) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 1] + "…"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(brief: dict[str, Any]) -> str:
    """The brief as a model reads it well: headed sections of one-line items."""
    lines = [f"# Session brief for {brief['agent']}"]
    if brief.get("task"):
        lines.append(f"Task: {_cut(brief['task'])}")
    if brief["calibration"]:
        lines.append("\n## Your calibration by category")
        for c in brief["calibration"]:
            lines.append(
                f"- {c['category']}: {c['decisions']} reviewed, Brier {_num(c['brierScore'])}, "
                f"accuracy {_num(c['accuracy'])} ({c['interpretation']})"
            )
    if brief["ready"]:
        lines.append("\n## Needs your attention")
        for r in brief["ready"]:
            what = f" [{r['decisionId']}]" if r.get("decisionId") else ""
            lines.append(f"- {r['priority']} {r['kind']}{what}: {r['reason']}")
    if brief["relevant"]:
        lines.append("\n## Relevant past decisions")
        for d in brief["relevant"]:
            outcome = f" — {d['outcome']}" if d.get("outcome") else " — no outcome yet"
            lesson = f". Lessons: {d['lessons']}" if d.get("lessons") else ""
            lines.append(
                f"- [{d['id']}] {d['title']} ({d['category']}, confidence "
                f"{d['confidence']:.2f}){outcome}{lesson}"
            )
    if brief["recentFailures"]:
        lines.append("\n## Your recent failures")
        for f in brief["recentFailures"]:
            lesson = f": {f['lessons']}" if f.get("lessons") else ""
            lines.append(f"- [{f['id']}] {f['title']} ({f['category']}){lesson}")
    if brief["rules"]:
        lines.append("\n## Guardrails in force")
        for r in brief["rules"]:
            mode = " (shadow: recorded, never enforced)" if r["mode"] == "shadow" else ""
            lines.append(f"- {r['action']} {r['id']}{mode}: {r['description']}")
    if brief.get("leftOut"):
        lines.append(f"\n_{brief['leftOut']} more item(s) left out to fit the token budget._")
    return "\n".join(lines) + "\n"


def encoded(brief: dict[str, Any]) -> str:
    return json.dumps(brief, ensure_ascii=False, separators=(",", ":"))


def fit(
    brief: dict[str, Any], render: Callable[[dict[str, Any]], str], limit: int
) -> tuple[str, int]:
    """The rendered brief and its token count, never over ``limit``: items are dropped
    (DROP_ORDER) until it fits; with none left, the task is halved, then (a pathological
    agent name of many tokens) the agent's name, until it does. An empty brief is far under
    the smallest budget (200), so the loop ends."""
    count = token_counter()
    text = render(brief)
    tokens = count(text)
    while tokens > limit:
        section = next((s for s in DROP_ORDER if brief[s]), None)
        if section is not None:
            brief[section].pop()
            brief["leftOut"] = brief.get("leftOut", 0) + 1
        elif brief.get("task"):
            task = brief["task"]
            brief["task"] = task[: len(task) // 2] + "…" if len(task) > 2 else None
        elif brief["agent"]:
            brief["agent"] = brief["agent"][: len(brief["agent"]) // 2]
        else:  # unreachable: nothing is left to render
            raise AssertionError("an empty session brief over its budget")
        text = render(brief)
        tokens = count(text)
    return text, tokens


def _relevant(d: Any) -> dict[str, Any]:
    """A relevant decision as the brief shows it, from a search's ``Brief`` or a row of
    ``repository.recent_reviewed`` (the same attributes)."""
    return {
        "id": d.id,
        "title": d.summary,
        "category": d.category,
        "confidence": d.confidence,
        "outcome": d.outcome,
        "lessons": _cut(d.lessons or d.review_notes),
    }


async def session_context(ctx: CallContext, p: SessionContextParams) -> SessionContextResult:
    agent, workspace = ctx.agent, ctx.workspace
    session = ctx.session
    calibrated = await aggregate(session, workspace, Filters(agent=agent), "category")
    calibration = []
    for key, sums in calibrated:
        if sums.scored:
            head = figures(sums, 1)
            calibration.append(
                {
                    "category": str(key),
                    "decisions": sums.scored,
                    "brierScore": head.brier_score,
                    "accuracy": head.accuracy,
                    "interpretation": head.interpretation,
                }
            )
    if p.task:
        found = await similar(ctx, p.task, SearchFilters(workspace=workspace), RELEVANT)
        shown: list[Any] = [f.decision for f in found.found]
    else:
        shown = await session.run_sync(
            lambda s: repository.recent_reviewed(
                s.connection(), workspace=workspace, limit=RELEVANT
            )
        )
    relevant = [_relevant(d) for d in shown]
    work = await ready(ctx, ReadyParams(limit=READY))
    failed = await session.run_sync(
        lambda s: repository.recent_failures(
            s.connection(), workspace=workspace, agent=agent, limit=FAILURES
        )
    )
    brief: dict[str, Any] = {
        "agent": agent,
        "task": _cut(p.task),  # the whole task is stored with the brief
        "calibration": calibration,
        "ready": [
            {
                k: v
                for k, v in {
                    "kind": i.kind,
                    "priority": i.priority,
                    "reason": i.reason,
                    "decisionId": i.decision_id,
                }.items()
                if v is not None
            }
            for i in work.items
        ],
        "relevant": relevant,
        "recentFailures": [
            {
                "id": f.id,
                "title": f.summary,
                "category": f.category,
                "lessons": _cut(f.lessons or f.actual_result),
            }
            for f in failed
        ],
        "rules": [
            {"id": r.id, "action": r.action, "mode": r.mode, "description": r.description}
            for r in ctx.services.rules.rules
        ],
    }
    render = markdown if p.format == "markdown" else encoded
    text, tokens = fit(brief, render, p.max_tokens)
    runtime = ctx.services.runtime
    brief_id = runtime.uuid()
    row: dict[str, Any] = {
        "id": brief_id,
        "workspace": workspace,
        "agent": agent,
        "task": p.task,
        "format": p.format,
        "max_tokens": p.max_tokens,
        "tokens": tokens,
        "content": text,
        "created_at": runtime.now(),
    }
    entry = covered("session_briefs", row)
    await repository.store_brief(session, row)
    append(session, entry)
    context: str | dict[str, Any] = text if p.format == "markdown" else json.loads(text)
    return SessionContextResult(context=context, tokens=tokens, brief_id=brief_id)
