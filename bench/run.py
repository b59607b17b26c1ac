"""Benchmark the real CSTP server: ``python -m bench.run [--quick] [--sizes ...] [...]``.

Starts ``cstp serve`` on a free 127.0.0.1 port with a fresh data directory, seeds it through
the public API, measures announceIntent / recordDecision / queryDecisions / checkGuardrails
under 1 and 8 clients, measures the floor (one embedding + one vector top-5 query) in this
process, and prints a table (stdout) and writes a JSON file. See docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.client import RpcClient
from bench.floor import Deadline, FloorIndex, time_embedding
from bench.measure import MethodRun, measure_method
from bench.seed import Generator, Progress, SeedStats
from bench.server import REPO_ROOT, BenchError, ServerProcess, prepare_server

READ_METHODS = (
    "cstp.announceIntent",
    "cstp.queryDecisions",
    "cstp.checkGuardrails",
    # the learning loop (issue #40): the work list, drift, the session brief
    "cstp.ready",
    "cstp.checkDrift",
    "cstp.getSessionContext",
)
WRITE_METHOD = "cstp.recordDecision"
TABLE_ORDER = (
    "cstp.announceIntent",
    "cstp.recordDecision",
    "cstp.queryDecisions",
    "cstp.checkGuardrails",
    "cstp.ready",
    "cstp.checkDrift",
    "cstp.getSessionContext",
)


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark the real CSTP server on 127.0.0.1 (see docs/PERFORMANCE.md).",
    )
    p.add_argument(
        "--sizes",
        default="1000,10000",
        help="corpus sizes, comma-separated, ascending (default 1000,10000; add 100000 on request)",
    )
    p.add_argument(
        "--calls",
        type=int,
        default=200,
        help="measured calls per method per concurrency level (default 200)",
    )
    p.add_argument(
        "--concurrency", default="1,8", help="client counts to measure under (default 1,8)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up calls per method and concurrency (default max(5, calls/10), "
        "at least 2 per client)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke test: sizes 200, calls 30 (about 1-2 minutes)"
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="postgresql+asyncpg://user@127.0.0.1:5432/postgres - a fresh database "
        "cstp_bench_<random> is created on that server and dropped afterwards",
    )
    p.add_argument(
        "--out", default=None, help="JSON result file (default bench/results/<timestamp>.json)"
    )
    p.add_argument(
        "--seed-batch",
        type=int,
        default=50,
        help="decisions per JSON-RPC batch while seeding (default 50)",
    )
    p.add_argument(
        "--seed-inflight", type=int, default=4, help="seeding batches in flight at once (default 4)"
    )
    p.add_argument(
        "--review-fraction",
        type=float,
        default=0.3,
        help="share of seeded decisions reviewed, so outcomes exist (default 0.3)",
    )
    p.add_argument(
        "--floor-repeats",
        type=int,
        default=200,
        help="timed repetitions of the floor's embedding and vector query",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        help="per-request timeout in seconds (a timeout counts as an error)",
    )
    p.add_argument(
        "--cap-scale",
        type=float,
        default=1.0,
        help="multiply every phase's time cap (for slow machines)",
    )
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the generated texts")
    p.add_argument(
        "--retrieval-mode",
        choices=("hybrid", "semantic", "keyword"),
        default=None,
        help="the server's CSTP_RETRIEVAL_MODE: how announceIntent and queryDecisions search "
        "(default: the server's own default, hybrid)",
    )
    p.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the temporary data directory (its path is printed)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.calls = "200", 30
    try:
        args.size_list = [int(s) for s in str(args.sizes).split(",") if s.strip()]
        args.concurrency_list = [int(s) for s in str(args.concurrency).split(",") if s.strip()]
    except ValueError:
        p.error("--sizes and --concurrency take comma-separated whole numbers")
    if not args.size_list or args.size_list != sorted(set(args.size_list)) or args.size_list[0] < 1:
        p.error("--sizes must be positive and ascending")
    if not args.concurrency_list or min(args.concurrency_list) < 1:
        p.error("--concurrency must hold positive numbers")
    if args.calls < 1 or not 1 <= args.seed_batch <= 1000 or args.seed_inflight < 1:
        p.error("--calls, --seed-batch (1-1000) and --seed-inflight must be positive")
    if not 0.0 <= args.review_fraction <= 1.0:
        p.error("--review-fraction must be between 0 and 1")
    if args.warmup is None:
        args.warmup = max(5, args.calls // 10)
    return args


# ---------------------------------------------------------------- output helpers


#: Elsewhere than on a terminal (a log file, CI), an unfinished progress line is written at
#: most this often, so a long phase (seeding 100,000 decisions) still shows that it moves.
PROGRESS_EVERY_S = 30.0
_last_progress = [0.0]


def log(message: str, final: bool = True) -> None:
    """Progress goes to stderr; on a terminal an unfinished line is rewritten in place,
    elsewhere it is written as a line of its own every PROGRESS_EVERY_S seconds."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K" + message + ("\n" if final else ""))
    elif final:
        sys.stderr.write(message + "\n")
    elif time.monotonic() - _last_progress[0] >= PROGRESS_EVERY_S:
        _last_progress[0] = time.monotonic()
        sys.stderr.write(message + "\n")
    sys.stderr.flush()


