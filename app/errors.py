"""Errors a caller is meant to see, raised by the domain and rendered by each face.

Each error carries what a face needs to render it: the code of the protocol's error table
(docs/PROTOCOL.md: one number, one meaning, the same on every face), a message and data that
are safe to send. The JSON-RPC face makes them error objects; the MCP face makes them tool
errors with the same code and message. A domain module raises these and knows no face.
"""

from __future__ import annotations

from typing import Any

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RATE_LIMITED = -32002
QUERY_FAILED = -32003
GUARDRAIL_EVAL_FAILED = -32004
STORAGE_ERROR = -32005
UNAVAILABLE = -32006
DECISION_NOT_FOUND = -32007
CONFLICT = -32008
FORBIDDEN = -32010

MESSAGES = {
    INVALID_PARAMS: "Invalid params",
    INTERNAL_ERROR: "Internal error",
    RATE_LIMITED: "Rate limited",
    QUERY_FAILED: "Query failed",
    GUARDRAIL_EVAL_FAILED: "Guardrail evaluation failed",
    STORAGE_ERROR: "Storage error",
    UNAVAILABLE: "Unavailable",
    DECISION_NOT_FOUND: "Decision not found",
    CONFLICT: "Conflict",
    FORBIDDEN: "Forbidden",
}

# What any operation can answer: bad params, over budget, the database, the shared rate-limit
# store unreachable, a token without the operation's scope, a bug.
COMMON = (INVALID_PARAMS, RATE_LIMITED, STORAGE_ERROR, UNAVAILABLE, FORBIDDEN, INTERNAL_ERROR)


class CstpError(Exception):
    """An error a caller is meant to see. Its message and data are safe to send."""

    def __init__(self, code: int, message: str | None = None, data: Any = None) -> None:
        text = message or MESSAGES.get(code, "Error")
        super().__init__(text)
        self.code = code
        self.message = text
        self.data = data


def invalid_params(field: str, error: str) -> CstpError:
    """A param is missing, of the wrong type or out of range; ``field`` names it."""
    return CstpError(INVALID_PARAMS, data={"field": field, "error": error})


def forbidden(scope: str, why: str) -> CstpError:
    """The token lacks ``scope``, which the call (or the object it acts on) needs."""
    return CstpError(FORBIDDEN, f"Forbidden: {why}", {"scope": scope})


def rate_limited(retry_after_ms: int) -> CstpError:
    return CstpError(RATE_LIMITED, data={"retryAfterMs": retry_after_ms})


def query_failed() -> CstpError:
    return CstpError(QUERY_FAILED, "Query failed: the vector index is unavailable")


def guardrail_eval_failed(message: str, data: Any = None) -> CstpError:
    return CstpError(GUARDRAIL_EVAL_FAILED, message, data)


def storage_error() -> CstpError:
    return CstpError(STORAGE_ERROR, "Storage error: the database could not be used")


def unavailable(what: str, retry_after_ms: int, problem: str = "is unreachable") -> CstpError:
    """A dependency the call needs is unreachable, or cannot do what the call needs of it
    (``problem``: "refuses writes"): an outage, not a bug."""
    return CstpError(
        UNAVAILABLE, f"Unavailable: {what} {problem}", {"retryAfterMs": retry_after_ms}
    )


def decision_not_found(decision_id: str) -> CstpError:
    return CstpError(DECISION_NOT_FOUND, data={"id": decision_id})


def conflict(message: str, data: Any = None) -> CstpError:
    return CstpError(CONFLICT, message, data)


def internal_error() -> CstpError:
    return CstpError(INTERNAL_ERROR)
