r"""Output for people: aligned tables, ``key: value`` lines, and ``--json`` for scripts.

Every line goes through :func:`echo`, which falls back to raw UTF-8 bytes when the terminal's
encoding cannot show a character, so a decision title never turns into a traceback.

What the client prints was mostly written by agents (titles, tags, projects, review notes),
and a terminal acts on some characters instead of showing them: ESC starts sequences that
clear the screen, set the window title or write the clipboard (OSC 52), the 8-bit C1 codes
do the same on some terminals, and the bidirectional overrides reorder the rest of the line.
None of them ever reaches the terminal raw: people's output shows each as an escape
(``\x1b``, ``\x9b``, ``\u202e``), and ``--json`` as a JSON ``\u`` escape (the same
string to a JSON parser).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import click

TITLE_WIDTH = 50

# DEL, C1 controls, the Arabic letter mark, the bidirectional marks, embeddings, overrides and
# isolates, and the line and paragraph separators; with the C0 controls, every character a
# terminal may act on.
_ABOVE_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_ACTIVE = r"\x00-\x1f" + _ABOVE_C0
_UNSAFE = re.compile(f"[{_ACTIVE}]")
# What json.dumps leaves raw in a string when it keeps non-ASCII text (it escapes C0 itself).
_UNSAFE_IN_JSON = re.compile(f"[{_ABOVE_C0}]")
# The same but the plain whitespace that one_line turns into single spaces.
_UNSAFE_BUT_SPACE = re.compile(rf"(?![\t\n\r\x0b\x0c])[{_ACTIVE}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    r"""``text`` with every character a terminal would act on shown as an escape
    (ESC -> ``\x1b``, a newline -> ``\x0a``): safe to print, and on one line."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """``text`` on one line: runs of plain whitespace (newlines included) become one space,
    and any other character a terminal would act on is shown as an escape."""
    return " ".join(_UNSAFE_BUT_SPACE.sub(_escape, str(text)).split())


def echo(text: str = "", err: bool = False) -> None:
    """Print one line; whatever it holds, no control character reaches the terminal."""
    text = visible(text)
    try:
        click.echo(text, err=err)
    except UnicodeEncodeError:
        click.echo(text.encode("utf-8"), err=err)


def echo_lines(text: str, err: bool = False) -> None:
    """Print each line of ``text`` through :func:`echo`."""
    for line in text.split("\n"):
        echo(line, err=err)


def json_text(result: Any) -> str:
    r"""``result`` as pretty JSON, with every character a terminal would act on written as a
    ``\u`` escape (json.dumps escapes only C0 controls when it keeps non-ASCII text)."""
    text = json.dumps(result, indent=2, ensure_ascii=False)
    # Outside its strings JSON text is ASCII, so each one found is inside a string.
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(result: Any) -> None:
    click.echo(json_text(result).encode("utf-8"))


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
    rows = [[visible(str(cell)) for cell in row] for row in rows]  # escaped before measured
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
    escalation = status.get("escalation")
    if escalation:  # an escalate rule asked a person: where its approval stands
        kv(
            [
                ("approval", f"{escalation['status']} ({escalation['approvalId']})"),
                ("expiresAt", escalation.get("expiresAt")),
                ("asked by", ", ".join(escalation.get("rules") or [])),
            ]
        )
