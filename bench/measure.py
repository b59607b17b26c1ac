"""Latency and throughput of one method under ``concurrency`` clients.

Each client is one ``httpx.AsyncClient`` with one keep-alive connection; the clients pull the
next call from a shared list, so the load stays even. Params are generated before the clock
starts. Percentiles are over successful calls; every error is counted by kind and reported.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.client import Outcome, RpcClient
from bench.stats import summarize


@dataclass
class MethodRun:
    method: str
    concurrency: int
    planned: int
    outcomes: list[tuple[dict[str, Any], Outcome]] = field(default_factory=list)
    elapsed_s: float = 0.0
    timed_out: bool = False
    warmup_errors: dict[str, int] = field(default_factory=dict)
    warmup: list[tuple[dict[str, Any], Outcome]] = field(default_factory=list)

    def errors(self) -> dict[str, int]:
        counts = Counter(o.error for _, o in self.outcomes if not o.ok)
        missing = self.planned - len(self.outcomes)
        if missing:
            counts["phase-timeout"] += missing
        return dict(counts)

    def ok_count(self) -> int:
        return sum(1 for _, o in self.outcomes if o.ok)

    def as_json(self, floor_ms: float | None) -> dict[str, Any]:
        stats = summarize([o.latency_ms for _, o in self.outcomes if o.ok])
        ok = self.ok_count()
        samples: dict[str, str] = {}
        for _, o in self.outcomes:
            if not o.ok and o.error not in samples:
                samples[str(o.error)] = str(o.message)
        extra: dict[str, Any] = {}
        if self.method == "cstp.recordDecision":
            extra["notIndexedOnReturn"] = sum(
                1
                for _, o in self.outcomes
                if o.ok and isinstance(o.result, dict) and o.result.get("indexed") is False
            )
        if self.method in ("cstp.checkGuardrails", "cstp.announceIntent"):
            extra["blocked"] = sum(1 for _, o in self.outcomes if o.ok and _blocked(o.result))
        return {
            "method": self.method,
            "concurrency": self.concurrency,
            "calls": self.planned,
            "ok": ok,
            "errorCount": self.planned - ok,
            "errors": self.errors(),
            "errorSamples": samples,
            "warmupErrors": self.warmup_errors,
            "latencyMs": stats,
            "elapsedS": round(self.elapsed_s, 3),
            "throughputOkPerS": round(ok / self.elapsed_s, 1) if self.elapsed_s > 0 else None,
            "p50xFloor": round(stats["p50"] / floor_ms, 2)
            if stats["p50"] is not None and floor_ms
            else None,
            "timedOut": self.timed_out,
            **extra,
        }


def _blocked(result: Any) -> bool:
    if not isinstance(result, dict):
        return False
    verdict = result.get("guardrailStatus", result)
    return isinstance(verdict, dict) and verdict.get("allowed") is False


async def _drive(
    clients: list[RpcClient],
    method: str,
    params: list[dict[str, Any]],
    sink: list[tuple[dict[str, Any], Outcome]],
) -> None:
    queue = iter(params)  # shared: each worker takes the next call when it is free

    async def worker(client: RpcClient) -> None:
        for p in queue:
            sink.append((p, await client.call(method, p)))

    await asyncio.gather(*(worker(c) for c in clients))


async def measure_method(
    base_url: str,
    token: str,
    method: str,
    params: list[dict[str, Any]],
    warmup: list[dict[str, Any]],
    concurrency: int,
    cap_s: float,
    request_timeout: float,
) -> MethodRun:
    run = MethodRun(method, concurrency, len(params))
    clients = [RpcClient(base_url, token, timeout=request_timeout) for _ in range(concurrency)]
    try:
        warm = run.warmup
        try:
            await asyncio.wait_for(_drive(clients, method, warmup, warm), cap_s / 4)
        except TimeoutError:
            run.warmup_errors["phase-timeout"] = len(warmup) - len(warm)
        for _, o in warm:
            if not o.ok:
                run.warmup_errors[str(o.error)] = run.warmup_errors.get(str(o.error), 0) + 1
        start = time.perf_counter()
        try:
            await asyncio.wait_for(_drive(clients, method, params, run.outcomes), cap_s)
        except TimeoutError:
            run.timed_out = True
        run.elapsed_s = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return run
