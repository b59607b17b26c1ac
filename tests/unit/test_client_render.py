"""What the terminal client prints of agent-written text: every character a terminal may act
on (C0 and C1 controls, DEL, bidirectional overrides) shown as an escape, in tables, in
``key: value`` lines and in ``--json`` (the same strings to a JSON parser)."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from app.cli.client.render import echo, json_text, kv, one_line, table, visible

HOSTILE = "a\x1b[2Jb\x1b]52;c;eA==\x07c\x9b1md\x7fe\u202ef\u2066g\u2028h\x00"


def test_visible_shows_every_active_character_as_an_escape() -> None:
    assert visible(HOSTILE) == (
        "a\\x1b[2Jb\\x1b]52;c;eA==\\x07c\\x9b1md\\x7fe\\u202ef\\u2066g\\u2028h\\x00"
    )
    assert visible("naïve café — 東京 🙂 C:\\path") == "naïve café — 東京 🙂 C:\\path"
    assert visible(visible(HOSTILE)) == visible(HOSTILE)  # idempotent
    assert visible("two\nlines\r") == "two\\x0alines\\x0d"


def test_one_line_keeps_plain_whitespace_as_spaces_and_escapes_the_rest() -> None:
    assert one_line("first line\n\tsecond\r\n\x0bthird") == "first line second third"
    assert one_line("a\x1c\x1db\x85c") == "a\\x1c\\x1db\\x85c"  # str.split() would eat these


def test_tables_and_key_value_lines_are_measured_after_escaping() -> None:
    lines = table(["ID", "TITLE"], [["1", "x\x1by"], ["22", "z"]])
    assert lines == ["ID  TITLE", "1   x\\x1by", "22  z"]
    result = CliRunner().invoke(show_kv, [])
    assert result.output == 'title: x\\x1b[2Jy\nkpis:  {"k\\u001b": "\\x9b"}\n'


@click.command()
def show_kv() -> None:
    kv([("title", "x\x1b[2Jy"), ("kpis", {"k\x1b": "\x9b"})])


@click.command()
def show_two_lines() -> None:
    echo("x\x1b]0;t\x07\ny")


def test_json_text_escapes_what_json_dumps_leaves_raw() -> None:
    text = json_text({"k\x7f": HOSTILE, "n": [1, 2]})
    for raw in ("\x1b", "\x9b", "\x7f", "\u202e", "\u2066", "\u2028", "\x00"):
        assert raw not in text
    assert json.loads(text) == {"k\x7f": HOSTILE, "n": [1, 2]}
    assert text.startswith('{\n  "k\\u007f": "a\\u001b[2Jb')


def test_echo_prints_one_line_whatever_it_holds() -> None:
    assert CliRunner().invoke(show_two_lines, []).output == "x\\x1b]0;t\\x07\\x0ay\n"
