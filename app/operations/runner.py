"""The runner every face calls: one operation call, from raw params to its result.

The scope check, the rate limit, params validation, one transaction per call (committed,
then the after-commit steps) unless the operation commits in batches of its own, the failure
hook that audits a failed call, and one structured log line per call. A face resolves the
operation, hands the raw params (a JSON object) and the principal its token names, and
renders the result or the ``CstpError`` raised.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from app.errors import (
    FORBIDDEN,
    CstpError,
    forbidden,
    internal_error,
    invalid_params,
    storage_error,
)
from app.observability.logs import Fields
from app.scopes import Principal

from .context import CallContext
from .params import decode, ensure_object
from .registry import Operation

if TYPE_CHECKING:
    from app.observability.calls import CallSpan
    from app.observability.tracing import Tracing
    from app.services import Services

log = logging.getLogger("cstp.rpc")


class Runner:
    def __init__(self, services: Services) -> None:
        self.services = services
        # Set while the app runs with tracing on (app.asgi): a span per call.
        self.tracing: Tracing | None = None

    async def run(
        self,
        operation: Operation[Any, Any],
        raw_params: Any,
        principal: Principal,
        *,
        face: str = "jsonrpc",
        request_id: Any = None,
    ) -> Any:
        """The operation's result, or a ``CstpError`` to render (a bug becomes -32603).
        Counted in ``services.calls`` while it runs."""
        calls = self.services.calls
        calls.running += 1
        try:
            tracing = self.tracing
            traced = None if tracing is None else tracing.call(operation.name, principal, face)
            if traced is None:
                return await self._call(operation, raw_params, principal, face, request_id, None)
            with traced:
                return await self._call(operation, raw_params, principal, face, request_id, traced)
        finally:
            calls.running -= 1

    async def _call(
        self,
        operation: Operation[Any, Any],
        raw_params: Any,
        principal: Principal,
        face: str,
        request_id: Any,
        traced: CallSpan | None,
    ) -> Any:
        started = time.perf_counter()
        agent = principal.agent
        raw: dict[str, Any] = {}
        try:
            raw = ensure_object(raw_params)
            if not any(principal.may(scope) for scope in operation.scopes):
                raise forbidden(operation.scopes[0], f"{operation.name} needs this scope")
            await self.services.limiter.check(principal.workspace, agent, operation.name)
            try:
                params = decode(raw, operation.params)
            except RecursionError:
                raise invalid_params("params", "is nested too deeply") from None
            result = await self._run(operation, params, principal, face, traced)
        except CstpError as exc:
            error = exc
        except Exception:
            log.exception("unexpected error in %s", operation.name)
            error = internal_error()
        else:
            log_call(principal, operation.name, request_id, "ok", started, face)
            self.services.metrics.call(operation.name, face, "ok", started)
            return result
        # A call its token may not make never reached the operation: nothing is written for it
        # (a read-only token must not add audit rows, at no rate limit's cost).
        if operation.on_failure is not None and error.code != FORBIDDEN:
            await self._record_failure(operation, principal, raw, error)
        log_call(principal, operation.name, request_id, str(error.code), started, face)
        self.services.metrics.call(operation.name, face, str(error.code), started)
        raise error

    async def _run(
        self,
        operation: Operation[Any, Any],
        params: Any,
        principal: Principal,
        face: str,
        traced: CallSpan | None,
    ) -> Any:
        try:
            if not operation.transaction:  # it commits in batches (app.batches)
                ctx = CallContext(
                    principal, operation.name, self.services, None, face=face, span=traced
                )
                return await operation.handler(ctx, params)
            async with self.services.db.transaction(write=operation.writes) as session:
                ctx = CallContext(
                    principal, operation.name, self.services, session, face=face, span=traced
                )
                result = await operation.handler(ctx, params)
        except (SQLAlchemyError, OSError):
            # OSError: asyncpg raises ConnectionRefusedError (and TimeoutError) unwrapped when
            # it cannot reach Postgres; that is the database, not a bug in the server.
            log.exception("database error in %s", operation.name)
            raise storage_error() from None
        for callback in ctx.after_commit:
            try:
                await callback()
            except Exception:
                # The call's rows are committed; the outbox will finish what failed here.
                log.exception("after-commit step of %s failed", operation.name)
        return result

    async def _record_failure(
        self,
        operation: Operation[Any, Any],
        principal: Principal,
        raw_params: dict[str, Any],
        error: CstpError,
    ) -> None:
        assert operation.on_failure is not None
        try:
            async with self.services.db.transaction(write=True) as session:
                ctx = CallContext(principal, operation.name, self.services, session)
                await operation.on_failure(ctx, raw_params, error)
        except Exception:
            log.exception("could not record the failure of %s", operation.name)


# The longest caller-supplied value a log line holds: a JSON-RPC id or method name can be
# as long as the body cap (1 MiB), and so would the line be.
LOGGED_CHARS = 200


def clip(value: Any) -> Any:
    """``value`` for a log line: as it is when short, else the first LOGGED_CHARS characters
    of its text and how long that was."""
    if value is None or isinstance(value, bool):
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) <= LOGGED_CHARS:
        return value if isinstance(value, (int, float)) else text
    return f"{text[:LOGGED_CHARS]}... ({len(text)} characters)"


def log_call(
    principal: Principal, name: str, request_id: Any, outcome: str, started: float, face: str
) -> None:
    """One structured line per call: workspace, agent, operation, id, outcome, duration, face
    (the caller's id and method name cut to LOGGED_CHARS). A text log shows them as one JSON
    object; a JSON log (CSTP_LOG_FORMAT=json) as keys of the line's own object."""
    if log.isEnabledFor(logging.INFO):
        method = clip(name)
        line = {
            "event": "rpc",
            "face": face,
            "workspace": principal.workspace,
            "agent": clip(principal.agent),
            "method": method,
            "id": clip(request_id),
            "outcome": outcome,
            "durationMs": round((time.perf_counter() - started) * 1000, 2),
        }
        log.info(Fields(f"{method} {outcome}", line))
