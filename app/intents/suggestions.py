"""Suggestions for an announced intent, as the seed's generator (SPEC.md) describes: the
outcomes of the three nearest similar decisions that were reviewed as a success, a failure or
partial, then the guardrail warnings' own suggestions. At most five; a text already given is
not repeated. A blocking rule's suggestion is in ``guardrailStatus.violations``, and a
decision's lessons in ``similarDecisions[].notes``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .schemas import SimilarDecision

MAX_SUGGESTIONS = 5
FROM_OUTCOMES = 3

_OUTCOME_TEXT = {
    "success": "Similar action succeeded: {title}",
    "failure": "Warning: Similar action failed: {title}",
    "partial": "Similar action had issues: {title}",
}


def generate(similar: Sequence[SimilarDecision], warnings: Iterable[str | None]) -> list[str]:
    """From ``similar`` (nearest first) and the warnings' suggestions (None: a warning with
    none)."""
    suggestions: list[str] = []
    for decision in similar[:FROM_OUTCOMES]:
        template = _OUTCOME_TEXT.get(decision.outcome or "")
        if template is not None:
            text = template.format(title=decision.title)
            if text not in suggestions:  # decisions of one title and outcome: said once
                suggestions.append(text)
    for item in warnings:
        if item and item not in suggestions:
            suggestions.append(item)
    return suggestions[:MAX_SUGGESTIONS]
