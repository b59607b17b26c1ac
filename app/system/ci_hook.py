"""``POST /hooks/ci/<workspace>``: CI reports a pull request's outcome (app/ci/hook.py).

No bearer token: the report is signed with the workspace's CI secret (Standard Webhooks).
The body is capped like /cstp's; it is read whole before anything else, since the signature
covers it. Every refusal (bad signature or timestamp, replay, no such workspace, no CI
secret) is the same 401 body, so that an answer does not say which workspaces exist or have
a secret (a workspace without one still has the signature checked, against a decoy secret,
so the two take about the same time; the key file is read only for a workspace with one); the
server's log says which it was.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.exceptions import ClientException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath

from app.ci import hook

log = logging.getLogger("cstp.ci")

JSON = "application/json"
REFUSED = b'{"error":"unauthorized","message":"the CI report was not accepted"}'
TOO_LARGE = b'{"error":"payload_too_large","message":"request body is too large"}'
UNAVAILABLE = b'{"error":"unavailable","message":"the report could not be stored: send it again"}'
FAILED = b'{"error":"internal","message":"the report could not be handled"}'


def build_ci_route(max_body_bytes: int) -> HTTPRouteHandler:
    @post("/hooks/ci/{workspace:str}", request_max_body_size=max_body_bytes, status_code=200)
    async def ci_hook(request: Request[Any, Any, Any], workspace: FromPath[str]) -> Response[bytes]:
        try:
            body = await request.body()
        except ClientException as exc:
            if exc.status_code == 413:
                return Response(TOO_LARGE, status_code=413, media_type=JSON)
            raise
        headers = {
            name: value for name in hook.HEADERS if (value := request.headers.get(name)) is not None
        }
        try:
            reviewed = await hook.receive(request.app.state.services, workspace, body, headers)
        except hook.Refused as exc:
            log.warning("CI report for workspace %.63r refused: %s", workspace, exc.reason)
            return Response(REFUSED, status_code=401, media_type=JSON)
        except hook.Malformed as exc:
            answer = {"error": "bad_request", "message": str(exc)}
            return Response(msgspec.json.encode(answer), status_code=400, media_type=JSON)
        except hook.Unavailable:
            return Response(
                UNAVAILABLE, status_code=503, media_type=JSON, headers={"Retry-After": "1"}
            )
        except Exception:
            log.exception("unexpected error in a CI report for workspace %.63r", workspace)
            return Response(FAILED, status_code=500, media_type=JSON)
        return Response(msgspec.json.encode({"reviewed": reviewed}), media_type=JSON)

    return ci_hook
