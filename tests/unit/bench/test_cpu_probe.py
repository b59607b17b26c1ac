"""bench.cpu's options for probing at scale: a kept data directory and another working tree
are checked before anything starts, so a typo costs one line, not a server start."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cpu import parse_args


def test_a_kept_data_directory_and_a_source_are_taken(tmp_path: Path) -> None:
    (tmp_path / "kept" / "data").mkdir(parents=True)
    (tmp_path / "kept" / "data" / "cstp.db").touch()
    (tmp_path / "tree" / "app").mkdir(parents=True)
    (tmp_path / "tree" / "app" / "cli.py").touch()
    args = parse_args(["--from-data", str(tmp_path / "kept"), "--source", str(tmp_path / "tree")])
    assert args.from_data == tmp_path / "kept"
    assert args.source == tmp_path / "tree"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from-data", "{tmp}"], "holds no SQLite database"),
        (["--from-data", "{tmp}/kept"], "holds no SQLite database"),  # a Postgres run's
        (["--source", "{tmp}"], "is not a working tree of this project"),
        (
            ["--from-data", "{tmp}/kept", "--database-url", "postgresql+asyncpg://u@h:5432/d"],
            "not with --database-url",
        ),
    ],
)
def test_a_wrong_directory_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "kept" / "data").mkdir(parents=True)
    with pytest.raises(SystemExit) as exited:
        parse_args([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
