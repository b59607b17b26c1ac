"""The canonical form of an audited row: what an audit chain entry's digest is the digest of.

An audited row is one row of ``intents``, ``guardrail_evaluations``, ``decisions`` or
``decision_reviews``, together with its child rows (an intent's matches, an evaluation's
per-rule results, a decision's reasons, tags and supersede links). Its canonical form is a
JSON object:

- one member per column of the table's fixed list below, named by the database column, one
  per column a later format added (``Audited.later``) whose value is not NULL, and one per
  column a later format added with a default (``Audited.later_defaults``: the ``workspace``)
  whose value is not that default;
- one member per child table, named by that table: an array of the child rows, each an object
  of the child's listed columns (not its own integer key, not the parent reference), ordered
  by the child's natural key (compared as values: numbers as numbers, strings by code point),
  then by the child's own encoding; a child table a later format added (``Child.optional``:
  a decision's supersede links) is a member only when the row has child rows in it;
- values: NULL is ``null``; booleans ``true``/``false``; whole-number columns integers;
  floating-point columns the shortest decimal that reads back as the same double (``0.85``,
  ``1.0``, ``1e-05``), with -0.0 written ``0.0`` and a non-finite value as the string
  ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; timestamps ISO-8601 in UTC with exactly six
  fractional digits and ``Z`` (``2026-12-02T09:30:00.000000Z``); JSON columns their parsed
  value, inside which numbers stay as parsed (integers as integers, floats as above);
  text as stored.

The object is encoded as compact JSON (no whitespace; ``,`` and ``:``), members sorted by
name (code point order), strings escaped only where JSON requires (``"``, ``\\``, control
characters; ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f`` short forms, others as ``\\u00XX``),
everything else as UTF-8. The digest is the SHA-256 of those bytes, in lower-case hex.

(These are the bytes of Python's ``json.dumps(form, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` in UTF-8. They are produced with msgspec, several times faster; its own
float notation differs (``0.00001`` for ``1e-05``), so every float reaches the encoder as its
text already written, a ``msgspec.Raw``: ``value_of`` and ``document`` give them so.)

The column lists are fixed (app.audit.tables), not read from the schema: a column added to a
table later is not covered until a new format says so, and the digests of the rows already
chained stay valid. Review columns of ``decisions`` (``status``, ``outcome``, ``reviewed_*``,
…) change with every review and are left out: each review is a ``decision_reviews`` row of its
own.

The same code computes the form when a row is appended (from the values being inserted) and
when it is verified (from the values read back), on SQLite and Postgres alike: every value
is first brought to its column's type, so ``1`` and ``1.0`` in a float column, or ``0``/``1``
and ``false``/``true`` in a boolean one, encode the same.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from sqlalchemy import JSON, Boolean, Float, Integer, Table, inspect
from sqlalchemy.types import TypeEngine

from app.db.base import Base, UtcDateTime, table_of

from .tables import (
    AUDITED,
    DECISIONS,
    EVALUATIONS,
    FORMAT,
    INTENTS,
    REVIEWS,
    Audited,
    Child,
    Covered,
)

__all__ = [  # the tables are re-exported: callers read them as canonical.AUDITED etc.
    "AUDITED",
    "DECISIONS",
    "EVALUATIONS",
    "FORMAT",
    "INTENTS",
    "REVIEWS",
    "Audited",
    "Child",
    "Covered",
    "covered",
    "covered_object",
    "digest_of",
    "document",
    "encode",
    "iso_utc",
    "value_of",
]

# ---- values -----------------------------------------------------------------------------------


def iso_utc(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC (a naive value is taken as UTC)."""
    v = value.astimezone(UTC) if value.tzinfo is not None else value
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:"
        f"{v.second:02d}.{v.microsecond:06d}Z"
    )


def _float(value: float) -> msgspec.Raw | str:
    """A float as its canonical JSON text (``repr``, as ``json.dumps`` writes it), or the
    string for a non-finite one."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    # -0.0 + 0.0 is 0.0: SQLite may read a stored -0.0 back as 0.0. float's own repr, as
    # json.dumps uses it, also for a subclass (numpy's float64 would write its type's name)
    return msgspec.Raw(float.__repr__(value + 0.0).encode())


def _key(key: Any) -> str:
    """A JSON object's member name (a str subclass as its text, like json.dumps)."""
    return str.__str__(key) if isinstance(key, str) else str(key)


