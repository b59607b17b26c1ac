"""A minimal JSON-RPC client for the benchmark: keep-alive, loopback only, every error counted.

Each outcome is classified into one short error key so the report can say exactly what went
wrong: a JSON-RPC error code (``rpc-32603``), an HTTP status (``http-500``), a transport failure
(``transport-ReadTimeout``) or an unreadable body (``bad-response``).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

LOOPBACK = frozenset({"127.0.0.1"})


def require_loopback(url: str) -> None:
    """The harness talks to 127.0.0.1 only; anything else is a mistake in its arguments."""
    host = urlsplit(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"the benchmark only sends requests to 127.0.0.1, not {host!r}")


@dataclass(frozen=True)
class Outcome:
    """One JSON-RPC call as the client saw it; ``latency_ms`` covers the whole HTTP round trip."""

    ok: bool
    latency_ms: float
    error: str | None = None
    message: str | None = None
    result: Any = None


def _classify(item: Any) -> tuple[bool, str | None, str | None, Any]:
    if not isinstance(item, dict):
        return False, "bad-response", repr(item)[:200], None
    if "error" in item:
        error = item["error"] if isinstance(item["error"], dict) else {}
        code = error.get("code")
        return False, f"rpc{code}", str(error.get("message", ""))[:200], None
    if "result" in item:
        return True, None, None, item["result"]
    return False, "bad-response", repr(item)[:200], None


class RpcClient:
    """One benchmark client: one ``httpx.AsyncClient`` (one keep-alive pool) per instance."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 30.0, max_connections: int = 1
    ) -> None:
        require_loopback(base_url)
        self._url = base_url.rstrip("/") + "/cstp"
        self._ids = itertools.count(1)
        self._http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            trust_env=False,  # never route through a proxy from the environment
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, payload: Any) -> tuple[float, Any, str | None, str | None]:
        """POST a body; returns (ms, decoded body or None, error key, message)."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        start = time.perf_counter()
        try:
            response = await self._http.post(self._url, content=body)
            raw = response.content
        except httpx.HTTPError as exc:
            elapsed = (time.perf_counter() - start) * 1000
            return elapsed, None, f"transport-{type(exc).__name__}", str(exc)[:200]
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            text = raw[:200].decode("utf-8", "replace")
            return elapsed, None, f"http-{response.status_code}", text
        if decoded is None:
            return elapsed, None, "bad-response", raw[:200].decode("utf-8", "replace")
        return elapsed, decoded, None, None

    async def call(self, method: str, params: dict[str, Any]) -> Outcome:
        payload = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}
        elapsed, decoded, error, message = await self._post(payload)
        if error is not None:
            return Outcome(False, elapsed, error, message)
        ok, error, message, result = _classify(decoded)
        return Outcome(ok, elapsed, error, message, result)

    async def batch(self, method: str, items: list[dict[str, Any]]) -> list[Outcome]:
        """One JSON-RPC batch of calls to ``method``; outcomes in the order of ``items``."""
        first = next(self._ids)
        ids = [first + i for i in range(len(items))]
        self._ids = itertools.count(first + len(items))
        payload = [
            {"jsonrpc": "2.0", "id": i, "method": method, "params": p}
            for i, p in zip(ids, items, strict=True)
        ]
        elapsed, decoded, error, message = await self._post(payload)
        if error is not None:
            return [Outcome(False, elapsed, error, message) for _ in items]
        if not isinstance(decoded, list):
            return [Outcome(False, elapsed, *_classify(decoded)[1:3]) for _ in items]
        by_id = {r.get("id"): r for r in decoded if isinstance(r, dict)}
        outcomes = []
        for i in ids:
            ok, err, msg, result = _classify(by_id.get(i, "missing response"))
            outcomes.append(Outcome(ok, elapsed, err, msg, result))
        return outcomes

    async def get(self, path: str) -> httpx.Response:
        return await self._http.get(self._url.rsplit("/cstp", 1)[0] + path)
