"""Turning a JSON-RPC ``params`` object into a validated msgspec Struct, or a -32602 that
names the field.

Compatibility rules of docs/PROTOCOL.md ("The envelope") live here, in one place: unknown params
are ignored, an optional field sent as ``null`` counts as absent, and a few snake_case aliases
are accepted.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi

from app.errors import INVALID_PARAMS, CstpError, invalid_params

T = TypeVar("T", bound=msgspec.Struct)

ALIASES = {
    "actual_result": "actualResult",
    "affected_kpis": "affectedKpis",
    "kpi_indicators": "kpiIndicators",
    "mental_state": "mentalState",
    "review_in": "reviewIn",
    "pre_decision": "preDecision",
    "include_reasons": "includeReasons",
    "decision_id": "id",
}

# Keys whose object values are free-form facts: kept as sent, nulls included.
FREE_FORM = frozenset({"metadata", "context", "affectedKpis"})
# What a free-form object may hold (docs/PROTOCOL.md): nesting, keys (counted over every level)
# and encoded size. Past these it is -32602 naming the field: such a value would be stored, but
# derived data (the YAML file, the guardrail facts) could not be made from it.
FREE_FORM_MAX_DEPTH = 8
FREE_FORM_MAX_KEYS = 256
FREE_FORM_MAX_BYTES = 65_536
FREE_FORM_MAX_KEY_LENGTH = 256
# What ``project_context`` (SPEC section 2: "an object holding the project fields") may fill
# in; a field sent at the top level wins.
PROJECT_FIELDS = ("project", "feature", "pr", "file", "line", "commit")


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def normalize(params: dict[str, Any]) -> dict[str, Any]:
    """Apply aliases (camelCase wins when both are sent) and drop nulls; the project fields
    of ``project_context`` fill in those not sent at the top level."""
    out: dict[str, Any] = {}
    project_context = params.get("project_context")
    for key, value in params.items():
        if value is None or key == "project_context":
            continue
        name = ALIASES.get(key, key)
        if name != key and name in params and params[name] is not None:
            continue
        value = value if name in FREE_FORM else _strip_nulls(value)
        if name == "preDecision" and isinstance(value, dict):
            value = {_camel(k): v for k, v in value.items()}
        out[name] = value
    if isinstance(project_context, dict):
        for key in PROJECT_FIELDS:
            if project_context.get(key) is not None:
                out.setdefault(key, project_context[key])
    return out


def nul_path(params: dict[str, Any]) -> str | None:
    """The path of a string (or key) in ``params`` holding a NUL character, which no text
    column of Postgres can store; None when there is none."""
    stack: list[tuple[Any, str]] = [(value, key) for key, value in params.items()]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, dict):
            for key, sub in item.items():
                if "\x00" in key:
                    return where
                stack.append((sub, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
    return None


def free_form_problem(value: dict[str, Any]) -> tuple[str, str] | None:
    """Where and how a free-form object breaks the limits above: (a path inside it, the
    problem), or None. Walks without recursion, so any depth is safe to inspect."""
    keys = 0
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict):
            if depth > FREE_FORM_MAX_DEPTH:
                return where, f"is nested more than {FREE_FORM_MAX_DEPTH} levels deep"
            keys += len(item)
            if keys > FREE_FORM_MAX_KEYS:
                return "", f"has more than {FREE_FORM_MAX_KEYS} keys in all"
            for key, sub in item.items():
                if len(key) > FREE_FORM_MAX_KEY_LENGTH:
                    return where, f"has a key longer than {FREE_FORM_MAX_KEY_LENGTH} characters"
                stack.append((sub, f"{where}.{key}", depth + 1))
        elif isinstance(item, list):
            if depth > FREE_FORM_MAX_DEPTH:
                return where, f"is nested more than {FREE_FORM_MAX_DEPTH} levels deep"
            stack.extend((sub, f"{where}[{i}]", depth + 1) for i, sub in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            # JSON has no NaN or Infinity; a transport whose parser reads them (the MCP SDK's
            # reads NaN, and 1e400 as infinity) must not get them stored
            return where, "holds a number that is not finite (NaN or Infinity)"
    if len(msgspec.json.encode(value)) > FREE_FORM_MAX_BYTES:
        return "", f"is larger than {FREE_FORM_MAX_BYTES} bytes as JSON"
    return None


def _check_free_form(params: dict[str, Any], where: Callable[[str], str]) -> None:
    """Apply the free-form limits to every free-form object in ``params``, however deep the
    struct holding it (``action.context``)."""
    stack: list[tuple[dict[str, Any], str]] = [(params, "")]
    while stack:
        item, path = stack.pop()
        for key, value in item.items():
            field = f"{path}.{key}" if path else key
            if not isinstance(value, dict):
                continue
            if key in FREE_FORM:
                problem = free_form_problem(value)
                if problem is not None:
                    inner, text = problem
                    raise invalid_params(where(field) + inner, text)
            else:
                stack.append((value, field))


@functools.cache
def _wire_names(struct: type[Any]) -> frozenset[str]:
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    return frozenset(f.encode_name for f in info.fields)


def known_category(category: str, categories: Sequence[str], field: str) -> None:
    """-32602 naming ``field`` unless ``category`` is one of the configured ``categories``
    (settings, so not a constraint of the params struct). Each method that takes a category
    checks it here, once."""
    if category not in categories:
        raise invalid_params(field, "must be one of: " + ", ".join(categories))


def decode(params: dict[str, Any], struct: type[T]) -> T:
    """Validate ``params`` (already an object) into ``struct`` or raise -32602. Only the
    params ``struct`` knows are read (unknown ones are ignored, SPEC section 2)."""
    known = _wire_names(struct)
    context = params.get("project_context")
    if context is not None and not isinstance(context, dict) and known & set(PROJECT_FIELDS):
        raise invalid_params("project_context", "must be an object holding the project fields")
    normalized = {k: v for k, v in normalize(params).items() if k in known}
    # The params that came from project_context: an error in one names it there.
    borrowed = {k for k in PROJECT_FIELDS if k in normalized and params.get(k) is None}

    def where(field: str) -> str:
        return f"project_context.{field}" if field in borrowed else field

    _check_free_form(normalized, where)
    nul = nul_path(normalized)
    if nul is not None:
        raise invalid_params(where(nul), "must not contain NUL characters")
    try:
        return msgspec.convert(normalized, struct, strict=True)
    except msgspec.ValidationError as exc:
        error = _to_invalid_params(str(exc), struct)
        error.data["field"] = where(error.data["field"])
        raise error from None


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_TYPE = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$")
_BOUND = re.compile(r"^Expected `(?P<want>float|int)` (?P<op>[<>]=?) (?P<num>[-\d.e]+)$")
_TYPE_NAMES = {
    "str": "a string",
    "float": "a number",
    "int": "an integer",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
}


def _field_path(path: str) -> str:
    return path[1:] if path.startswith(".") else path


def _to_invalid_params(text: str, struct: type[Any]) -> CstpError:
    match = _AT.match(text)
    message = match.group("msg") if match else text
    path = _field_path(match.group("path") or "") if match else ""
    missing = _MISSING.match(message)
    if missing:
        field = f"{path}.{missing.group('name')}" if path else missing.group("name")
        return invalid_params(field, "is required")
    return invalid_params(path or "params", _explain(message, path, struct))


def _explain(message: str, path: str, struct: type[Any]) -> str:
    if message.startswith("Invalid enum value"):
        allowed = _allowed_values(struct, path)
        if allowed:
            return "must be one of: " + ", ".join(allowed)
        return "is not an allowed value"
    if "matching regex" in message:
        return "must not be blank" if "'\\\\S'" in message else "has an invalid format"
    bound = _BOUND.match(message)
    if bound:
        num = bound.group("num")
        if bound.group("want") == "float" and num in {"0.0", "1.0"}:
            return "must be between 0.0 and 1.0"
        return f"must be {bound.group('op')} {num}"
    if message.startswith("Expected `str` of length"):
        return message.replace("Expected `str` of length", "length must be")
    if message.startswith("Expected `array` of length"):
        return message.replace("Expected `array` of length", "must have a count")
    typed = _TYPE.match(message)
    if typed:
        wants = [w.strip() for w in typed.group("want").split("|") if w.strip() != "null"]
        names = [_TYPE_NAMES.get(w, w) for w in wants]
        return "must be " + " or ".join(names)
    return message


def _allowed_values(struct: type[Any], path: str) -> list[str]:
    """Walk the struct's type info along ``path`` to list a Literal's allowed values."""
    info: Any = mi.type_info(struct)
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        info = _unwrap(info)
        if part.startswith("["):
            info = getattr(info, "item_type", None)
            continue
        if not isinstance(info, mi.StructType):
            return []
        fields = {f.encode_name: f.type for f in info.fields}
        info = fields.get(part)
        if info is None:
            return []
    info = _unwrap(info)
    if isinstance(info, mi.LiteralType):
        return [str(v) for v in info.values]
    return []


def _unwrap(info: Any) -> Any:
    if isinstance(info, mi.UnionType):
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(info, mi.Metadata):
        return info.type
    return info


def ensure_object(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise CstpError(INVALID_PARAMS, data={"field": "params", "error": "must be an object"})
    return params


def parse_timestamp(field: str, value: str) -> datetime:
    """An ISO-8601 date (midnight UTC) or timestamp with a zone; else -32602 naming ``field``."""
    text = value.strip()
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time.min, tzinfo=UTC)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        if parsed.tzinfo is None:
            raise invalid_params(field, "must carry a time zone (Z or +00:00)")
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise invalid_params(field, "must be an ISO-8601 date or timestamp") from None