def cap(args: argparse.Namespace, seconds: float) -> float:
    return seconds * args.cap_scale


def git_info() -> dict[str, Any]:
    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {}


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- state of a run


@dataclass
class Run:
    args: argparse.Namespace
    token: str
    server: ServerProcess
    database: str
    out: Path
    report: dict[str, Any] = field(default_factory=dict)
    tmp: Path = Path()
    docs: list[str] = field(default_factory=list)  # indexed text of every decision recorded
    printed: set[int] = field(default_factory=set)  # sizes whose table is already on stdout

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=2) + "\n", "utf-8")
        tmp.replace(self.out)


# ---------------------------------------------------------------- seeding


async def _in_batches(
    client: RpcClient,
    method: str,
    items: list[dict[str, Any]],
    batch: int,
    inflight: int,
    progress: Progress,
    on_done: Any,
) -> None:
    """Send ``items`` as JSON-RPC batches, ``inflight`` at a time, in order of completion."""
    sem = asyncio.Semaphore(inflight)
    done = errors = 0

    async def one(chunk: list[dict[str, Any]]) -> None:
        nonlocal done, errors
        async with sem:
            outcomes = await client.batch(method, chunk)
        for params, outcome in zip(chunk, outcomes, strict=True):
            on_done(params, outcome)
            done += 1
            errors += 0 if outcome.ok else 1
        progress.update(done, errors)

    await asyncio.gather(*(one(items[i : i + batch]) for i in range(0, len(items), batch)))
    progress.update(done, errors, final=True)


def _count(counter: dict[str, int], key: str | None) -> None:
    counter[str(key)] = counter.get(str(key), 0) + 1


