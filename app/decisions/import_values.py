"""One value of a decision file read as the column it goes to can hold it (for ``cstp import``).

Each reader takes a key's value from the file's mapping and returns it as its column stores
it, or raises ``Unreadable`` naming the key: the right type (numbers are taken as text, a lone
text as a list of one), no NUL character, no longer than its column, whole numbers within 32
bits, dates and timestamps in UTC, mappings as a JSON column stores them, and choices among the
values the wire accepts.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime
from typing import Any, get_args

from sqlalchemy import ColumnElement, String

from app.db.decisions import Decision, DecisionTag
from app.operations.params import nul_path
from app.wire import TEXT_MAX, Outcome, Stakes

from .import_limits import Unreadable
from .schemas import MentalState, ReasonType

# The values the wire accepts (app.wire, app.decisions.schemas), as sets.
STAKES = set(get_args(Stakes))
OUTCOMES = set(get_args(Outcome))
REASON_TYPES = set(get_args(ReasonType))
MENTAL_STATES = set(get_args(MentalState))
CORRELATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # what an Integer column holds on Postgres
# The lengths of the decision's text columns, read from the model, by column (= YAML key) name;
# the API's own limits are checked on top (app.decisions.import_limits). ``summary`` has no
# param, and no column length: the API makes it from the decision, so a file's own is held
# to the decision's limit.
LENGTHS: dict[str, int] = {
    c.name: c.type.length
    for c in Decision.__table__.columns
    if isinstance(c.type, String) and c.type.length is not None
} | {"summary": TEXT_MAX}


def _string_length(column: ColumnElement[Any]) -> int:
    assert isinstance(column.type, String) and column.type.length is not None
    return column.type.length


TAG_LENGTH = _string_length(DecisionTag.__table__.c.tag)


def _utc(value: datetime, key: str) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before the first UTC instant
        raise Unreadable(f"{key}: out of range") from None


def when_of(value: Any, key: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return _utc(value, key)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise Unreadable(f"{key}: not an ISO-8601 date or timestamp") from None
        return _utc(parsed, key)
    raise Unreadable(f"{key}: not a date")


def checked_text(value: str, key: str, limit: int | None) -> str:
    """Text as both databases can store it: no NUL character (Postgres refuses it), and no
    longer than its column."""
    if "\x00" in value:
        raise Unreadable(f"{key}: holds a NUL character")
    if limit is not None and len(value) > limit:
        raise Unreadable(f"{key}: longer than {limit} characters")
    return value


def text_at(data: dict[str, Any], key: str) -> str | None:
    """Text for the column named ``key`` (numbers are taken as text), within its length."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return checked_text(str(value), key, LENGTHS.get(key))
    raise Unreadable(f"{key}: must be text")


def correlation_id_of(data: dict[str, Any]) -> str | None:
    value = text_at(data, "correlation_id")
    if value is not None and not CORRELATION_ID.fullmatch(value):
        raise Unreadable("correlation_id: 1-128 characters of A-Z a-z 0-9 . _ : -")
    return value


def int_at(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unreadable(f"{key}: must be a whole number")
    if not INT32_MIN <= value <= INT32_MAX:
        raise Unreadable(f"{key}: out of range")
    return value


def list_at(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unreadable(f"{key}: must be a list")
    return value


def scalars_at(data: dict[str, Any], key: str, limit: int | None = None) -> list[str]:
    """A list of plain values (text, numbers), as text; a lone text is a list of one."""
    if isinstance(data.get(key), str):
        return [checked_text(data[key], key, limit)]
    out = []
    for i, item in enumerate(list_at(data, key)):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise Unreadable(f"{key}[{i}]: must be text")
        out.append(checked_text(str(item), f"{key}[{i}]", limit))
    return out


def json_mapping(value: Any, key: str) -> dict[str, Any] | None:
    """A mapping as a JSON column stores it: YAML dates and times become ISO text."""
    if not isinstance(value, dict):
        return None
    try:
        encoded = json.dumps(value, default=str, allow_nan=False)
    except (TypeError, ValueError):
        raise Unreadable(f"{key}: cannot be stored (not finite numbers or text)") from None
    result: dict[str, Any] = json.loads(encoded)
    where = nul_path({key: result})
    if where is not None:
        raise Unreadable(f"{where}: holds a NUL character")
    return result


def flag_at(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise Unreadable(f"pre_decision.{key}: must be true or false")


def choice_of(value: Any, allowed: set[str], key: str, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise Unreadable(f"{key}: {value!r} is not one of {', '.join(sorted(allowed))}")
    return value
