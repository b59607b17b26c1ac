"""JSON Schemas of the operations' params and results, generated from the same msgspec types
the runner decodes params with and the handlers answer: rpc.discover and the MCP tools both
read them here, so neither can drift from the code."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec

from .registry import Operation


def schemas(
    operations: Sequence[Operation[Any, Any]], ref_template: str
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], dict[str, Any]]:
    """Each operation's (params schema, result schema), and the named schemas they refer to
    (``ref_template`` says where those live, e.g. ``#/$defs/{name}``). Fresh objects on every
    call: the caller may change them."""
    types = tuple(t for op in operations for t in (op.params, op.result))
    found, components = msgspec.json.decode(_generated(types, ref_template))
    return list(zip(found[::2], found[1::2], strict=True)), components


@functools.cache
def _generated(types: tuple[Any, ...], ref_template: str) -> bytes:
    """The schemas of ``types``, generated once per set of types (msgspec's inspection takes
    tens of milliseconds, and every app and command built in a process asks again), kept
    encoded so that each caller decodes its own copy."""
    found, components = msgspec.json.schema_components(types, ref_template=ref_template)
    return msgspec.json.encode([[_portable(s) for s in found], _portable(components)])


def resolved(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """The schema itself where it is a ref to a named one (a struct: its properties)."""
    if "$ref" in schema:
        named: dict[str, Any] = components[schema["$ref"].rsplit("/", 1)[-1]]
        return named
    return schema


def _portable(schema: Any) -> Any:
    """JSON Schema patterns are ECMA-262 regular expressions, which know no ``\\A`` and
    ``\\Z``: our whole-string anchors (there because Python's ``$`` also matches before a
    final newline) become ``^`` and ``$``, which mean the same there."""
    if isinstance(schema, dict):
        out = {key: _portable(value) for key, value in schema.items()}
        pattern = out.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("\\A") and pattern.endswith("\\Z"):
            out["pattern"] = "^" + pattern[2:-2] + "$"
        return out
    if isinstance(schema, list):
        return [_portable(item) for item in schema]
    return schema
