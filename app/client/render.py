"""Output for people: aligned tables, ``key: value`` lines, and ``--json`` for scripts.

Every line goes through :func:`echo`, which falls back to raw UTF-8 bytes when the terminal's
encoding cannot show a character, so a decision title never turns into a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import click

TITLE_WIDTH = 50


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def echo(text: str = "", err: bool = False) -> None:
    try:
        click.echo(text, err=err)
    except UnicodeEncodeError:
        click.echo(text.encode("utf-8"), err=err)


def print_json(result: Any) -> None:
    text = json.dumps(result, indent=2, ensure_ascii=False)
    click.echo(text.encode("utf-8"))


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return one_line(str(value))


def num(value: Any, places: int = 3, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:+.{places}f}" if signed else f"{value:.{places}f}"
    return str(value)


def clip(text: str, width: int) -> str:
    text = one_line(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    """Aligned columns, two spaces apart; the last column is not padded."""
    rows = [list(map(str, row)) for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(widths[i]) for i, c in enumerate(cells[:-1])] + [cells[-1]]
        return (indent + "  ".join(padded)).rstrip()

    return [line(list(headers))] + [line(row) for row in rows]


def echo_table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> None:
    for line in table(headers, rows, indent):
        echo(line)


def echo_items(items: Iterable[Any], indent: str = "  ") -> None:
    """One ``- item`` line per item."""
    for item in items:
        echo(f"{indent}- {one_line(str(item))}")


def kv(pairs: Iterable[tuple[str, Any]], skip_empty: bool = True) -> None:
    items = [(k, v) for k, v in pairs if not (skip_empty and v in (None, "", [], {}))]
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        echo(f"{(key + ':').ljust(width + 1)} {fmt(value)}")


def state(item: dict[str, Any]) -> str:
    outcome = item.get("outcome")
    return str(outcome) if outcome else str(item.get("status") or "-")


def decision_rows(decisions: list[dict[str, Any]], ranked: bool = False) -> list[str]:
    """A table of decisions; ``ranked`` (a search's results) adds their score, what they are
    ordered by, and their distance where the vector side found them."""
    headers = ["ID", "TITLE", "CATEGORY", "CONF", "STAKES", "STATUS"]
    if ranked:
        headers += ["SCORE", "DISTANCE"]
    rows = []
    for d in decisions:
        row = [
            str(d.get("id", "-")),
            clip(str(d.get("title") or d.get("decision") or "-"), TITLE_WIDTH),
            str(d.get("category") or "-"),
            num(d.get("confidence"), 2),
            str(d.get("stakes") or "-"),
            state(d),
        ]
        if ranked:
            row += [num(d.get("score"), 3), num(d.get("distance"), 3)]
        rows.append(row)
    return table(headers, rows)


def reason_lines(reasons: Iterable[dict[str, Any]], indent: str) -> None:
    """``- analysis (0.8): ACID needed`` per reason of a decision."""
    for reason in reasons:
        echo(
            f"{indent}- {reason.get('type')} ({fmt(reason.get('strength'))}): "
            f"{one_line(reason.get('text') or '')}"
        )


def _rule_items(label: str, items: list[dict[str, Any]]) -> None:
    echo(f"{label}: {len(items)}")
    for item in items:
        name = item.get("guardrailId") or item.get("name") or "?"
        severity = item.get("severity")
        prefix = f"[{severity}] " if severity else ""
        echo(f"  - {prefix}{name}: {one_line(item.get('message') or item.get('name') or '')}")
        if item.get("suggestion"):
            echo(f"    suggestion: {one_line(item['suggestion'])}")


def guardrail_verdict(status: dict[str, Any]) -> None:
    kv(
        [
            ("allowed", bool(status.get("allowed"))),
            ("evaluated", f"{status.get('evaluated', 0)} rule(s)"),
        ]
    )
    _rule_items("violations", list(status.get("violations") or []))
    _rule_items("warnings", list(status.get("warnings") or []))
