"""The JSON-RPC 2.0 face: envelope rules, batches, notifications and the error objects; each
request's operation runs through the shared runner (app.operations.runner), which gives it
its own transaction and logs it.

No JSON-RPC library fits per-call transactions on Litestar, so this small one is ours.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from app.errors import CstpError
from app.operations.registry import Registry
from app.operations.runner import Runner, log_call
from app.scopes import Principal

from .errors import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    envelope_error,
    method_not_found,
    to_wire,
)

if TYPE_CHECKING:
    from app.services import Services

_encoder = msgspec.json.Encoder()


def _valid_id(value: Any) -> bool:
    return value is None or (
        isinstance(value, (str, int, float, msgspec.Raw)) and not isinstance(value, bool)
    )


def _keep_float_ids(body: bytes, payload: Any) -> None:
    """Put back a float id as the client wrote it (``1E2``, ``1.50``): decoded, it would be
    encoded again as ``100.0``. Rare, so only then is the body read a second time."""
    items = payload if isinstance(payload, list) else [payload]
    floats = [
        i
        for i, item in enumerate(items)
        if isinstance(item, dict) and isinstance(item.get("id"), float)
    ]
    if not floats:
        return
    raws = (
        msgspec.json.decode(body, type=list[msgspec.Raw])
        if isinstance(payload, list)
        else [msgspec.Raw(body)]
    )
    for i in floats:
        items[i]["id"] = msgspec.json.decode(raws[i], type=dict[str, msgspec.Raw])["id"]


def _error(rid: Any, error: CstpError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": to_wire(error), "id": rid}


class Dispatcher:
    def __init__(self, registry: Registry, services: Services, runner: Runner) -> None:
        self.registry = registry
        self.services = services
        self.runner = runner

    async def handle(self, body: bytes, principal: Principal) -> bytes | None:
        """Answer one HTTP body; ``None`` means no response object (notifications only)."""
        try:
            payload = msgspec.json.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _encoder.encode(_error(None, envelope_error(PARSE_ERROR)))
        except RecursionError:
            error = envelope_error(PARSE_ERROR, "Parse error: nested too deeply")
            return _encoder.encode(_error(None, error))
        _keep_float_ids(body, payload)
        if isinstance(payload, list):
            if not payload:
                return _encoder.encode(_error(None, envelope_error(INVALID_REQUEST)))
            limit = self.services.settings.max_batch
            if len(payload) > limit:
                error = envelope_error(INVALID_REQUEST, "Batch too large", {"maxBatch": limit})
                return _encoder.encode(_error(None, error))
            responses = []
            for item in payload:
                response = await self.call(item, principal)
                if response is not None:
                    responses.append(response)
            return _encoder.encode(responses) if responses else None
        response = await self.call(payload, principal)
        return None if response is None else _encoder.encode(response)

    async def call(self, item: Any, principal: Principal) -> dict[str, Any] | None:
        """One request object → its response object, or None for a notification."""
        if not isinstance(item, dict):
            return _error(None, envelope_error(INVALID_REQUEST))
        is_notification = "id" not in item
        rid = item.get("id")
        if not _valid_id(rid):
            return _error(None, envelope_error(INVALID_REQUEST))
        name = item.get("method")
        if item.get("jsonrpc") != "2.0" or not isinstance(name, str):
            return _error(rid, envelope_error(INVALID_REQUEST))
        log_id = bytes(rid).decode() if isinstance(rid, msgspec.Raw) else rid
        operation = self.registry.get(name)
        if operation is None:
            log_call(principal, name, log_id, str(METHOD_NOT_FOUND), time.perf_counter(), "jsonrpc")
            return None if is_notification else _error(rid, method_not_found(name))
        try:
            result = await self.runner.run(
                operation, item.get("params"), principal, request_id=log_id
            )
        except CstpError as exc:
            return None if is_notification else _error(rid, exc)
        return None if is_notification else {"jsonrpc": "2.0", "result": result, "id": rid}