async def seed(run: Run, gen: Generator, count: int, size: int) -> SeedStats:
    """Record ``count`` decisions, review a share of them, then wait for the outbox to drain."""
    args = run.args
    stats = SeedStats(requested=count)
    if count <= 0:
        return stats
    # A batch runs its items one after another on the server, so its timeout grows with it.
    client = RpcClient(
        run.server.base_url,
        run.token,
        timeout=max(args.request_timeout, 3.0 * args.seed_batch),
        max_connections=args.seed_inflight,
    )
    try:
        items = [gen.record_params() for _ in range(count)]
        ids: list[str] = []

        def recorded(params: dict[str, Any], outcome: Any) -> None:
            if outcome.ok:
                stats.recorded += 1
                run.docs.append(Generator.document_of(params))
                ids.append(outcome.result["id"])
                if outcome.result.get("indexed") is False:
                    stats.not_indexed += 1
            else:
                _count(stats.record_errors, outcome.error)

        start = time.monotonic()
        limit = cap(args, 300 + 0.2 * count)
        try:
            await asyncio.wait_for(
                _in_batches(
                    client,
                    WRITE_METHOD,
                    items,
                    args.seed_batch,
                    args.seed_inflight,
                    Progress(f"seed {size:,}: recordDecision", count, log),
                    recorded,
                ),
                limit,
            )
        except TimeoutError:
            raise BenchError(f"seeding took longer than its cap of {limit:.0f} s") from None
        stats.record_seconds = time.monotonic() - start
        if stats.recorded < count * 0.5:
            raise BenchError(
                f"seeding failed: only {stats.recorded} of {count} decisions were "
                f"recorded; errors {stats.record_errors}"
            )

        to_review = gen.rng.sample(ids, round(len(ids) * args.review_fraction))
        reviews = [gen.review_params(i) for i in to_review]

        def reviewed(_params: dict[str, Any], outcome: Any) -> None:
            if outcome.ok:
                stats.reviewed += 1
            else:
                _count(stats.review_errors, outcome.error)

        start = time.monotonic()
        limit = cap(args, 120 + 0.2 * len(reviews))
        try:
            await asyncio.wait_for(
                _in_batches(
                    client,
                    "cstp.reviewDecision",
                    reviews,
                    args.seed_batch,
                    args.seed_inflight,
                    Progress(f"seed {size:,}: reviewDecision", len(reviews), log),
                    reviewed,
                ),
                limit,
            )
        except TimeoutError:
            raise BenchError(f"reviewing took longer than its cap of {limit:.0f} s") from None
        stats.review_seconds = time.monotonic() - start
    finally:
        await client.close()
    stats.settle_seconds, stats.outbox_after = await settle(run, cap(args, 60 + 0.05 * count))
    return stats


async def settle(run: Run, limit: float) -> tuple[float, dict[str, Any]]:
    """Wait until the outbox has no pending events, so measurements do not pay for seeding."""
    start = time.monotonic()
    client = RpcClient(run.server.base_url, run.token, timeout=10.0)
    last: dict[str, Any] = {}
    try:
        while time.monotonic() - start < limit:
            try:
                response = await client.get("/ready")
                last = response.json().get("checks", {}).get("outbox") or {}
            except Exception as exc:  # keep polling; report what we saw
                last = {"error": type(exc).__name__}
            if isinstance(last, dict) and last.get("pending") == 0:
                return time.monotonic() - start, last
            log(f"[outbox] waiting for the outbox to drain: {last}", final=False)
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    log(f"[outbox] WARNING: still not drained after {limit:.0f} s: {last}; measuring anyway")
    return time.monotonic() - start, {**last, "drained": False}


async def decision_total(run: Run) -> int | None:
    client = RpcClient(run.server.base_url, run.token, timeout=30.0)
    try:
        outcome = await client.call("cstp.listDecisions", {"limit": 1})
    finally:
        await client.close()
    return int(outcome.result["total"]) if outcome.ok else None


# ---------------------------------------------------------------- floor


def measure_floor(run: Run, embedder: Any, index: FloorIndex, size: int) -> dict[str, Any]:
    """Top the floor collection up to the server's corpus, then time embedding and query.

    Runs synchronously in the main thread on purpose: nothing else runs meanwhile, and Ctrl-C
    then interrupts it at once.
    """
    args = run.args
    new_docs = run.docs[index.count :]
    progress = Progress(f"floor {size:,}: embed corpus", len(new_docs), log)
    deadline = Deadline("building the floor collection", cap(args, 120 + 0.1 * len(new_docs)))
    build_s = index.add(embedder, new_docs, deadline, lambda n: progress.update(n, 0))
    progress.update(len(new_docs), 0, final=True)
    sentences = Generator(args.seed + 7)
    intents = [sentences.intent_sentence() for _ in range(50)]
    embed = time_embedding(
        embedder, intents, args.floor_repeats, Deadline("timing the embedding", cap(args, 120))
    )
    query = index.time_query(
        embedder.embed(intents),
        args.floor_repeats,
        Deadline("timing the vector query", cap(args, 120)),
    )
    floor = (embed["p50"] or 0.0) + (query["p50"] or 0.0)
    return {
        "collectionSize": index.count,
        "buildSeconds": round(build_s, 2),
        "embeddingMs": embed,
        "vectorQueryMs": query,
        "floorMs": round(floor, 3),
    }


