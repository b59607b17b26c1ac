"""What a feature that can be switched while the server runs costs a call: one app in one
process, the feature on for one call and off for the next, the same params for both.

``bench.compare`` runs two server processes side by side; on this kind of machine two
identical servers drift apart by up to 0.3 ms at the 95% bound of a run, so it cannot
tell a tenth of a millisecond. Here both sides are the same process, the same caches and
the same moment, so what is left is the feature's own work on a call's path:

    python -m bench.overhead --feature metrics --method cstp.announceIntent
    python -m bench.overhead --feature tracing --method cstp.queryDecisions --calls 1200
    python -m bench.overhead --feature none     # A/A: what the harness itself resolves

- ``metrics``: the runner's and the guardrails' instrument updates (in the multiprocess
  mode ``cstp serve`` uses) against none;
- ``tracing``: a span per call, exported over OTLP/HTTP to a sink this starts
  (``bench.otlp_sink``), against no tracing.

The calls go through the app's ASGI interface (no HTTP server, no socket): the figure is
the feature's cost on a call's path within the app, not a latency a client sees. Work a
feature defers until the server is idle (the spans of ended calls) is done between calls,
untimed: what it costs a caller depends on how busy the server is (``bench.compare`` shows
it for one client calling without pause). Calls are paired in blocks of two (off first, then
on first), as in ``bench.compare``; the report is the median of the differences with a
bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from app.observability import shared_dir
from bench.compare import blocks, median_interval
from bench.run import params_for
from bench.seed import Generator
from bench.server import free_port

METHODS = (
    "cstp.announceIntent",
    "cstp.queryDecisions",
    "cstp.checkGuardrails",
    "cstp.recordDecision",
)
TOKEN = "bench-overhead-token"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument(
        "--feature",
        choices=("metrics", "tracing", "none"),
        required=True,
        help="none: an A/A run, nothing switched (the harness's own resolution)",
    )
    p.add_argument("--method", choices=METHODS, default="cstp.announceIntent")
    p.add_argument("--size", type=int, default=300, help="decisions recorded first (300)")
    p.add_argument("--calls", type=int, default=800, help="measured pairs, even (800)")
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the texts")
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = p.parse_args(argv)
    if args.size < 1 or args.calls < 10 or args.calls % 2:
        p.error("--size must be positive, --calls even and at least 10")
    return args


class Switch:
    """Turns the feature on or off in a started app, between two calls."""

    def __init__(self, app: Any, feature: str, method: str) -> None:
        self.app, self.feature, self.method = app, feature, method
        self.traced = 0  # calls whose spans were made (tracing)
        services = app.state.services
        self._metrics = services.metrics
        self._updates = (self._metrics.call, self._metrics.verdicts)
        self._tracing = app.state.tracing
        if feature == "tracing" and self._tracing is None:
            raise SystemExit("tracing did not start: is the otel extra installed?")

    def set(self, on: bool) -> None:
        if self.feature == "none":
            return
        if self.feature == "metrics":
            update = self._updates if on else (_nothing, _nothing)
            self._metrics.call, self._metrics.verdicts = update
        else:
            tracing = self._tracing if on else None
            self.app.state.dispatcher.runner.tracing = self.app.state.tracing = tracing

    def settle(self) -> None:
        """Between two calls, untimed: the work the feature defers until the server is idle
        (the spans of ended calls), which would otherwise fall on whichever call came next."""
        if self._tracing is not None:
            self.traced += self._tracing.pending
            self._tracing.make_spans()

    def seen(self) -> int | None:
        """The calls of the method the feature has seen so far: the calls counted by the
        metrics, or those whose spans tracing made (a check that the switch switched); None
        when nothing is switched."""
        if self.feature == "none":
            return None
        if self.feature == "tracing":
            return self.traced
        return sum(
            int(sample.value)
            for collector in self._metrics.collectors()
            for family in collector.collect()
            for sample in family.samples
            if sample.name == "cstp_calls_total" and sample.labels.get("method") == self.method
        )


def _nothing(*_: Any) -> None:
    return None


async def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    # Imported here: the environment (metrics directory, OTLP endpoint) is set by then.
    from app.asgi import create_app
    from app.config import Settings, parse_rate_limits
    from app.db import migrate

    (folder / "data").mkdir(parents=True)
    settings = Settings(
        data_dir=folder / "data",
        database_url=f"sqlite+aiosqlite:///{folder / 'data' / 'cstp.db'}",
        decisions_dir=folder / "decisions",
        auth_tokens={TOKEN: "bench"},
        rate_limits=parse_rate_limits("default=1000000/1"),
    )
    await migrate.upgrade(settings.database_url)
    app = create_app(settings)
    gen = Generator(args.seed)
    async with app.lifespan():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}

            async def call(method: str, params: dict[str, Any]) -> None:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                answer = (await http.post("/cstp", json=body, headers=headers)).json()
                if "result" not in answer:
                    raise SystemExit(f"{method} failed: {answer.get('error')}")

            for i, params in enumerate(params_for(gen, "cstp.recordDecision", args.size)):
                await call("cstp.recordDecision", params)
                if (i + 1) % 100 == 0:
                    print(f"[seed] {i + 1}/{args.size}", file=sys.stderr)
            switch = Switch(app, args.feature, args.method)
            for params in params_for(gen, args.method, 30):  # warm-up, both sides
                for on in (False, True):
                    switch.set(on)
                    await call(args.method, params)
            switch.settle()
            seen_before = switch.seen()
            times: dict[bool, list[float]] = {False: [], True: []}
            diffs = []
            for i, params in enumerate(params_for(gen, args.method, args.calls)):
                took = {}
                for on in (False, True) if i % 2 == 0 else (True, False):
                    switch.set(on)
                    started = time.perf_counter()
                    await call(args.method, params)
                    took[on] = (time.perf_counter() - started) * 1000
                    times[on].append(took[on])
                    switch.settle()
                diffs.append(took[True] - took[False])
            seen_after = switch.seen()
            seen = None if seen_after is None or seen_before is None else seen_after - seen_before
            switch.set(True)
    paired = blocks(diffs)
    low, high = median_interval(paired)
    return {
        "feature": args.feature,
        "method": args.method,
        "pairs": args.calls,
        "seenByFeature": seen,  # the measured calls it was on for: should be ``pairs``
        "offP50": round(statistics.median(times[False]), 3),
        "onP50": round(statistics.median(times[True]), 3),
        "medianDiffMs": round(statistics.median(paired), 3),
        "medianDiff95": [round(low, 3), round(high, 3)],
    }


def with_sink(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run`` with OTLP/HTTP export to a local sink (``bench.otlp_sink``) that it starts."""
    port = free_port()
    sink = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", "--port", str(port)])
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    try:
        time.sleep(0.5)  # the sink's socket is bound by then (a refused export is only lost)
        return run()
    finally:
        sink.terminate()
        sink.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cstp-overhead-") as tmp:
        folder = Path(tmp)
        shared_dir.prepare(folder / "metrics")  # the multiprocess mode, as `cstp serve` sets
        for name in [n for n in os.environ if n.startswith("OTEL_")]:
            del os.environ[name]  # only what this run sets
        if args.feature == "tracing":
            report = with_sink(lambda: asyncio.run(measure(args, folder)))
        else:
            report = asyncio.run(measure(args, folder))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    low, high = report["medianDiff95"]
    print(
        f"{report['method']}, {report['feature']} on - off over {report['pairs']} pairs: "
        f"{report['medianDiffMs']:+.3f} ms [{low:+.3f}, {high:+.3f}] "
        f"(p50 off {report['offP50']}, on {report['onP50']})"
    )
    if report["seenByFeature"] not in (None, report["pairs"]):
        print(
            f"the switch failed: {report['feature']} saw {report['seenByFeature']} of the "
            f"{report['pairs']} calls it was on for",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
