"""The JSON-RPC envelope's own errors (parse, invalid request, unknown method) beside the
domain's (app.errors), all rendered as JSON-RPC error objects: one number, one meaning."""

from __future__ import annotations

from typing import Any

from app.errors import CstpError

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601

ENVELOPE_MESSAGES = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
}


def envelope_error(code: int, message: str | None = None, data: Any = None) -> CstpError:
    return CstpError(code, message or ENVELOPE_MESSAGES[code], data)


def method_not_found(name: str) -> CstpError:
    return envelope_error(METHOD_NOT_FOUND, data={"method": name[:200]})


def to_wire(error: CstpError) -> dict[str, Any]:
    wire: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        wire["data"] = error.data
    return wire
