"""``cstp ready`` and ``cstp drift``: the learning loop's questions, as a client of a running
server."""

from __future__ import annotations

import click

from .options import client_options, compact
from .render import TITLE_WIDTH, clip, echo, echo_table, print_json
from .transport import Caller


@click.command("ready")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--agent", help="Another agent's list (needs a reviewer's token).")
@client_options
def ready_cmd(cstp: Caller, limit: int, agent: str | None) -> None:
    """What needs attention, most urgent first: reviews due, stale decisions, drift.

    Calls cstp.ready."""
    result = cstp.call("cstp.ready", compact({"limit": limit, "agent": agent}))
    if cstp.as_json:
        return print_json(result)
    rows = [
        [
            i["priority"],
            i["kind"],
            i.get("decisionId") or i.get("category") or "-",
            i["since"][:10],
            clip(i["reason"], TITLE_WIDTH * 2),
        ]
        for i in result["items"]
    ]
    echo_table(["PRIORITY", "KIND", "WHAT", "SINCE", "REASON"], rows)
    echo(f"{len(rows)} of {result['total']} item(s)")


@click.command("drift")
@click.option("--agent")
@click.option("--category")
@click.option("--recent-days", type=int)
@click.option("--baseline-days", type=int)
@click.option("--min-decisions", type=int)
@client_options
def drift_cmd(
    cstp: Caller,
    agent: str | None,
    category: str | None,
    recent_days: int | None,
    baseline_days: int | None,
    min_decisions: int | None,
) -> None:
    """Whether calibration drifted, per agent and category: recent against baseline.

    Calls cstp.checkDrift."""
    params = compact(
        {
            "agent": agent,
            "category": category,
            "recentDays": recent_days,
            "baselineDays": baseline_days,
            "minDecisions": min_decisions,
        }
    )
    result = cstp.call("cstp.checkDrift", params)
    if cstp.as_json:
        return print_json(result)

    def side(w: dict[str, object]) -> str:
        return f"n={w['n']} brier={w['brierScore']} acc={w['accuracy']}"

    rows = [
        [
            g["agent"],
            g["category"],
            "DRIFTED" if g["drifted"] else "ok",
            side(g["recent"]),
            side(g["baseline"]),
        ]
        for g in result["groups"]
    ]
    echo_table(["AGENT", "CATEGORY", "DRIFT", "RECENT", "BASELINE"], rows)
    for g in result["groups"]:
        for reason in g["reasons"]:
            echo(f"{g['agent']}/{g['category']}: {reason}")
