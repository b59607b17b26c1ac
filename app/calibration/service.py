"""cstp.getCalibration: how well the confidence agents state matches the outcomes they get.

Every figure is aggregated by the database (COUNT/SUM/GROUP BY over the filtered decisions)
and only a handful of sums per slice reach Python, so the call needs the same memory for ten
reviewed decisions or ten million: no rows are loaded, no scan limit, no hidden floor.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import invalid_params
from app.operations.context import CallContext
from app.operations.params import parse_timestamp

from .repository import aggregate, sources_scored
from .schemas import (
    DEFAULT_MIN_DECISIONS,
    STAKES_ORDER,
    TOLERANCE,
    CalibrationFilters,
    Filters,
    GetCalibrationParams,
    GetCalibrationResult,
    Sums,
    bucket_label,
    bucket_wire,
    figures,
    group_figures,
    interpret,
    percent,
)

MAX_RECOMMENDATIONS = 8


def _action(gap: float, there: str) -> str:
    if gap < 0:
        return f"lower confidence{there} or gather more evidence before deciding"
    return f"you can state higher confidence{there}"


def _by_gap(rows: list[tuple[Any, Sums]], min_decisions: int) -> list[tuple[Any, Sums, float]]:
    """The miscalibrated slices with enough decisions to judge, worst first."""
    judged = [(k, s, s.gap) for k, s in rows if s.scored >= min_decisions and s.gap is not None]
    return sorted(
        [(k, s, g) for k, s, g in judged if abs(g) > TOLERANCE], key=lambda item: -abs(item[2])
    )


def recommendations(
    overall: Sums,
    by_bucket: list[tuple[int, Sums]],
    groups: list[tuple[str, Sums]] | None,
    group_by: str | None,
    min_decisions: int,
) -> list[str]:
    """Concrete advice, most important first: enough data?, overall, worst buckets, groups."""
    advice: list[str] = []
    if overall.scored < min_decisions:
        advice.append(
            f"Only {overall.scored} reviewed decision(s) can be scored here and at least "
            f"{min_decisions} are needed: review more decisions (cstp.reviewDecision) before "
            "trusting these figures."
        )
    elif overall.gap is not None:
        stated = percent(overall.sum_confidence / overall.scored)
        success = percent(overall.sum_score / overall.scored)
        if abs(overall.gap) <= TOLERANCE:
            advice.append(
                f"Your stated confidence ({stated}%) matches your success rate ({success}%): "
                "keep calibrating the same way."
            )
        else:
            advice.append(
                f"Overall you state {stated}% confidence and succeed {success}% of the time: "
                f"{_action(overall.gap, '')}."
            )
    for index, s, gap in _by_gap(list(by_bucket), min_decisions):
        advice.append(
            f"Your {bucket_label(index)} decisions succeed {percent(s.sum_score / s.scored)}% "
            f"of the time: {_action(gap, ' there')}."
        )
    if groups and group_by != "confidenceBucket":
        for key, s, gap in _by_gap(list(groups), min_decisions):
            advice.append(
                f"{group_by} '{key}' is {interpret(gap).replace('_', ' ')} (gap {gap:+.3f} over "
                f"{s.scored} decisions): {_action(gap, ' there')}."
            )
    pending = overall.matched - overall.reviewed
    if pending:
        advice.insert(
            1,
            f"{pending} matching decision(s) have no review yet: reviewing them makes this "
            "calibration more reliable.",
        )
    return advice[:MAX_RECOMMENDATIONS]


def resolve_filters(p: GetCalibrationParams) -> Filters:
    """``filters`` wins key by key; a top-level value fills a key ``filters`` leaves out."""
    nested = p.filters or CalibrationFilters()

    def pick(name: str, wire: str) -> tuple[Any, str]:
        value = getattr(nested, name)
        if value is not None:
            return value, f"filters.{wire}"
        return getattr(p, name), wire

    agent, _ = pick("agent", "agent")
    category, _ = pick("category", "category")
    stakes, _ = pick("stakes", "stakes")
    min_decisions, _ = pick("min_decisions", "minDecisions")
    since_text, since_field = pick("since", "since")
    until_text, until_field = pick("until", "until")
    since = parse_timestamp(since_field, since_text) if since_text is not None else None
    until = parse_timestamp(until_field, until_text) if until_text is not None else None
    if since is not None and until is not None and until <= since:
        raise invalid_params(until_field, "must be later than since")
    return Filters(
        agent=agent if isinstance(agent, str) else None,  # an {"id": …} object is informational
        category=category,
        stakes=stakes,
        since=since,
        until=until,
        min_decisions=min_decisions if min_decisions is not None else DEFAULT_MIN_DECISIONS,
        source=None if nested.source is None else tuple(sorted(set(nested.source))),
    )


async def _groups(
    session: AsyncSession,
    workspace: str,
    f: Filters,
    group_by: str,
    by_bucket: list[tuple[int, Sums]],
) -> list[tuple[str, Sums]]:
    if group_by == "confidenceBucket":
        return [(bucket_label(i), sums) for i, sums in by_bucket]
    rows = [(str(k), s) for k, s in await aggregate(session, workspace, f, group_by)]
    if group_by == "stakes":
        rows.sort(key=lambda item: (STAKES_ORDER.get(item[0], len(STAKES_ORDER)), item[0]))
    return rows


async def get_calibration(ctx: CallContext, p: GetCalibrationParams) -> GetCalibrationResult:
    f = resolve_filters(p)
    session, workspace = ctx.session, ctx.workspace
    [(_, overall)] = await aggregate(session, workspace, f, None)
    by_bucket: list[tuple[int, Sums]] = []
    if overall.matched:
        by_bucket = [
            (int(k), s) for k, s in await aggregate(session, workspace, f, "confidenceBucket")
        ]
    head = figures(overall, f.min_decisions)
    groups = await _groups(session, workspace, f, p.group_by, by_bucket) if p.group_by else None
    return GetCalibrationResult(
        brier_score=head.brier_score,
        accuracy=head.accuracy,
        calibration_gap=head.calibration_gap,
        interpretation=head.interpretation,
        overall=head,
        buckets=[bucket_wire(i, s) for i, s in by_bucket if s.scored],
        recommendations=recommendations(overall, by_bucket, groups, p.group_by, f.min_decisions),
        group_by=p.group_by if groups is not None else None,
        groups=(
            None if groups is None else [group_figures(k, s, f.min_decisions) for k, s in groups]
        ),
        filters=f.wire(),
        agent=ctx.agent,
        sources=await sources_scored(session, workspace, f) if overall.scored else [],
    )
