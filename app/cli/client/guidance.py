"""The commands that advise before and after a decision: ``cstp check`` and ``announce``
(guardrail verdicts), ``guardrails`` (the rules in force) and ``calibration`` (how well stated
confidence matched outcomes).
"""

from __future__ import annotations

import click

from .options import STAKES, add_pairs, client_options, compact
from .render import (
    TITLE_WIDTH,
    clip,
    echo,
    echo_items,
    echo_table,
    guardrail_verdict,
    kv,
    num,
    one_line,
    print_json,
    state,
)
from .transport import Caller


@click.command("check")
@click.argument("description")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--confidence", type=float)
@click.option("--project")
@click.option(
    "--context",
    "context",
    multiple=True,
    metavar="KEY=VALUE",
    help="A fact the rules read, e.g. affects_production=true; repeatable.",
)
@click.option("--approval-id", help="An approval you asked for this action (once approved).")
@client_options
def check_cmd(
    cstp: Caller,
    description: str,
    category: str | None,
    stakes: str | None,
    confidence: float | None,
    project: str | None,
    context: tuple[str, ...],
    approval_id: str | None,
) -> None:
    """Ask whether the guardrails allow an action.

    Calls cstp.checkGuardrails."""
    action = add_pairs(
        compact(
            {
                "description": description,
                "category": category,
                "stakes": stakes,
                "confidence": confidence,
                "project": project,
            }
        ),
        "context",
        context,
        "--context",
    )
    result = cstp.call(
        "cstp.checkGuardrails", compact({"action": action, "approvalId": approval_id})
    )
    if cstp.as_json:
        return print_json(result)
    guardrail_verdict(result)
    kv(
        [
            ("evaluatedAt", result.get("evaluatedAt")),
            ("evaluationId", result.get("evaluationId")),
            ("agent", result.get("agent")),
        ]
    )


@click.command("announce")
@click.argument("intent")
@click.option("--context", help="Free text: what led to this intent.")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--confidence", type=float)
@click.option("--project")
@click.option("--correlation-id", help="Your id for this intent (a retry returns the answer).")
@click.option(
    "--meta",
    "meta",
    multiple=True,
    metavar="KEY=VALUE",
    help="Metadata the guardrails read, e.g. affects_production=true; repeatable.",
)
@client_options
def announce_cmd(
    cstp: Caller,
    intent: str,
    context: str | None,
    category: str | None,
    stakes: str | None,
    confidence: float | None,
    project: str | None,
    correlation_id: str | None,
    meta: tuple[str, ...],
) -> None:
    """Announce an intent: similar decisions, verdict, suggestions.

    Calls cstp.announceIntent."""
    params = add_pairs(
        compact(
            {
                "intent": intent,
                "context": context,
                "category": category,
                "stakes": stakes,
                "confidence": confidence,
                "project": project,
                "correlationId": correlation_id,
            }
        ),
        "metadata",
        meta,
        "--meta",
    )
    result = cstp.call("cstp.announceIntent", params)
    if cstp.as_json:
        return print_json(result)
    kv([("correlationId", result.get("correlationId")), ("receivedAt", result.get("receivedAt"))])
    guardrail_verdict(result.get("guardrailStatus") or {})
    similar = list(result.get("similarDecisions") or [])
    echo(f"similar decisions: {len(similar)}")
    if similar:
        rows = [
            [
                str(d.get("id", "-")),
                clip(str(d.get("title") or "-"), TITLE_WIDTH),
                state(d),
                num(d.get("distance"), 3),
                clip(str(d.get("notes") or "-"), 60),
            ]
            for d in similar
        ]
        echo_table(["ID", "TITLE", "STATUS", "DISTANCE", "NOTES"], rows, indent="  ")
    suggestions = list(result.get("suggestions") or [])
    echo(f"suggestions: {len(suggestions)}")
    echo_items(suggestions)
    kv([("respondingAgent", result.get("respondingAgent"))])


