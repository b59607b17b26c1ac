"""The calibration operation: getCalibration (read-only: it runs in a read transaction)."""

from __future__ import annotations

from app import scopes
from app.operations.registry import Operation, Registry

from .schemas import GetCalibrationParams, GetCalibrationResult
from .service import get_calibration


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.getCalibration",
            GetCalibrationParams,
            GetCalibrationResult,
            get_calibration,
            "How well calibrated stated confidence is against reviewed outcomes (Brier score, "
            "accuracy, gap, buckets, recommendations).",
            "Measure how well stated confidence matched reviewed outcomes: Brier score, accuracy, "
            "calibration gap (negative means overconfident), per-confidence buckets and "
            "recommendations, optionally by agent, category or stakes. Use it to adjust how "
            "confident to be.",
            writes=False,
            tool="get_calibration",
            scopes=(scopes.READ,),
        )
    )
