"""The learning loop's operations: ready and checkDrift."""

from __future__ import annotations

from app import scopes
from app.calibration.drift import CheckDriftParams, CheckDriftResult, check_drift
from app.operations.registry import Operation, Registry

from .brief import SessionContextParams, SessionContextResult, session_context
from .ready import ReadyParams, ReadyResult, ready


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.ready",
            ReadyParams,
            ReadyResult,
            ready,
            "The caller's work list, most urgent first: reviews due, stale pending decisions, "
            "calibration drift.",
            "Ask what needs your attention, most urgent first: decisions whose review date has "
            "passed without an outcome (review them with review_decision), decisions pending "
            "for over 30 days, and categories where your calibration drifted. Call it at the "
            "start of a session.",
            writes=False,
            tool="ready",
            scopes=(scopes.READ,),
        )
    )
    registry.add(
        Operation(
            "cstp.checkDrift",
            CheckDriftParams,
            CheckDriftResult,
            check_drift,
            "Per agent and category, the recent window's calibration against the baseline's, "
            "and whether it drifted.",
            "Check whether an agent's judgement is drifting: per category, the Brier score and "
            "accuracy of decisions reviewed in the last recentDays (30) days against the "
            "baselineDays (90) days before. Drifted means more than 20% worse Brier or 15 "
            "points lower accuracy, with at least minDecisions on each side.",
            writes=False,
            tool="check_drift",
            scopes=(scopes.READ,),
        )
    )
    registry.add(
        Operation(
            "cstp.getSessionContext",
            SessionContextParams,
            SessionContextResult,
            session_context,
            "A brief for the start of a session: calibration by category, the decisions most "
            "relevant to the task, the work list, recent failures and the rules in force; "
            "within maxTokens, stored as shown.",
            "Call at the start of a session (optionally with your task): a brief of what you "
            "should know, within maxTokens: how well calibrated you are per category, the past "
            "decisions most relevant to the task with their outcomes and lessons, what needs "
            "your attention (reviews due, drift), your recent failures and the guardrails in "
            "force. format markdown (to read) or json (to parse).",
            tool="get_session_context",
            scopes=(scopes.READ,),
        )
    )
