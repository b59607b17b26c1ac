"""The JSON-RPC 2.0 dispatcher: envelope rules, batches, notifications, one transaction per
call, the error table, and one structured log line per call.

No JSON-RPC library fits per-call transactions on Litestar, so this small one is ours.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy.exc import SQLAlchemyError

from .context import CallContext
from .errors import (
    INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR, RpcError, invalid_params, method_not_found,
    storage_error,
)
from .params import decode, ensure_object
from .registry import Method, Registry

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("cstp.rpc")
_encoder = msgspec.json.Encoder()


def _valid_id(value: Any) -> bool:
    return value is None or (
        isinstance(value, (str, int, float, msgspec.Raw)) and not isinstance(value, bool)
    )


def _keep_float_ids(body: bytes, payload: Any) -> None:
    """Put back a float id as the client wrote it (``1E2``, ``1.50``): decoded, it would be
    encoded again as ``100.0``. Rare, so only then is the body read a second time."""
    items = payload if isinstance(payload, list) else [payload]
    floats = [i for i, item in enumerate(items)
              if isinstance(item, dict) and isinstance(item.get("id"), float)]
    if not floats:
        return
    raws = msgspec.json.decode(body, type=list[msgspec.Raw]) if isinstance(payload, list) \
        else [msgspec.Raw(body)]
    for i in floats:
        items[i]["id"] = msgspec.json.decode(raws[i], type=dict[str, msgspec.Raw])["id"]


def _error(rid: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": error.to_wire(), "id": rid}


class Dispatcher:
    def __init__(self, registry: Registry, services: Services) -> None:
        self.registry = registry
        self.services = services

    async def handle(self, body: bytes, agent: str) -> bytes | None:
        """Answer one HTTP body; ``None`` means no response object (notifications only)."""
        try:
            payload = msgspec.json.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _encoder.encode(_error(None, RpcError(PARSE_ERROR)))
        except RecursionError:
            error = RpcError(PARSE_ERROR, "Parse error: nested too deeply")
            return _encoder.encode(_error(None, error))
        _keep_float_ids(body, payload)
        if isinstance(payload, list):
            if not payload:
                return _encoder.encode(_error(None, RpcError(INVALID_REQUEST)))
            limit = self.services.settings.max_batch
            if len(payload) > limit:
                error = RpcError(INVALID_REQUEST, "Batch too large", {"maxBatch": limit})
                return _encoder.encode(_error(None, error))
            responses = []
            for item in payload:
                response = await self.call(item, agent)
                if response is not None:
                    responses.append(response)
            return _encoder.encode(responses) if responses else None
        response = await self.call(payload, agent)
        return None if response is None else _encoder.encode(response)

    async def call(self, item: Any, agent: str) -> dict[str, Any] | None:
        """One request object → its response object, or None for a notification."""
        started = time.perf_counter()
        if not isinstance(item, dict):
            return _error(None, RpcError(INVALID_REQUEST))
        is_notification = "id" not in item
        rid = item.get("id")
        if not _valid_id(rid):
            return _error(None, RpcError(INVALID_REQUEST))
        name = item.get("method")
        if item.get("jsonrpc") != "2.0" or not isinstance(name, str):
            return _error(rid, RpcError(INVALID_REQUEST))
        method = self.registry.get(name)
        raw_params: dict[str, Any] = {}
        try:
            if method is None:
                raise method_not_found(name)
            raw_params = ensure_object(item.get("params"))
            await self.services.limiter.check(agent, name)
            try:
                params = decode(raw_params, method.params)
            except RecursionError:
                raise invalid_params("params", "is nested too deeply") from None
            result = await self._run(method, params, agent)
        except RpcError as exc:
            error = exc
        except Exception:
            log.exception("unexpected error in %s", name)
            error = RpcError(INTERNAL_ERROR)
        else:
            self._log(agent, name, rid, "ok", started)
            return None if is_notification else {"jsonrpc": "2.0", "result": result, "id": rid}
        if method is not None and method.on_failure is not None:
            await self._record_failure(method, agent, raw_params, error)
        self._log(agent, name, rid, str(error.code), started)
        return None if is_notification else _error(rid, error)

    async def _run(self, method: Method, params: Any, agent: str) -> Any:
        try:
            async with self.services.db.transaction(write=method.writes) as session:
                ctx = CallContext(agent, method.name, self.services, session)
                result = await method.handler(ctx, params)
        except (SQLAlchemyError, OSError):
            # OSError: asyncpg raises ConnectionRefusedError (and TimeoutError) unwrapped when
            # it cannot reach Postgres; that is the database, not a bug in the server.
            log.exception("database error in %s", method.name)
            raise storage_error() from None
        for callback in ctx.after_commit:
            try:
                await callback()
            except Exception:
                # The call's rows are committed; the outbox will finish what failed here.
                log.exception("after-commit step of %s failed", method.name)
        return result

    async def _record_failure(
        self, method: Method, agent: str, raw_params: dict[str, Any], error: RpcError
    ) -> None:
        assert method.on_failure is not None
        try:
            async with self.services.db.transaction(write=True) as session:
                ctx = CallContext(agent, method.name, self.services, session)
                await method.on_failure(ctx, raw_params, error)
        except Exception:
            log.exception("could not record the failure of %s", method.name)

    @staticmethod
    def _log(agent: str, method: str, rid: Any, outcome: str, started: float) -> None:
        if log.isEnabledFor(logging.INFO):
            line = {
                "event": "rpc",
                "agent": agent,
                "method": method[:200],
                "id": bytes(rid).decode() if isinstance(rid, msgspec.Raw)
                else rid if _valid_id(rid) else None,
                "outcome": outcome,
                "durationMs": round((time.perf_counter() - started) * 1000, 2),
            }
            log.info(json.dumps(line, default=str))