@click.command("calibration")
@click.option("--agent")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--since", metavar="DATE")
@click.option("--until", metavar="DATE")
@click.option("--min-decisions", type=int, help="Scored decisions needed (default 5).")
@click.option("--group-by", type=click.Choice(["category", "stakes", "agent", "confidenceBucket"]))
@client_options
def calibration_cmd(
    cstp: Caller,
    group_by: str | None,
    agent: str | None,
    category: str | None,
    stakes: str | None,
    since: str | None,
    until: str | None,
    min_decisions: int | None,
) -> None:
    """How well stated confidence matches outcomes.

    Calls cstp.getCalibration."""
    filters = compact(
        {
            "agent": agent,
            "category": category,
            "stakes": stakes,
            "since": since,
            "until": until,
            "minDecisions": min_decisions,
        }
    )
    params = compact({"filters": filters or None, "groupBy": group_by})
    result = cstp.call("cstp.getCalibration", params)
    if cstp.as_json:
        return print_json(result)
    overall = result.get("overall") or result
    kv(
        [
            ("agent", result.get("agent")),
            ("brierScore", num(overall.get("brierScore"))),
            ("accuracy", num(overall.get("accuracy"))),
            ("calibrationGap", num(overall.get("calibrationGap"), signed=True)),
            ("interpretation", overall.get("interpretation")),
            ("meanConfidence", num(overall.get("meanConfidence"))),
            (
                "decisions",
                f"{overall.get('totalDecisions', 0)} scored, "
                f"{overall.get('reviewedDecisions', 0)} reviewed, "
                f"{overall.get('pendingDecisions', 0)} pending",
            ),
        ]
    )
    buckets = list(result.get("buckets") or [])
    if buckets:
        echo("buckets:")
        rows = [
            [
                str(b.get("bucket")),
                str(b.get("count", 0)),
                num(b.get("meanConfidence")),
                num(b.get("accuracy")),
                num(b.get("gap"), signed=True),
                num(b.get("brierScore")),
            ]
            for b in buckets
        ]
        echo_table(["BUCKET", "COUNT", "CONF", "ACCURACY", "GAP", "BRIER"], rows, "  ")
    groups = list(result.get("groups") or [])
    if groups:
        echo(f"by {result.get('groupBy') or group_by}:")
        rows = [
            [
                str(g.get("key")),
                str(g.get("totalDecisions", 0)),
                num(g.get("brierScore")),
                num(g.get("accuracy")),
                num(g.get("calibrationGap"), signed=True),
                str(g.get("interpretation") or "-"),
            ]
            for g in groups
        ]
        echo_table(["KEY", "SCORED", "BRIER", "ACCURACY", "GAP", "INTERPRETATION"], rows, "  ")
    recommendations = list(result.get("recommendations") or [])
    if recommendations:
        echo("recommendations:")
        echo_items(recommendations)


@click.command("guardrails")
@click.option("--scope", help="Only rules that apply to this scope (e.g. a project).")
@client_options
def guardrails_cmd(cstp: Caller, scope: str | None) -> None:
    """List the guardrail rules in force.

    Calls cstp.listGuardrails."""
    result = cstp.call("cstp.listGuardrails", compact({"scope": scope}))
    if cstp.as_json:
        return print_json(result)
    rules = list(result.get("guardrails") or [])
    if not rules:
        echo("no guardrails" + (f" for scope {scope!r}" if scope else ""))
        return
    rows = [
        [
            str(r.get("id")),
            str(r.get("action") or "-"),
            ", ".join(map(str, r.get("scope") or [])) or "all",
            one_line(str(r.get("description") or "-")),
        ]
        for r in rules
    ]
    echo_table(["ID", "ACTION", "SCOPE", "DESCRIPTION"], rows)
    echo(f"{result.get('count', len(rules))} guardrail(s)")