# ---------------------------------------------------------------- measuring one size


def params_for(gen: Generator, method: str, n: int) -> list[dict[str, Any]]:
    make = {
        "cstp.announceIntent": gen.intent_params,
        "cstp.recordDecision": gen.record_params,
        "cstp.queryDecisions": gen.query_params,
        "cstp.checkGuardrails": gen.guardrail_params,
        "cstp.ready": dict,
        "cstp.checkDrift": dict,
        "cstp.getSessionContext": lambda: {"task": gen.query_params()["query"]},
    }[method]
    return [make() for _ in range(n)]


async def measure_size(
    run: Run, gen: Generator, embedder: Any, index: FloorIndex, size: int
) -> dict[str, Any]:
    args = run.args
    entry: dict[str, Any] = {"size": size, "loadAvgStart": loadavg()}
    run.report["sizes"].append(entry)
    before = len(run.docs)
    entry["seed"] = (await seed(run, gen, size - before, size)).as_json()
    entry["decisionsAtStart"] = await decision_total(run)
    log(f"[size {size:,}] the server holds {entry['decisionsAtStart']} decisions")
    run.save()

    floor = measure_floor(run, embedder, index, size)
    entry["floor"] = floor
    log(
        f"[floor {size:,}] embedding p50 {floor['embeddingMs']['p50']} ms + vector top-5 p50 "
        f"{floor['vectorQueryMs']['p50']} ms = {floor['floorMs']} ms"
    )
    run.save()

    # Reads first (they see exactly ``size`` decisions), writes last (they grow the corpus).
    plan = [(m, c) for c in args.concurrency_list for m in READ_METHODS]
    plan += [(WRITE_METHOD, c) for c in args.concurrency_list]
    entry["methods"] = []
    for method, concurrency in plan:
        warmup = params_for(gen, method, max(args.warmup, 2 * concurrency))
        params = params_for(gen, method, args.calls)
        log(
            f"[measure {size:,}] {method} x{concurrency}: {len(warmup)} warm-up + "
            f"{len(params)} calls",
            final=False,
        )
        result: MethodRun = await measure_method(
            run.server.base_url,
            run.token,
            method,
            params,
            warmup,
            concurrency,
            cap(args, 60 + 1.0 * args.calls),
            args.request_timeout,
        )
        if method == WRITE_METHOD:
            for p, o in result.outcomes:
                if o.ok:
                    run.docs.append(Generator.document_of(p))
            run.docs.extend(Generator.document_of(p) for p, o in result.warmup if o.ok)
        row = result.as_json(floor["floorMs"])
        entry["methods"].append(row)
        log(
            f"[measure {size:,}] {method} x{concurrency}: p50 {row['latencyMs']['p50']} ms, "
            f"p99 {row['latencyMs']['p99']} ms, {row['throughputOkPerS']} ok/s, "
            f"{row['errorCount']} errors"
        )
        if not run.server.running():
            raise BenchError(
                f"the server died during {method}; its log ends with:\n{run.server.log_tail()}"
            )
    entry["loadAvgEnd"] = loadavg()
    run.save()
    return entry


async def bench(run: Run) -> None:
    args = run.args
    log(f"[server] starting on {run.server.base_url} ({run.database})")
    run.report["server"] = {
        "health": await run.server.wait_healthy(cap(args, 180)),
        "database": run.database,
    }
    from app.search.embedder import load_default_embedder

    start = time.monotonic()
    embedder = load_default_embedder()
    log(f"[floor] embedder loaded in {time.monotonic() - start:.2f} s")
    index = FloorIndex(run.tmp / "floor-chroma")
    gen = Generator(args.seed)
    for size in args.size_list:
        entry = await measure_size(run, gen, embedder, index, size)
        print(render_size(entry, run.database), flush=True)
        run.printed.add(size)