def _json_value(value: Any) -> Any:
    """A parsed JSON value with its floats made canonical (tuples, as lists)."""
    if isinstance(value, bool) or value is None or type(value) in (int, str):
        return value
    if isinstance(value, str):  # a subclass: its text, as json.dumps writes it
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Mapping):
        return {_key(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)  # not a JSON value; what json.dumps(default=str) would have stored


def _bool(value: Any) -> bool:
    return bool(value)


def _float_of(value: Any) -> msgspec.Raw | str:
    return _float(float(value))


def _int(value: Any) -> int:
    return int(value)


def _str(value: Any) -> str:
    return str(value)


def _conversion(type_: TypeEngine[Any]) -> Callable[[Any], Any]:
    """How a non-NULL value of a column of ``type_`` is brought to its canonical value."""
    if isinstance(type_, Boolean):
        return _bool
    if isinstance(type_, Float):
        return _float_of
    if isinstance(type_, Integer):
        return _int
    if isinstance(type_, UtcDateTime):
        return iso_utc
    if isinstance(type_, JSON):
        return _json_value
    return _str


def value_of(value: Any, type_: TypeEngine[Any]) -> Any:
    """``value`` brought to its column's type, ready for the canonical JSON (a float, inside
    a JSON value too, as its text: a ``msgspec.Raw``)."""
    return None if value is None else _conversion(type_)(value)


_ENCODER = msgspec.json.Encoder(order="sorted")


def encode(document: Any) -> bytes:
    """Compact, sorted-key JSON in UTF-8: the bytes that are hashed. Floats must be given as
    ``value_of`` gives them (their text); msgspec would write a bare float its own way."""
    return _ENCODER.encode(document)


def digest_of(document: Any) -> str:
    return hashlib.sha256(encode(document)).hexdigest()


# ---- documents --------------------------------------------------------------------------------


# A value already of its column's plain type is its own canonical value: kept as it is,
# without a call (a digest is computed on every audited write).
_KEPT_TYPE: dict[Callable[[Any], Any], type] = {_str: str, _int: int, _bool: bool}


@functools.cache
def _conversions(
    table: Table, columns: tuple[str, ...]
) -> tuple[tuple[str, Callable[[Any], Any], type | None], ...]:
    """Each column with its conversion and the type a value needs none for, worked out once
    per table."""
    found = []
    for c in columns:
        convert = _conversion(table.c[c].type)
        found.append((c, convert, _KEPT_TYPE.get(convert)))
    return tuple(found)


def _row(table: Table, columns: tuple[str, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    get = values.get
    for c, convert, kept in _conversions(table, columns):
        v = get(c)
        # exact types only: True is an int, and a str subclass may print differently
        out[c] = v if v is None or type(v) is kept else convert(v)
    return out


def _child_row(child: Child, values: Mapping[str, Any]) -> dict[str, Any]:
    out = _row(child.table, child.columns, values)
    for c in child.later:  # a member only when not NULL (app.audit.tables)
        v = values.get(c)
        if v is not None:
            out[c] = value_of(v, child.table.c[c].type)
    return out


def _natural_key(child: Child, row: dict[str, Any]) -> tuple[Any, ...]:
    # None first, then by value; numbers and strings never share a key column
    return tuple([(row[c] is not None, row[c]) for c in child.order])


def _sort_key(child: Child, row: dict[str, Any]) -> tuple[Any, ...]:
    # the natural key, then the whole encoding so that even duplicated keys order one way
    return (*_natural_key(child, row), encode(row))


def _sort_rows(child: Child, rows: list[dict[str, Any]]) -> None:
    """Order by ``_sort_key``; the encodings are only computed when natural keys repeat."""
    if len(rows) < 2:
        return
    keyed = sorted(
        [(_natural_key(child, row), n) for n, row in enumerate(rows)], key=lambda kn: kn[0]
    )
    if any(a[0] == b[0] for a, b in itertools.pairwise(keyed)):
        rows.sort(key=functools.partial(_sort_key, child))
    else:
        rows[:] = [rows[n] for _, n in keyed]


def document(
    audited: Audited,
    values: Mapping[str, Any],
    children: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The canonical form of one row (column name -> value) and its child rows (child table
    name -> rows as column name -> value; a child table left out has no rows)."""
    out = _row(audited.table, audited.columns, values)
    for c in audited.later:  # a member only when not NULL (app.audit.tables)
        v = values.get(c)
        if v is not None:
            out[c] = value_of(v, audited.table.c[c].type)
    for c, default in audited.later_defaults:  # a member only when not the default
        v = values.get(c)
        if v is not None and v != default:
            out[c] = value_of(v, audited.table.c[c].type)
    for child in audited.children:
        rows = [_child_row(child, r) for r in (children or {}).get(child.table.name, ())]
        if child.optional and not rows:  # a member only when it has rows (app.audit.tables)
            continue
        _sort_rows(child, rows)
        out[child.table.name] = rows
    return out


def covered(
    table: str,
    values: Mapping[str, Any],
    children: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Covered:
    """The entry for a row being inserted with Core (its values by column name)."""
    audited = AUDITED[table]
    digest = digest_of(document(audited, values, children))
    return Covered(table, str(values[audited.key]), digest, values.get("workspace") or "default")


def _columns(obj: Base) -> dict[str, Any]:
    mapper = inspect(type(obj))
    return {attr.columns[0].name: getattr(obj, attr.key) for attr in mapper.column_attrs}


def covered_object(obj: Base) -> Covered:
    """The entry for a row added as an ORM object, once flushed (its key assigned). Children
    are read from the object's relationships to the child tables (a decision's reasons and
    tags); a child table with no relationship on the object has no rows (a failed intent)."""
    audited = AUDITED[table_of(type(obj)).name]
    mapper = inspect(type(obj))
    unset = inspect(obj).unloaded
    children: dict[str, list[dict[str, Any]]] = {}
    for rel in mapper.relationships:
        target = rel.mapper.local_table
        for child in audited.children:
            if child.table is not target:
                continue
            if child.optional and rel.key in unset:
                # never set on the object being inserted (an imported decision has no
                # supersede links): it has no rows there, and reading it would load it
                continue
            children[child.table.name] = [_columns(item) for item in getattr(obj, rel.key)]
    return covered(audited.name, _columns(obj), children)
