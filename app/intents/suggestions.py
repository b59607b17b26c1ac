"""Suggestions for an announced intent, as the seed's generator describes: what happened to
the nearest reviewed decisions, then what the guardrails advise. At most five."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MAX_SUGGESTIONS = 5
FROM_OUTCOMES = 3

_OUTCOME_TEXT = {
    "success": "Similar action succeeded: {title}",
    "failure": "Warning: Similar action failed: {title}",
    "partial": "Similar action had issues: {title}",
}


def generate(similar: Sequence[dict[str, Any]], advice: Iterable[str | None]) -> list[str]:
    suggestions: list[str] = []
    reviewed = [d for d in similar if d.get("outcome") in _OUTCOME_TEXT][:FROM_OUTCOMES]
    for decision in reviewed:
        text = _OUTCOME_TEXT[decision["outcome"]].format(title=decision["title"])
        notes = decision.get("notes")
        if notes and decision["outcome"] != "success":
            text += f" (lesson: {notes})"
        if text not in suggestions:  # decisions of the same title and outcome: said once
            suggestions.append(text)
    for item in advice:
        if item and item not in suggestions:
            suggestions.append(item)
    return suggestions[:MAX_SUGGESTIONS]