# ---------------------------------------------------------------- report


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_size(entry: dict[str, Any], database: str) -> str:
    floor = entry.get("floor") or {}
    lines = [
        "",
        f"== {entry['size']:,} decisions ({database}; server held "
        f"{entry.get('decisionsAtStart')} at start) ==",
        f"floor {_fmt(floor.get('floorMs'))} ms = embedding p50 "
        f"{_fmt((floor.get('embeddingMs') or {}).get('p50'))} ms + vector top-5 p50 "
        f"{_fmt((floor.get('vectorQueryMs') or {}).get('p50'))} ms "
        f"(collection of {floor.get('collectionSize')})",
        f"load average (1/5/15 min) at start {entry.get('loadAvgStart')}, at end "
        f"{entry.get('loadAvgEnd')} on {os.cpu_count()} CPUs",
        f"{'method':<22}{'clients':>8}{'calls':>7}{'ok':>6}{'errors':>7}{'p50 ms':>9}"
        f"{'p95 ms':>9}{'p99 ms':>9}{'ok/s':>9}{'p50/floor':>11}",
    ]
    rows = sorted(
        entry.get("methods", []), key=lambda r: (TABLE_ORDER.index(r["method"]), r["concurrency"])
    )
    notes = []
    for r in rows:
        lat = r["latencyMs"]
        lines.append(
            f"{r['method'].removeprefix('cstp.'):<22}{r['concurrency']:>8}{r['calls']:>7}"
            f"{r['ok']:>6}{r['errorCount']:>7}{_fmt(lat['p50']):>9}{_fmt(lat['p95']):>9}"
            f"{_fmt(lat['p99']):>9}{_fmt(r['throughputOkPerS'], 1):>9}"
            f"{_fmt(r['p50xFloor']) + 'x' if r['p50xFloor'] is not None else '-':>11}"
        )
        if r["errors"] or r["warmupErrors"]:
            notes.append(
                f"  errors {r['method']} x{r['concurrency']}: {r['errors']} "
                f"(warm-up: {r['warmupErrors']}) e.g. {r['errorSamples']}"
            )
        if r.get("notIndexedOnReturn"):
            notes.append(
                f"  {r['method']} x{r['concurrency']}: {r['notIndexedOnReturn']} "
                "returned indexed=false"
            )
    seed = entry.get("seed") or {}
    if seed.get("requested"):
        lines.append(
            f"seeding: {seed['recorded']} recorded in {seed['recordSeconds']} s "
            f"({seed['recordRatePerS']}/s, in batches), {seed['reviewed']} reviewed in "
            f"{seed['reviewSeconds']} s, outbox drained in {seed['outboxSettleSeconds']} s"
        )
        if seed["recordErrors"] or seed["reviewErrors"]:
            notes.append(
                f"  seeding errors: record {seed['recordErrors']}, review {seed['reviewErrors']}"
            )
    lines.extend(notes)
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    name: str
    method: str | None
    concurrency: int | None
    metric: str
    op: str
    limit: float
    size: int | None  # the corpus size the target is defined at; None = every measured size


TARGETS = (
    Target(
        "announceIntent p50 within 3x the floor, 1 client",
        "cstp.announceIntent",
        1,
        "p50xFloor",
        "<=",
        3.0,
        10_000,
    ),
    Target(
        "announceIntent p99 under 100 ms, 1 client",
        "cstp.announceIntent",
        1,
        "p99",
        "<",
        100.0,
        10_000,
    ),
    Target(
        "recordDecision >= 100 ok/s with 8 clients",
        "cstp.recordDecision",
        8,
        "throughputOkPerS",
        ">=",
        100.0,
        None,
    ),
    Target(
        "anchor: recordDecision p50 <= 20 ms, 1 client",
        "cstp.recordDecision",
        1,
        "p50",
        "<=",
        20.0,
        1_000,
    ),
    Target(
        "anchor: queryDecisions p50 <= 12 ms, 1 client",
        "cstp.queryDecisions",
        1,
        "p50",
        "<=",
        12.0,
        1_000,
    ),
    Target(
        "anchor: checkGuardrails p50 <= 3 ms, 1 client",
        "cstp.checkGuardrails",
        1,
        "p50",
        "<=",
        3.0,
        1_000,
    ),
    Target(
        "anchor: announceIntent p50 <= 20 ms, 1 client",
        "cstp.announceIntent",
        1,
        "p50",
        "<=",
        20.0,
        1_000,
    ),
    Target(
        "anchor: announceIntent p99 <= 50 ms, 1 client",
        "cstp.announceIntent",
        1,
        "p99",
        "<=",
        50.0,
        1_000,
    ),
    Target(
        "at scale: announceIntent p99 <= 50 ms, 1 client",
        "cstp.announceIntent",
        1,
        "p99",
        "<=",
        50.0,
        100_000,
    ),
    Target(
        "at scale: announceIntent p99 <= 150 ms, 8 clients",
        "cstp.announceIntent",
        8,
        "p99",
        "<=",
        150.0,
        100_000,
    ),
    Target("no errors in any measured call", None, None, "errorCount", "<=", 0, None),
)


