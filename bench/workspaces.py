"""A small workspace in a large database: what a search in it costs (issue #38's criterion,
queryDecisions p95 <= 25 ms in a workspace of 1,000 decisions among 100,000).

    python -m bench.workspaces --big 99000 --small 1000 --calls 400

The large workspace (``default``) is loaded with ``cstp import`` from generated YAML files
(faster than recording each: the import embeds in batches), before the server starts, since
the embedded vector index serves one process. A token of workspace ``small`` is made with
``cstp tokens create``; the small workspace's decisions are recorded through the server with
it, and then queryDecisions is measured with it, one client, calls in sequence, and for
comparison with the large workspace's token. Every search of the small workspace must answer
only its own decisions: each result is checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bench.client import RpcClient
from bench.run import log
from bench.seed import Generator
from bench.server import REPO_ROOT, BenchError, Prepared, prepare_server
from bench.stats import summarize

SMALL = "small"
QUERY = "cstp.queryDecisions"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.workspaces", description=__doc__)
    p.add_argument("--big", type=int, default=99_000, help="decisions of workspace default")
    p.add_argument("--small", type=int, default=1_000, help="decisions of workspace small")
    p.add_argument("--calls", type=int, default=400, help="measured calls per token")
    p.add_argument("--warmup", type=int, default=50, help="warm-up calls per token")
    p.add_argument("--database-url", default=None, help="a Postgres server (default SQLite)")
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the texts")
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = p.parse_args(argv)
    if args.big < 0 or args.small < 1 or args.calls < 10:
        p.error("--big must not be negative, --small positive, --calls at least 10")
    return args


def journal(root: Path, count: int, gen: Generator) -> None:
    """``count`` decision files as ``cstp import`` reads them (docs/PROTOCOL.md)."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    for n in range(count):
        params = gen.record_params()
        when = start + timedelta(minutes=7 * n)
        data = {
            "id": f"{n:08x}",
            "decision": params["decision"],
            "category": params["category"],
            "confidence": params["confidence"],
            "stakes": params["stakes"],
            "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "context": params["context"],
            "reasons": params["reasons"],
            "tags": params["tags"],
            "project": params["project"],
            "recorded_by": "big-agent",
        }
        folder = root / f"{when.year:04d}" / f"{when.month:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"decision-{n:08x}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")


async def record(client: RpcClient, gen: Generator, count: int) -> set[str]:
    """Record ``count`` decisions, eight calls at a time; their ids."""
    ids: set[str] = set()
    sem = asyncio.Semaphore(8)

    async def one(params: dict[str, Any]) -> None:
        async with sem:
            outcome = await client.call("cstp.recordDecision", params)
        if not outcome.ok:
            raise BenchError(f"recordDecision failed: {outcome.error} {outcome.message}")
        ids.add(outcome.result["id"])

    await asyncio.gather(*(one(gen.record_params()) for _ in range(count)))
    return ids


async def measure(
    client: RpcClient, gen: Generator, calls: int, warmup: int, own: set[str] | None
) -> dict[str, Any]:
    """queryDecisions, one call at a time; with ``own``, every result must be one of them."""
    for _ in range(warmup):
        await client.call(QUERY, gen.query_params())
    times: list[float] = []
    foreign = 0
    for _ in range(calls):
        outcome = await client.call(QUERY, gen.query_params())
        if not outcome.ok:
            raise BenchError(f"queryDecisions failed: {outcome.error} {outcome.message}")
        times.append(outcome.latency_ms)
        if own is not None:
            foreign += sum(d["id"] not in own for d in outcome.result["decisions"])
    return {"latencyMs": summarize(times), "foreignResults": foreign}


async def bench(args: argparse.Namespace, prepared: Prepared) -> dict[str, Any]:
    gen = Generator(seed=args.seed)
    started = time.monotonic()
    if args.big:
        tree = prepared.tmp / "journal"
        journal(tree, args.big, gen)
        log(f"[seed] {args.big} files written in {time.monotonic() - started:.0f} s; importing")
        prepared.cstp("import", str(tree))
        log(f"[seed] imported into default in {time.monotonic() - started:.0f} s")
    made = json.loads(
        prepared.cstp("tokens", "create", "--agent", "small-agent", "--workspace", SMALL, "--json")
    )
    prepared.server.start()
    await prepared.server.wait_healthy(300)
    small = RpcClient(prepared.server.base_url, made["token"])
    big = RpcClient(prepared.server.base_url, prepared.token)
    try:
        own = await record(small, gen, args.small)
        log(f"[seed] {len(own)} decisions recorded in workspace {SMALL}")
        rows = {
            SMALL: await measure(
                small, Generator(seed=args.seed + 1), args.calls, args.warmup, own
            ),
            "default": await measure(
                big, Generator(seed=args.seed + 1), args.calls, args.warmup, None
            ),
        }
    finally:
        await small.close()
        await big.close()
    return {
        "big": args.big,
        "small": args.small,
        "database": prepared.database.split(":")[0],
        "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workspaces": rows,
        "serverProblems": prepared.server.log_problems(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out = args.out or REPO_ROOT / "bench" / "results" / f"workspaces-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    prepared = prepare_server("cstp-workspaces-", args.database_url, 64, {}, log)
    report = prepared.run(lambda ready: bench(args, ready), args.database_url, out, log)
    if report is None:
        return 2
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        f"{report['big']:,} decisions in default, {report['small']:,} in {SMALL}, "
        f"{report['database']}, queryDecisions, one client"
    )
    print("| workspace | p50 ms | p95 ms | p99 ms | results of another workspace |")
    print("|---|---|---|---|---|")
    for name, row in report["workspaces"].items():
        lat = row["latencyMs"]
        print(
            f"| {name} | {lat['p50']} | {lat['p95']} | {lat['p99']} | "
            f"{row['foreignResults'] if name == SMALL else '-'} |"
        )
    print(f"result: {out}", file=sys.stderr)
    failed = report["workspaces"][SMALL]["foreignResults"] or report["serverProblems"]
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
