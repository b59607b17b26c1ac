"""Measurements live in docs, never in the code: a comment or docstring in app/ that quotes a
duration in milliseconds or microseconds is a measurement that will go stale (the machines
drift 2x within a day; docs/performance-history.md keeps each run with its date and machine).
A limit or a timeout is a setting, not a measurement: it is a named constant in code, which
this check does not read."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
DURATION = re.compile(r"\d(?:[\d,.]*\d)?\s?(?:ms|µs|us|milliseconds?|microseconds?)\b")


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of ``source``, with their line numbers."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and node.body:
                found.append((node.body[0].lineno, doc))
    return found


def measurements(source: str) -> list[tuple[int, str]]:
    return [
        (line, match.group(0)) for line, text in prose(source) for match in DURATION.finditer(text)
    ]


def test_no_comment_or_docstring_in_app_quotes_a_duration() -> None:
    offenders = {
        f"{path.relative_to(APP.parent)}:{line}": figure
        for path in sorted(APP.rglob("*.py"))
        if "migrations" not in path.parts
        for line, figure in measurements(path.read_text())
    }
    assert offenders == {}


def test_the_check_finds_a_timing_in_a_comment_and_a_docstring() -> None:
    planted = '"""Fast: ~5 ms a call."""\nX = 1  # took 80 µs\nY = "12 ms"  # a string, not prose\n'
    assert sorted(figure for _, figure in measurements(planted)) == ["5 ms", "80 µs"]
