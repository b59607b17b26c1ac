"""The YAML file of a decision: where it goes and who can read it."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from app.db.decisions import Decision
from app.decisions.document import relative_path
from app.decisions.export import export_decision, render


def decision(created: datetime) -> Decision:
    return Decision(
        id="0a1b2c3d",
        summary="Use PostgreSQL",
        decision="Use PostgreSQL",
        category="architecture",
        confidence=0.8,
        stakes="medium",
        status="pending",
        created_at=created,
        recorded_by="alice",
    )


def test_every_year_is_four_digits_in_the_path() -> None:
    assert relative_path(decision(datetime(1, 2, 3, tzinfo=UTC))) == (
        "decisions/0001/02/0001-02-03-decision-0a1b2c3d.yaml"
    )
    assert relative_path(decision(datetime(987, 12, 31, tzinfo=UTC))) == (
        "decisions/0987/12/0987-12-31-decision-0a1b2c3d.yaml"
    )
    assert relative_path(decision(datetime(2026, 12, 1, tzinfo=UTC))) == (
        "decisions/2026/12/2026-12-01-decision-0a1b2c3d.yaml"
    )


def test_a_file_is_readable_as_the_umask_allows(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    path = export_decision(tmp_path, decision(datetime(2026, 12, 1, tzinfo=UTC)))
    assert path.read_bytes() == render(decision(datetime(2026, 12, 1, tzinfo=UTC)))
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    if umask == 0o022:  # the usual one: others may read the tree
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
