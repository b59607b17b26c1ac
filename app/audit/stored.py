"""Audited rows as they are stored, for verification: every value must be in the one stored
form the server writes, or the row is reported as changed.

The canonical form (app.audit.canonical) is computed from values brought to their column's
type, so that SQLite and Postgres give the same digest. Read through the column types, a
stored value that is not in its column's form would be converted to the value it pretends
to be: on SQLite, whose columns hold any type, ``2`` in a boolean column reads as true, the
text ``'٢'`` in an integer column as 2, a timestamp followed by ``+23:59`` as the timestamp
before it, a JSON object with a repeated key as its last value. The digest would hold while
SQL (``WHERE fired = 1``, a range of ``received_at``, ``json_extract``) sees something else.

So verification reads the values as the database returns them, without the column types'
conversions, and accepts only:

- booleans: true/false (Postgres), the integers 0 and 1 (SQLite);
- whole numbers: integers (not reals, not text);
- floating-point numbers: reals (not integers or text: a float column stores reals);
- timestamps: a ``timestamptz`` (Postgres); on SQLite exactly ``YYYY-MM-DD HH:MM:SS.ffffff``,
  the text SQLAlchemy writes (or, in rows stored before the chain, whole seconds without the
  fraction), which sorts and compares as the time it names;
- JSON: text that parses as JSON with no repeated member names and no ``NaN``/``Infinity``;
- text: text.

A value in any other form is reported with its column (``NotStored``), never converted; so
is a value that cannot be read at all, and verification carries on with the next row. (Text
that is not valid UTF-8 on SQLite cannot be fetched at all: the driver fails the statement,
and verification stops with that error, exit status 1.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, Integer, Table

from app.db.base import UtcDateTime

# The fraction is always written by SQLAlchemy; rows stored before the audit chain by other
# means (sqlite3's own adapter, SQLite's datetime()) may have whole seconds without one.
_SQLITE_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{6})?", re.ASCII)


class NotStored(ValueError):
    """A value that is not in its column's stored form (``column``: why)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the member {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("not JSON text")
    return json.loads(value, object_pairs_hook=_unique, parse_constant=_no_constant)


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):  # Postgres: a timestamptz
        if value.tzinfo is None:
            raise ValueError("a timestamp without its time zone")
        return value.astimezone(UTC)
    if not (isinstance(value, str) and _SQLITE_TIME.fullmatch(value)):
        raise ValueError("not a timestamp written as YYYY-MM-DD HH:MM:SS[.ffffff]")
    shape = "%Y-%m-%d %H:%M:%S.%f" if "." in value else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(value, shape).replace(tzinfo=UTC)


def value(raw: Any, table: Table, column: str) -> Any:
    """``raw``, a value as the database returned it, as the column's type reads it; raises
    ``NotStored`` when it is not in the column's stored form."""
    if raw is None:
        return None
    type_ = table.c[column].type
    kind = type(raw)
    try:
        if isinstance(type_, Boolean):
            if kind is bool or (kind is int and raw in (0, 1)):
                return bool(raw)
            raise ValueError("not a boolean (true/false or 0/1)")
        if isinstance(type_, Float):
            if kind is float:
                return raw
            raise ValueError("not a floating-point number")
        if isinstance(type_, Integer):
            if kind is int:
                return raw
            raise ValueError("not a whole number")
        if isinstance(type_, UtcDateTime):
            return _time(raw)
        if isinstance(type_, JSON):
            return _json(raw)
        if kind is str:
            return raw
        raise ValueError("not text")
    except (ValueError, OverflowError) as exc:
        raise NotStored(f"{table.name}.{column}: {exc}") from None


def row(raw: Mapping[str, Any], table: Table, columns: tuple[str, ...]) -> dict[str, Any]:
    """The listed columns of a row as the database returned it, each checked by ``value``."""
    return {c: value(raw.get(c), table, c) for c in columns}
