"""Two servers side by side, measured call by call: the difference between two versions of the
code, or two settings of one, on a machine whose speed drifts.

``bench.run`` measures one server at a time, so a comparison of two runs carries whatever the
machine did between them (on a shared VM its speed can move 2x within half an hour, far more
than a millisecond's effect). Here both servers run at once, each on a fresh data directory
seeded with the same decisions, and every measured call is sent to both, one right after the
other (A then B, then B then A for the next, so neither always goes first). The figure that
counts is the median, with a bootstrap interval, of the differences B - A averaged over blocks
of two pairs (one A-first, one B-first): the machine's drift falls on both calls of a pair, and
what going second costs falls on both sides of a block, so both cancel.

    python -m bench.compare --size 1000 --calls 400 \\
        --a-source /tmp/wt_base --a-name base --b-name head
    python -m bench.compare --size 10000 \\
        --a-env CSTP_RETRIEVAL_MODE=semantic --b-env CSTP_RETRIEVAL_MODE=hybrid
    python -m bench.compare --b-token database   # a database token against a configured one

``--a-source``/``--b-source`` name a working tree (e.g. ``git worktree add``) whose ``app``
package that server runs (default: this one). One client, calls in sequence; the seeding and
the outbox settle as in ``bench.run`` (one batch at a time, so that both sides review the same
decisions). Exit status 1 when a call failed on either side or a server logged an error, 2
when the comparison could not be made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import RpcClient
from bench.run import Run, cap, log, params_for, seed
from bench.run import parse_args as run_args
from bench.seed import Generator
from bench.server import REPO_ROOT, BenchError, Prepared, is_working_tree, prepare_server
from bench.stats import summarize

METHODS = ("cstp.announceIntent", "cstp.queryDecisions", "cstp.checkGuardrails")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="Two CSTP servers measured call by call (docs/PERFORMANCE.md).",
    )
    p.add_argument("--size", type=int, default=1000, help="decisions seeded (default 1000)")
    p.add_argument(
        "--calls", type=int, default=400, help="measured pairs per method, even (default 400)"
    )
    p.add_argument("--warmup", type=int, default=30, help="warm-up calls per side and method")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated (default: announceIntent, queryDecisions, checkGuardrails; "
        "cstp.recordDecision may be added: it grows both corpora alike)",
    )
    for side in ("a", "b"):
        p.add_argument(f"--{side}-source", type=Path, default=REPO_ROOT, help="working tree")
        p.add_argument(f"--{side}-name", default=side.upper(), help="its name in the report")
        p.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="CSTP_X=V",
            help="a setting of that server (repeatable; OTEL_* variables too)",
        )
        p.add_argument(
            f"--{side}-token",
            choices=("config", "database"),
            default="config",
            help="the measured calls' token: CSTP_AUTH_TOKENS' (default), or one made with "
            "`cstp tokens create` for the same agent (the seeding uses the configured one)",
        )
    p.add_argument("--database-url", default=None, help="as bench.run: a Postgres server")
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the texts")
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = p.parse_args(argv)
    if args.size < 1 or args.calls < 10 or args.calls % 2 or args.warmup < 0:
        p.error("--size must be positive, --calls even and at least 10, --warmup not negative")
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    known = {*METHODS, "cstp.recordDecision"}
    if not args.method_list or not set(args.method_list) <= known:
        p.error(f"--methods takes some of {', '.join(sorted(known))}")
    for side in ("a", "b"):
        source: Path = getattr(args, f"{side}_source").resolve()
        if not is_working_tree(source):
            p.error(f"--{side}-source {source} is not a working tree of this project")
        setattr(args, f"{side}_source", source)
        pairs = getattr(args, f"{side}_env")
        # OTEL_*: the standard variables that turn tracing on (docs/OPERATIONS.md)
        if any("=" not in e or not e.startswith(("CSTP_", "OTEL_")) for e in pairs):
            p.error(f"--{side}-env takes CSTP_NAME=value or OTEL_NAME=value")
        setattr(args, f"{side}_settings", dict(e.split("=", 1) for e in pairs))
    return args


def commit_of(source: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(source), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


@dataclass
class Side:
    name: str
    prepared: Prepared
    run: Run
    client: RpcClient | None = None


def database_token(prepared: Prepared) -> str:
    """A token of the bench's agent made with ``cstp tokens create`` on the side's database."""
    made = prepared.cstp("tokens", "create", "--agent", "bench", "--json")
    return str(json.loads(made)["token"])


def blocks(diffs: list[float]) -> list[float]:
    """The differences of two consecutive pairs (one A-first, one B-first) averaged: what going
    second in a pair costs falls on both sides of a block and cancels within it."""
    return [(diffs[i] + diffs[i + 1]) / 2 for i in range(0, len(diffs) - 1, 2)]


def median_interval(diffs: list[float], rounds: int = 2000, seed: int = 7) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of ``diffs``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


async def measure(
    a: Side, b: Side, method: str, params: list[dict[str, Any]], warmup: list[dict[str, Any]]
) -> dict[str, Any]:
    """Each params to both sides in turn (A first on even calls, B first on odd ones)."""
    assert a.client is not None and b.client is not None
    for p in warmup:
        await a.client.call(method, p)
        await b.client.call(method, p)
    times: dict[str, list[float]] = {a.name: [], b.name: []}
    errors: dict[str, dict[str, int]] = {a.name: {}, b.name: {}}
    paired: list[float] = []
    kept = []  # block by block: both pairs of a block answered on both sides
    for i, p in enumerate(params):
        order = (a, b) if i % 2 == 0 else (b, a)
        took = {}
        for side in order:
            assert side.client is not None
            outcome = await side.client.call(method, p)
            if outcome.ok:
                took[side.name] = outcome.latency_ms
                times[side.name].append(outcome.latency_ms)
            else:
                key = str(outcome.error)
                errors[side.name][key] = errors[side.name].get(key, 0) + 1
        paired.append(took[b.name] - took[a.name] if len(took) == 2 else math.nan)
        if i % 2 == 1 and not math.isnan(paired[-1]) and not math.isnan(paired[-2]):
            kept.extend(paired[-2:])
    diffs = blocks(kept)
    if not diffs:
        raise BenchError(f"{method}: no pair of calls answered on both sides")
    low, high = median_interval(diffs)
    return {
        "method": method,
        "pairs": len(params),
        "blocks": len(diffs),
        "latencyMs": {name: summarize(values) for name, values in times.items()},
        "medianDiffMs": round(statistics.median(diffs), 3),
        "medianDiff95": [round(low, 3), round(high, 3)],
        "bSlowerShare": round(sum(d > 0 for d in kept) / len(kept), 3),
        "errors": errors,
    }


def render(report: dict[str, Any]) -> str:
    a, b = report["a"]["name"], report["b"]["name"]
    lines = [
        *(
            f"{report[k]['name']}: {report[k]['commit']} {report[k]['settings'] or ''}"
            f"{' (database token)' if report[k].get('token') == 'database' else ''}".rstrip()
            for k in ("a", "b")
        ),
        f"{report['size']:,} decisions, {report['database']}, one client, calls paired",
        "",
        f"| call | {a} p50 | {b} p50 | {b} - {a}, median [95%] | {b} slower in |",
        "|---|---|---|---|---|",
    ]
    for row in report["methods"]:
        lat = row["latencyMs"]
        low, high = row["medianDiff95"]
        lines.append(
            f"| {row['method']} | {lat[a]['p50']} | {lat[b]['p50']} | "
            f"{row['medianDiffMs']:+.3f} [{low:+.3f}, {high:+.3f}] | "
            f"{row['bSlowerShare']:.0%} |"
        )
    return "\n".join(lines)


async def compare(args: argparse.Namespace, a: Side, b: Side) -> dict[str, Any]:
    for side in (a, b):
        log(f"[{side.name}] starting on {side.prepared.server.base_url}")
        side.prepared.server.start()
    for side in (a, b):
        await side.prepared.server.wait_healthy(cap(side.run.args, 180))
    seeded = []
    for side in (a, b):  # the same decisions, in the same order, on each
        stats = await seed(side.run, Generator(seed=args.seed), args.size, args.size)
        log(f"[{side.name}] seeded {stats.recorded} decisions, {stats.reviewed} reviewed")
        seeded.append((stats.recorded, stats.reviewed))
    if seeded[0] != seeded[1]:
        raise BenchError(f"the two sides were not seeded alike: {seeded[0]} and {seeded[1]}")
    report: dict[str, Any] = {
        "size": args.size,
        "database": a.prepared.database.split(":")[0],
        "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "a": {
            "name": a.name,
            "commit": commit_of(args.a_source),
            "settings": args.a_settings,
            "token": args.a_token,
        },
        "b": {
            "name": b.name,
            "commit": commit_of(args.b_source),
            "settings": args.b_settings,
            "token": args.b_token,
        },
        "methods": [],
    }
    for side, letter in ((a, "a"), (b, "b")):
        token = side.prepared.token
        if getattr(args, f"{letter}_token") == "database":
            token = database_token(side.prepared)
            log(f"[{side.name}] measured calls use a database token")
        side.client = RpcClient(side.prepared.server.base_url, token)
    try:
        for n, method in enumerate(args.method_list):
            gen = Generator(seed=args.seed + 1000 + n)
            warmup = params_for(gen, method, args.warmup)
            params = params_for(gen, method, args.calls)
            log(f"[measure] {method}: {len(warmup)} warm-up + {len(params)} pairs")
            row = await measure(a, b, method, params, warmup)
            report["methods"].append(row)
            log(
                f"[measure] {method}: {b.name} - {a.name} median {row['medianDiffMs']:+.3f} ms "
                f"[{row['medianDiff95'][0]:+.3f}, {row['medianDiff95'][1]:+.3f}]"
            )
            for side in (a, b):
                if not side.prepared.server.running():
                    raise BenchError(
                        f"the server {side.name} died during {method}; its log ends with:\n"
                        f"{side.prepared.server.log_tail()}"
                    )
    finally:
        await a.client.close()
        await b.client.close()
    report["serverProblems"] = {s.name: s.prepared.server.log_problems() for s in (a, b)}
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # As bench.run: SIGTERM behaves like Ctrl-C, so the cleanup below runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = args.out or REPO_ROOT / "bench" / "results" / f"compare-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # One seeding batch at a time: the ids come back in the order sent, so the reviews (chosen
    # by position) fall on the same decisions on both sides.
    base = run_args(["--sizes", str(args.size), "--seed", str(args.seed), "--seed-inflight", "1"])
    sides = []
    try:
        for letter in ("a", "b"):
            prepared = prepare_server(
                f"cstp-compare-{letter}-",
                args.database_url,
                base.seed_batch,
                getattr(args, f"{letter}_settings"),
                log,
                getattr(args, f"{letter}_source"),
            )
            run = Run(base, prepared.token, prepared.server, prepared.database, out)
            sides.append(Side(getattr(args, f"{letter}_name"), prepared, run))
        report = asyncio.run(compare(args, sides[0], sides[1]))
    except BenchError as exc:
        log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        for side in sides:  # each side's cleanup whatever happened to the other's
            try:
                side.prepared.server.stop()
            finally:
                side.prepared.drop_database(args.database_url, log)
                side.prepared.finish(out.with_name(f"{out.stem}-{side.name}.json"), False, log)
    out.write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    print(render(report))
    log(f"[result] {out}")
    failed = sum(n for row in report["methods"] for e in row["errors"].values() for n in e.values())
    problems = sum(len(v) for v in report["serverProblems"].values())
    if failed or problems:
        log(f"[result] {failed} failed call(s), {problems} server log problem(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