def _metric(row: dict[str, Any], metric: str) -> float | None:
    if metric in ("p50", "p95", "p99"):
        return row["latencyMs"][metric]
    return row.get(metric)


def _passes(value: float, op: str, limit: float) -> bool:
    return {"<=": value <= limit, "<": value < limit, ">=": value >= limit}[op]


def evaluate_targets(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    measured = [s for s in sizes if s.get("methods")]
    results = []
    for t in TARGETS:
        if not measured:
            break
        if t.size is None:
            chosen = measured
        else:
            chosen = [min(measured, key=lambda s: abs(math.log(s["size"] / t.size)))]
        values = []
        for s in chosen:
            for row in s["methods"]:
                if (t.method is None or row["method"] == t.method) and (
                    t.concurrency is None or row["concurrency"] == t.concurrency
                ):
                    value = _metric(row, t.metric)
                    if value is not None:
                        values.append((value, s["size"], row))
        if not values:
            results.append({"target": t.name, "status": "not measured"})
            continue
        worst = max(values, key=lambda v: v[0]) if t.op != ">=" else min(values, key=lambda v: v[0])
        at = sorted({v[1] for v in values})
        results.append(
            {
                "target": t.name,
                "value": worst[0],
                "op": t.op,
                "limit": t.limit,
                "status": "pass" if _passes(worst[0], t.op, t.limit) else "FAIL",
                "measuredAt": at,
                "definedAt": t.size,
                "approximate": t.size is not None and at != [t.size],
            }
        )
    return results


GROWTH_METRICS = ("p50", "p95", "p99")


def evaluate_growth(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """p50, p95 and p99 ratios between consecutive sizes against the log-N ratio
    ln(b)/ln(a): the tail must not grow faster with the corpus than the median may."""
    measured = [s for s in sizes if s.get("methods") and s["size"] > 1]
    out = []
    for a, b in itertools.pairwise(measured):
        allowed = math.log(b["size"]) / math.log(a["size"])
        rows_a = {(r["method"], r["concurrency"]): r for r in a["methods"]}
        # The same ratio in multiples of each size's floor: it cancels most of the effect
        # of a machine that got busier (or quieter) between the two sizes.
        f_a, f_b = (a.get("floor") or {}).get("floorMs"), (b.get("floor") or {}).get("floorMs")
        for r in b["methods"]:
            ra = rows_a.get((r["method"], r["concurrency"]))
            for metric in GROWTH_METRICS:
                v_a = ra["latencyMs"][metric] if ra else None
                v_b = r["latencyMs"][metric]
                if not v_a or v_b is None:
                    continue
                ratio = v_b / v_a
                normalized = round(ratio * f_a / f_b, 3) if f_a and f_b else None
                out.append(
                    {
                        "method": r["method"],
                        "concurrency": r["concurrency"],
                        "metric": metric,
                        "from": a["size"],
                        "to": b["size"],
                        "valueFrom": v_a,
                        "valueTo": v_b,
                        "ratio": round(ratio, 3),
                        "ratioInFloors": normalized,
                        "logNRatio": round(allowed, 3),
                        "status": "pass" if ratio <= allowed else "FAIL",
                    }
                )
    return out


def render_summary(report: dict[str, Any]) -> str:
    lines = ["", "== targets =="]
    for t in report.get("targets", []):
        if t["status"] == "not measured":
            lines.append(f"  [not measured] {t['target']}")
            continue
        where = ", ".join(f"{s:,}" for s in t["measuredAt"])
        note = (
            f" (defined at {t['definedAt']:,}; measured at {where})"
            if t["approximate"]
            else f" (at {where})"
        )
        lines.append(
            f"  [{t['status']}] {t['target']}: {_fmt(t['value'])} {t['op']} "
            f"{_fmt(t['limit'])}{note}"
        )
    growth = report.get("growth", [])
    if growth:
        lines.append("== growth of p50, p95 and p99 between sizes (allowed: ln(b)/ln(a)) ==")
        for g in growth:
            lines.append(
                f"  [{g['status']}] {g['method'].removeprefix('cstp.')} x{g['concurrency']} "
                f"{g['metric']}: {g['from']:,} -> {g['to']:,}: "
                f"{_fmt(g['valueFrom'])} -> {_fmt(g['valueTo'])} ms, "
                f"ratio {_fmt(g['ratio'])} (allowed {_fmt(g['logNRatio'])}; "
                f"in multiples of the floor {_fmt(g['ratioInFloors'])})"
            )
    problems = report.get("serverLogProblems", [])
    if problems:
        lines.append(
            f"== the server logged {report.get('serverLogProblemCount')} error line(s); "
            "first ones: =="
        )
        lines.extend(f"  {p}" for p in problems[:5])
    if report.get("aborted"):
        lines.append(f"== ABORTED: {report['aborted']} ==")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM behaves like Ctrl-C, so the same cleanup runs (server stopped, database dropped);
    # SIGINT is set explicitly because a shell starts background jobs with it ignored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else REPO_ROOT / "bench" / "results" / f"{stamp}.json"
    prepared = prepare_server(
        "cstp-bench-",
        args.database_url,
        args.seed_batch,
        {"CSTP_RETRIEVAL_MODE": args.retrieval_mode} if args.retrieval_mode else None,
        log,
    )
    server, database = prepared.server, prepared.database
    run = Run(args, prepared.token, server, database, out, tmp=prepared.tmp)
    run.report = {
        "startedAt": datetime.now(UTC).isoformat(),
        "command": [
            sys.executable,
            "-m",
            "bench.run",
            *(argv if argv is not None else sys.argv[1:]),
        ],
        "config": {k: v for k, v in vars(args).items() if not k.endswith("_list")},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadAvg": loadavg(),
        },
        "git": git_info(),
        "sizes": [],
        "aborted": None,
    }
    code = 0
    try:
        server.start()
        asyncio.run(bench(run))
    except KeyboardInterrupt:
        run.report["aborted"] = "interrupted"
        code = 130
    except BenchError as exc:
        run.report["aborted"] = str(exc).splitlines()[0]
        log(f"[error] {exc}")
        code = 1
    finally:
        returncode = server.stop()
        run.report["serverExitCode"] = returncode
        run.report["serverStop"] = {
            "seconds": server.stop_seconds,
            "neededSigkill": server.needed_sigkill,
        }
        problems = server.log_problems()
        run.report["serverLogProblemCount"] = len(problems)
        run.report["serverLogProblems"] = problems[:20]
        prepared.drop_database(args.database_url, log)
        run.report["targets"] = evaluate_targets(run.report["sizes"])
        run.report["growth"] = evaluate_growth(run.report["sizes"])
        run.report["finishedAt"] = datetime.now(UTC).isoformat()
        run.save()
        prepared.finish(out, args.keep_data, log)
        if run.report["aborted"]:
            for entry in run.report["sizes"]:
                if entry.get("methods") and entry["size"] not in run.printed:
                    print(render_size(entry, database))
        print(render_summary(run.report), flush=True)
        log(f"[done] results in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
