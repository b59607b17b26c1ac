"""Registers cstp.getCalibration (read-only: it runs in a read transaction)."""

from __future__ import annotations

from app.rpc.registry import Method, Registry

from .schemas import GetCalibrationParams, GetCalibrationResult
from .service import get_calibration


def register(registry: Registry) -> None:
    registry.add(Method(
        "cstp.getCalibration", GetCalibrationParams, GetCalibrationResult, get_calibration,
        "How well calibrated stated confidence is against reviewed outcomes (Brier score, "
        "accuracy, gap, buckets, recommendations).",
        writes=False,
    ))
