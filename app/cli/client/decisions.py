"""The decision commands: ``cstp query``, ``record``, ``review``, ``get`` and ``list``.

Each makes one JSON-RPC call and prints the answer for people, or with ``--json`` the
``result`` as it came.
"""

from __future__ import annotations

from typing import Any

import click

from .options import OUTCOMES, STAKES, STATUSES, add_pairs, client_options, compact, parse_reasons
from .render import decision_rows, echo, fmt, kv, print_json, reason_lines
from .transport import Caller


@click.command("query")
@click.argument("text")
@click.option("--limit", type=int, default=None, help="How many (1-50, default 10).")
@click.option("--category")
@click.option("--stakes", multiple=True, type=click.Choice(STAKES), help="Repeatable.")
@click.option("--status", multiple=True, type=click.Choice(STATUSES), help="Repeatable.")
@click.option("--min-confidence", type=float)
@click.option("--max-confidence", type=float)
@click.option("--after", "date_after", metavar="DATE", help="On or after (ISO date).")
@click.option("--before", "date_before", metavar="DATE", help="Before (ISO date).")
@click.option("--agent")
@click.option("--tag", "tags", multiple=True, help="Every tag must be present; repeatable.")
@click.option("--project")
@click.option("--feature")
@click.option("--pr", type=int)
@click.option(
    "--has-outcome/--no-outcome",
    "has_outcome",
    default=None,
    help="Only reviewed / only unreviewed decisions.",
)
@click.option("--reasons", "include_reasons", is_flag=True, help="Show each decision's reasons.")
@client_options
def query_cmd(
    cstp: Caller, text: str, limit: int | None, include_reasons: bool, **filters: Any
) -> None:
    """Find the past decisions that best match TEXT.

    Calls cstp.queryDecisions, which ranks by meaning, by words or both (the server's
    retrieval mode, hybrid unless set): SCORE is what the results are ordered by, DISTANCE
    the cosine distance where the vector side found the decision. Every filter given is
    applied."""
    wire = compact(
        {
            "category": filters["category"],
            "stakes": filters["stakes"],
            "status": filters["status"],
            "minConfidence": filters["min_confidence"],
            "maxConfidence": filters["max_confidence"],
            "dateAfter": filters["date_after"],
            "dateBefore": filters["date_before"],
            "agent": filters["agent"],
            "tags": filters["tags"],
            "project": filters["project"],
            "feature": filters["feature"],
            "pr": filters["pr"],
            "hasOutcome": filters["has_outcome"],
        }
    )
    params = compact({"query": text, "limit": limit, "filters": wire or None})
    if include_reasons:
        params["includeReasons"] = True
    result = cstp.call("cstp.queryDecisions", params)
    if cstp.as_json:
        return print_json(result)
    decisions = list(result.get("decisions") or [])
    if not decisions:
        echo(f"no decisions match {text!r}")
        return
    lines = decision_rows(decisions, ranked=True)
    echo(lines[0])
    for line, d in zip(lines[1:], decisions, strict=True):
        echo(line)
        if include_reasons:
            reason_lines(d.get("reasons") or [], indent="    ")
    took = result.get("queryTimeMs")
    echo(
        f"{len(decisions)} decision(s), best match first"
        + (f" ({took:.0f} ms)" if isinstance(took, (int, float)) else "")
    )


@click.command("record")
@click.argument("decision")
@click.option("--confidence", type=float, required=True, help="0.0 to 1.0.")
@click.option("--category", required=True)
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--context", help="Free text: the situation the decision was made in.")
@click.option(
    "--reason",
    "reasons",
    multiple=True,
    metavar="TYPE:TEXT",
    help="e.g. analysis:ACID compliance needed; repeatable.",
)
@click.option("--tag", "tags", multiple=True, help="Repeatable.")
@click.option("--kpi", "kpis", multiple=True, help="A KPI this should move; repeatable.")
@click.option("--mental-state")
@click.option("--review-in", metavar="PERIOD", help="When to review: 30d, 2w, 3m.")
@click.option("--project")
@click.option("--feature")
@click.option("--pr", type=int)
@click.option("--correlation-id", help="The id of an intent you announced for this.")
@client_options
def record_cmd(
    cstp: Caller,
    decision: str,
    reasons: tuple[str, ...],
    tags: tuple[str, ...],
    kpis: tuple[str, ...],
    **options: Any,
) -> None:
    """Record a decision.

    Calls cstp.recordDecision."""
    params = compact(
        {
            "decision": decision,
            "confidence": options["confidence"],
            "category": options["category"],
            "stakes": options["stakes"],
            "context": options["context"],
            "tags": tags,
            "kpiIndicators": kpis,
            "mentalState": options["mental_state"],
            "reviewIn": options["review_in"],
            "project": options["project"],
            "feature": options["feature"],
            "pr": options["pr"],
            "correlationId": options["correlation_id"],
        }
    )
    if reasons:
        params["reasons"] = parse_reasons(reasons)
    result = cstp.call("cstp.recordDecision", params)
    if cstp.as_json:
        return print_json(result)
    kv(
        [
            ("recorded", result.get("id")),
            ("path", result.get("path")),
            ("indexed", result.get("indexed")),
            ("timestamp", result.get("timestamp")),
        ],
        skip_empty=False,
    )


