"""The YAML file of a decision: where it goes and who can read it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.db.decisions import Decision
from app.decisions.document import relative_path
from app.decisions.export import export_decision, render, write_decision


def decision(created: datetime, workspace: str = "default") -> Decision:
    return Decision(
        id="0a1b2c3d",
        workspace=workspace,
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


def test_another_workspace_has_a_folder_of_its_own_and_says_so_in_its_files() -> None:
    mine = decision(datetime(2026, 12, 1, tzinfo=UTC), workspace="team-b")
    assert relative_path(mine) == "decisions/team-b/2026/12/2026-12-01-decision-0a1b2c3d.yaml"
    assert b"\nworkspace: team-b\n" in render(mine)
    # workspace default's files stay as they were before workspaces existed
    assert b"workspace" not in render(decision(datetime(2026, 12, 1, tzinfo=UTC)))


# The file mode is read from the umask once, when the module is imported: each umask is tried
# in a process of its own that sets it first.
EXPORT_UNDER_UMASK = """
import os, stat, sys
from datetime import UTC, datetime
from pathlib import Path
os.umask(int(sys.argv[1], 8))
from app.db.decisions import Decision
from app.decisions.export import export_decision
row = Decision(id="0a1b2c3d", summary="s", decision="s", category="process", confidence=0.5,
               stakes="medium", status="pending", created_at=datetime(2026, 12, 1, tzinfo=UTC),
               recorded_by="alice")
path = export_decision(Path(sys.argv[2]), row)
print(oct(stat.S_IMODE(path.stat().st_mode)), sorted(p.name for p in path.parent.iterdir()))
"""


@pytest.mark.parametrize(
    ("umask", "mode"), [("022", 0o644), ("027", 0o640), ("077", 0o600), ("002", 0o664)]
)
def test_a_file_is_readable_as_the_umask_allows(tmp_path: Path, umask: str, mode: int) -> None:
    shown = subprocess.run(
        [sys.executable, "-c", EXPORT_UNDER_UMASK, umask, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split(maxsplit=1)
    # 0644 under the usual 022: others may read the tree (mkstemp alone would give 0600).
    assert shown == [oct(mode), "['2026-12-01-decision-0a1b2c3d.yaml']\n"]  # no temp file left


def test_a_file_holds_its_rendering(tmp_path: Path) -> None:
    path = export_decision(tmp_path, decision(datetime(2026, 12, 1, tzinfo=UTC)))
    assert path.read_bytes() == render(decision(datetime(2026, 12, 1, tzinfo=UTC)))


def reviewed(at: datetime | None, outcome: str) -> Decision:
    row = decision(datetime(2026, 12, 1, tzinfo=UTC))
    if at is not None:
        row.status, row.outcome, row.reviewed_by, row.reviewed_at = "reviewed", outcome, "bob", at
    return row


def test_a_file_from_a_newer_review_is_not_replaced_by_an_older_row(tmp_path: Path) -> None:
    """Two passes exporting one decision at once, each with the row as it read it: the one
    holding the older row must not overwrite the newer file, whichever finishes last."""
    first = reviewed(datetime(2026, 12, 31, tzinfo=UTC), "partial")
    second = reviewed(datetime(2027, 1, 30, tzinfo=UTC), "success")
    path = export_decision(tmp_path, second)
    for stale in (first, reviewed(None, "")):
        assert write_decision(tmp_path, stale, render(stale)) is False
        assert path.read_bytes() == render(second)
    third = reviewed(datetime(2027, 2, 28, tzinfo=UTC), "failure")
    assert write_decision(tmp_path, third, render(third)) is True
    assert path.read_bytes() == render(third)


def test_a_file_that_is_not_a_decision_any_more_is_replaced(tmp_path: Path) -> None:
    row = reviewed(datetime(2026, 12, 31, tzinfo=UTC), "success")
    path = export_decision(tmp_path, row)
    for garbage in (
        b"reviewed_at: [unclosed\n",
        b"- a list\n",
        b"reviewed_at: yesterday\n",
        b"reviewed_at: 2026-12-01\n",  # a date, not a time
    ):
        path.write_bytes(garbage)
        assert write_decision(tmp_path, row, render(row)) is True
        assert path.read_bytes() == render(row)


def test_a_hand_written_review_time_without_a_zone_is_taken_as_utc(tmp_path: Path) -> None:
    row = reviewed(datetime(2026, 12, 31, 12, 0, tzinfo=UTC), "success")
    path = export_decision(tmp_path, row)
    for later in (b"reviewed_at: '2027-01-01T00:00:00'\n", b"reviewed_at: 2027-01-01 00:00:00\n"):
        path.write_bytes(later)  # naive, quoted and as a YAML timestamp: later than the row's
        assert write_decision(tmp_path, row, render(row)) is False
        assert path.read_bytes() == later
    path.write_bytes(b"reviewed_at: '2026-12-31T11:00:00'\n")  # earlier than the row's
    assert write_decision(tmp_path, row, render(row)) is True


def test_a_repair_makes_the_file_its_rows_whatever_review_it_shows(tmp_path: Path) -> None:
    """``cstp export`` writes the row's file over one that shows a later review than the row
    has (a file that diverged from its row), or shows a review on a row that has none."""
    later = reviewed(datetime(2027, 1, 30, tzinfo=UTC), "failure")
    for row in (reviewed(datetime(2026, 12, 31, tzinfo=UTC), "success"), reviewed(None, "")):
        path = export_decision(tmp_path, later)
        assert write_decision(tmp_path, row, render(row)) is False
        assert write_decision(tmp_path, row, render(row), repair=True) is True
        assert path.read_bytes() == render(row)
        assert write_decision(tmp_path, row, render(row), repair=True) is False
