"""Audited rows read back from the database: their canonical forms (``load``, ``digests``:
what the migration that builds the chain digests) and, for verification, the forms of rows
whose every value is in the one stored form the server writes (``load_checked``; a row that
is not is reported as changed).

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
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Connection, Float, Integer, Table, inspect

from app.db.base import UtcDateTime

from .canonical import Audited, digest_of, document
from .repository import rows as repository

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


# ---- reading audited rows back -----------------------------------------------------------------


def key_values(audited: Audited, row_ids: Iterable[str]) -> list[Any]:
    """Row ids (text) as the key column's values; ids that cannot be one are left out."""
    if isinstance(audited.table.c[audited.key].type, Integer):
        return [int(r) for r in row_ids if r.isdigit() and len(r) < 20]
    return list(row_ids)


def _fetch(
    conn: Connection, audited: Audited, row_ids: Sequence[str], *, raw: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[dict[str, Any]]]]]:
    """The stored rows among ``row_ids`` (key as text -> column -> value) and their child rows
    (key as text -> child table -> rows); with ``raw``, the values as the database returns
    them, without the column types' conversions (above)."""
    keys = key_values(audited, row_ids)
    if not keys:
        return {}, {}
    # Only the listed columns, and the later ones the table has: a column that a later
    # migration adds does not exist yet when the migration that builds the chain runs.
    columns = audited.columns + later_columns(conn, audited)
    return repository.fetch(
        conn, audited, keys, columns, raw=raw, child_columns=child_columns(conn, audited)
    )


def later_columns(conn: Connection, audited: Audited) -> tuple[str, ...]:
    """The columns of ``audited.later`` and ``audited.later_defaults`` that the table has in
    this database."""
    later = audited.later + tuple(c for c, _default in audited.later_defaults)
    if not later:
        return ()
    present = {c["name"] for c in inspect(conn).get_columns(audited.table.name)}
    return tuple(c for c in later if c in present)


def child_columns(conn: Connection, audited: Audited) -> dict[str, tuple[str, ...]]:
    """Each child table's listed columns and the later ones it has in this database."""
    out = {}
    for child in audited.children:
        later: tuple[str, ...] = ()
        if child.later:
            present = {c["name"] for c in inspect(conn).get_columns(child.table.name)}
            later = tuple(c for c in child.later if c in present)
        out[child.table.name] = child.columns + later
    return out


def load(conn: Connection, audited: Audited, row_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The canonical forms of the stored rows among ``row_ids`` (key as text -> form), their
    values read through the column types."""
    rows, children = _fetch(conn, audited, row_ids, raw=False)
    return {r: document(audited, values, children[r]) for r, values in rows.items()}


def load_checked(
    conn: Connection, audited: Audited, row_ids: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """As ``load``, for verification: every value must be in its column's stored form
    (above). Returns the forms of the rows that are, and for each row that is not
    (or has a child row that is not) why."""
    rows, children = _fetch(conn, audited, row_ids, raw=True)
    forms: dict[str, dict[str, Any]] = {}
    unreadable: dict[str, str] = {}
    for r, values in rows.items():
        try:
            read = row(values, audited.table, tuple(values))
            kids = {
                child.table.name: [
                    row(k, child.table, tuple(k)) for k in children[r].get(child.table.name, ())
                ]
                for child in audited.children
            }
            forms[r] = document(audited, read, kids)
        except NotStored as exc:
            unreadable[r] = str(exc)
    return forms, unreadable


def digests(conn: Connection, audited: Audited, row_ids: Sequence[str]) -> dict[str, str]:
    return {r: digest_of(doc) for r, doc in load(conn, audited, row_ids).items()}