@click.command("review")
@click.argument("decision_id", metavar="ID")
@click.argument("outcome", type=click.Choice(OUTCOMES))
@click.option("--result", "actual_result", help="What actually happened.")
@click.option("--lessons")
@click.option("--notes")
@click.option(
    "--kpi",
    "kpis",
    multiple=True,
    metavar="KEY=VALUE",
    help="An affected KPI, e.g. latency=+40%; repeatable.",
)
@client_options
def review_cmd(
    cstp: Caller,
    decision_id: str,
    outcome: str,
    actual_result: str | None,
    lessons: str | None,
    notes: str | None,
    kpis: tuple[str, ...],
) -> None:
    """Record the OUTCOME of decision ID.

    Calls cstp.reviewDecision."""
    params = add_pairs(
        compact(
            {
                "id": decision_id,
                "outcome": outcome,
                "actualResult": actual_result,
                "lessons": lessons,
                "notes": notes,
            }
        ),
        "affectedKpis",
        kpis,
        "--kpi",
    )
    result = cstp.call("cstp.reviewDecision", params)
    if cstp.as_json:
        return print_json(result)
    kv(
        [
            ("reviewed", result.get("id")),
            ("outcome", outcome),
            ("status", result.get("status")),
            ("reviewedAt", result.get("reviewedAt")),
            ("path", result.get("path")),
            ("reindexed", result.get("reindexed")),
        ]
    )


_FIRST = (
    "id",
    "title",
    "category",
    "confidence",
    "stakes",
    "status",
    "outcome",
    "date",
    "recordedBy",
    "context",
)
_HIDDEN = {"reasons", "reviews", "summary", "decision", "createdAt"}


@click.command("get")
@click.argument("decision_id", metavar="ID")
@client_options
def get_cmd(cstp: Caller, decision_id: str) -> None:
    """Show decision ID with every stored field and its reviews.

    Calls cstp.getDecision."""
    result = cstp.call("cstp.getDecision", {"id": decision_id})
    if cstp.as_json:
        return print_json(result)
    decision: dict[str, Any] = result.get("decision") or {}
    pairs = [(k, decision.get(k)) for k in _FIRST]
    pairs += [(k, v) for k, v in decision.items() if k not in _FIRST and k not in _HIDDEN]
    pairs = [
        (k, v) for k, v in pairs if not (isinstance(v, dict) and all(x is None for x in v.values()))
    ]
    kv(pairs)
    reasons = list(decision.get("reasons") or [])
    if reasons:
        echo(f"reasons: {len(reasons)}")
        reason_lines(reasons, indent="  ")
    reviews = list(decision.get("reviews") or [])
    echo(f"reviews: {len(reviews)}")
    for review in reviews:
        echo(
            f"  - {review.get('reviewedAt')} {review.get('outcome')} "
            f"by {review.get('reviewedBy') or '-'}"
        )
        for key in ("actualResult", "lessons", "notes", "affectedKpis"):
            if review.get(key) not in (None, "", {}):
                echo(f"    {key}: {fmt(review[key])}")


@click.command("list")
@click.option("--limit", type=int, default=None, help="Page size (1-500, default 20).")
@click.option("--offset", type=int, default=None)
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--agent")
@click.option("--tag", "tags", multiple=True, help="Repeatable.")
@click.option("--from", "date_from", metavar="DATE", help="Recorded on or after.")
@click.option("--to", "date_to", metavar="DATE", help="Recorded on or before.")
@click.option("--search", help="Text contained in the decision.")
@click.option(
    "--sort", type=click.Choice(["createdAt", "confidence", "category", "stakes", "status"])
)
@click.option("--order", type=click.Choice(["asc", "desc"]))
@client_options
def list_cmd(
    cstp: Caller, tags: tuple[str, ...], date_from: str | None, date_to: str | None, **options: Any
) -> None:
    """List decisions, newest first by default.

    Calls cstp.listDecisions."""
    params = compact({**options, "tags": tags, "dateFrom": date_from, "dateTo": date_to})
    result = cstp.call("cstp.listDecisions", params)
    if cstp.as_json:
        return print_json(result)
    decisions = list(result.get("decisions") or [])
    total = result.get("total", len(decisions))
    if not decisions:
        echo(f"no decisions (total {total})")
        return
    for line in decision_rows(decisions):
        echo(line)
    offset = int(result.get("offset") or 0)
    echo(f"{offset + 1}-{offset + len(decisions)} of {total} decision(s)")
