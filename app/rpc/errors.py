"""The JSON-RPC error table (SPEC.md section 1): one number, one meaning."""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RATE_LIMITED = -32002
QUERY_FAILED = -32003
GUARDRAIL_EVAL_FAILED = -32004
STORAGE_ERROR = -32005
UNAVAILABLE = -32006
DECISION_NOT_FOUND = -32007
CONFLICT = -32008

MESSAGES = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid params",
    INTERNAL_ERROR: "Internal error",
    RATE_LIMITED: "Rate limited",
    QUERY_FAILED: "Query failed",
    GUARDRAIL_EVAL_FAILED: "Guardrail evaluation failed",
    STORAGE_ERROR: "Storage error",
    UNAVAILABLE: "Unavailable",
    DECISION_NOT_FOUND: "Decision not found",
    CONFLICT: "Conflict",
}
# What any method can answer: bad params, over budget, the database, the shared rate-limit
# store unreachable, a bug.
COMMON = (INVALID_PARAMS, RATE_LIMITED, STORAGE_ERROR, UNAVAILABLE, INTERNAL_ERROR)


class RpcError(Exception):
    """An error a client is meant to see. Its message and data are safe to send."""

    def __init__(self, code: int, message: str | None = None, data: Any = None) -> None:
        super().__init__(message or MESSAGES[code])
        self.code = code
        self.message = message or MESSAGES[code]
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(field: str, error: str) -> RpcError:
    return RpcError(INVALID_PARAMS, data={"field": field, "error": error})


def method_not_found(name: str) -> RpcError:
    return RpcError(METHOD_NOT_FOUND, data={"method": name[:200]})


def rate_limited(retry_after_ms: int) -> RpcError:
    return RpcError(RATE_LIMITED, data={"retryAfterMs": retry_after_ms})


def query_failed() -> RpcError:
    return RpcError(QUERY_FAILED, "Query failed: the vector index is unavailable")


def storage_error() -> RpcError:
    return RpcError(STORAGE_ERROR, "Storage error: the database could not be used")


def decision_not_found(decision_id: str) -> RpcError:
    return RpcError(DECISION_NOT_FOUND, data={"id": decision_id})


def unavailable(what: str, retry_after_ms: int) -> RpcError:
    """A dependency the call needs is unreachable: an outage, not a bug (SPEC -32006)."""
    return RpcError(
        UNAVAILABLE, f"Unavailable: {what} is unreachable", {"retryAfterMs": retry_after_ms}
    )
