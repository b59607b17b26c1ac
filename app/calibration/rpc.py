"""Registers cstp.getCalibration (read-only: it runs in a read transaction)."""

from __future__ import annotations

from app.rpc.registry import Method, Registry

from .schemas import GetCalibrationParams
from .service import get_calibration


def register(registry: Registry) -> None:
    registry.add(
        Method("cstp.getCalibration", GetCalibrationParams, get_calibration, writes=False)
    )
