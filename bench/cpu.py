"""Where a method's CPU goes under load: ``python -m bench.cpu [--method announceIntent]
[--corpus 1000] [--clients 8] [...]``.

A focused probe, not the benchmark: it starts the real server (``cstp serve``) on a free
127.0.0.1 port with an empty, fresh data directory (SQLite, or with ``--database-url`` a fresh
Postgres database that is dropped afterwards; with ``--from-data`` a copy of the one a
SQLite run of ``bench.run --keep-data`` kept; with ``--source`` from another working tree),
records ``--corpus`` decisions first (none by default), sends warm-up calls and then
``--calls`` calls of ``--method`` (recordDecision by default) from ``--clients`` concurrent
clients (the harness's own client and generator), and reports:

- for the measured calls: ok/s, errors by kind, latency p50/p99;
- over the warm-up and the measured calls together: the server's CPU time per call (all its
  threads alive at the end, from ``/proc``) and the harness's own;
- how much of the machine stayed idle (``/proc/stat``);
- how busy each of the server's threads was (share of one core), the event loop's thread
  (the process's main thread) named as such;
- with Postgres, the CPU of the Postgres server's processes too (all of them, from ``/proc``;
  the probe's window is the only load on a test machine's Postgres).

Linux only (it reads ``/proc``). See docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.measure import measure_method
from bench.seed import Generator
from bench.server import (
    REPO_ROOT,
    BenchError,
    ServerProcess,
    check_database_url,
    create_database,
    drop_database,
    free_port,
    is_working_tree,
    server_env,
    with_database,
)
from bench.stats import summarize

METHODS = ("recordDecision", "announceIntent", "queryDecisions", "checkGuardrails")
START_CAP_S = 180.0


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) of each thread of ``pid``, keyed by (tid, name)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[tuple[int, str], float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended between the listing and the read
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        found[(int(tid), name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return found


def postgres_cpu() -> float:
    """CPU seconds of every process named ``postgres`` (the server and its backends)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # the process ended between the listing and the read
        if raw[raw.index("(") + 1 : raw.rindex(")")] != "postgres":
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def machine_ticks() -> list[int]:
    """The aggregate ``cpu`` line of /proc/stat: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__.splitlines()[0])
    p.add_argument(
        "--method", choices=METHODS, default="recordDecision", help="(default recordDecision)"
    )
    p.add_argument(
        "--corpus", type=int, default=0, help="decisions recorded before the probe (default 0)"
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--calls", type=int, default=400, help="measured calls (default 400)")
    p.add_argument("--warmup", type=int, default=40, help="warm-up calls (default 40)")
    p.add_argument("--seed", type=int, default=42, help="generator seed (default 42)")
    p.add_argument(
        "--database-url",
        default=None,
        help="postgresql+asyncpg://user@127.0.0.1:5432/postgres - a fresh database "
        "cstp_bench_<random> is created on that server and dropped afterwards",
    )
    p.add_argument(
        "--from-data",
        type=Path,
        default=None,
        help="start from a copy of a directory kept by 'bench.run --keep-data' (SQLite: its "
        "data/ and decisions/), e.g. to probe at 100,000 decisions without seeding them",
    )
    p.add_argument(
        "--source",
        type=Path,
        default=REPO_ROOT,
        help="the working tree whose app the server runs (default: this one), e.g. a "
        "'git worktree add' of another commit",
    )
    args = p.parse_args(argv)
    if args.from_data is not None:
        if args.database_url:
            p.error("--from-data copies a SQLite data directory: not with --database-url")
        if not (args.from_data / "data" / "cstp.db").is_file():
            p.error(f"--from-data: {args.from_data} holds no SQLite database (data/cstp.db)")
    if not is_working_tree(args.source):
        p.error(f"--source: {args.source} is not a working tree of this project")
    if args.clients < 1 or args.calls < 1 or args.warmup < 0 or args.corpus < 0:
        p.error("--clients and --calls must be at least 1, --warmup and --corpus at least 0")
    if args.database_url:
        try:
            check_database_url(args.database_url)
        except BenchError as exc:
            p.error(str(exc))
    return args


async def probe(args: argparse.Namespace, server: ServerProcess, token: str) -> tuple[str, bool]:
    await server.wait_healthy(START_CAP_S)
    assert server.proc is not None
    pid = server.proc.pid
    generator = Generator(seed=args.seed)
    if args.corpus:
        corpus = [generator.record_params() for _ in range(args.corpus)]
        seeded = await measure_method(
            server.base_url, token, "cstp.recordDecision", corpus, [], 8, 60 + args.corpus, 30
        )
        if seeded.ok_count() != args.corpus:
            raise BenchError(f"seeding the corpus failed: {seeded.errors()}")
    method = f"cstp.{args.method}"
    make = {
        "recordDecision": generator.record_params,
        "announceIntent": generator.intent_params,
        "queryDecisions": generator.query_params,
        "checkGuardrails": generator.guardrail_params,
    }[args.method]
    warmup = [make() for _ in range(max(args.warmup, 2 * args.clients))]
    calls = [make() for _ in range(args.calls)]
    threads_before, ticks_before, pg_before = thread_cpu(pid), machine_ticks(), postgres_cpu()
    own_before, wall_before = time.process_time(), time.perf_counter()
    run = await measure_method(
        server.base_url,
        token,
        method,
        calls,
        warmup,
        args.clients,
        cap_s=60 + args.calls,
        request_timeout=30,
    )
    # the warm-up is inside this window too: the figures below are per call of both
    wall = time.perf_counter() - wall_before
    own = time.process_time() - own_before
    threads_after, ticks_after, pg_after = thread_cpu(pid), machine_ticks(), postgres_cpu()
    ticks = [after - before for before, after in zip(ticks_before, ticks_after, strict=True)]
    per_thread: Counter[str] = Counter()
    for (tid, name), seconds in threads_after.items():
        label = "event loop (main thread)" if tid == pid else f"{name} [{tid}]"
        per_thread[label] += seconds - threads_before.get((tid, name), 0.0)
    server_cpu = sum(per_thread.values())
    n_all = len(run.warmup) + len(run.outcomes)
    ok = run.ok_count()
    latency = summarize([o.latency_ms for _, o in run.outcomes if o.ok])
    lines = [
        f"{method} x{args.clients}: {ok}/{args.calls} ok, errors {run.errors() or 'none'}, "
        f"{ok / run.elapsed_s:.1f} ok/s, p50 {latency['p50']} ms, p99 {latency['p99']} ms",
        f"window {wall:.1f} s ({n_all} calls, warm-up included): server CPU "
        f"{server_cpu / n_all * 1000:.1f} ms per call ({server_cpu / wall:.2f} cores), "
        f"harness {own / n_all * 1000:.1f} ms per call ({own / wall:.2f} cores), "
        f"machine idle {ticks[3] / max(sum(ticks), 1) * 100:.0f}% of {os.cpu_count()} CPUs",
    ]
    if args.database_url:
        lines.append(
            f"postgres processes {(pg_after - pg_before) / n_all * 1000:.1f} ms per call "
            f"({(pg_after - pg_before) / wall:.2f} cores)"
        )
    lines.append("server threads (share of one core):")
    lines += [
        f"  {share / wall:5.2f}  {label}"
        for label, share in per_thread.most_common()
        if share / wall >= 0.01
    ]
    return "\n".join(lines), ok == args.calls


def main(argv: list[str] | None = None) -> int:
    if not Path("/proc/self/task").is_dir():
        print("bench.cpu reads /proc and runs on Linux only", file=sys.stderr)
        return 2
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cstp-cpu-"))
    token = secrets.token_urlsafe(24)
    port = free_port()
    pg_name: str | None = None
    server: ServerProcess | None = None
    try:
        if args.from_data is not None:
            print(f"[copy] {args.from_data} ...", file=sys.stderr, flush=True)
            for part in ("data", "decisions"):
                if (args.from_data / part).is_dir():
                    shutil.copytree(args.from_data / part, tmp / part)
        database_url: str | None = None
        if args.database_url:
            pg_name = asyncio.run(create_database(args.database_url))
            database_url = with_database(args.database_url, pg_name)
        server = ServerProcess(
            server_env(
                os.environ,
                data_dir=tmp / "data",
                decisions_dir=tmp / "decisions",
                token=token,
                port=port,
                database_url=database_url,
                max_batch=50,
            ),
            port,
            tmp / "server.log",
            args.source.resolve(),
        )
        server.start()
        report, all_ok = asyncio.run(probe(args, server, token))
        print(report, flush=True)
        problems = server.log_problems()
        if problems:
            print(f"the server logged {len(problems)} error line(s), e.g. {problems[0]}")
        return 0 if all_ok and not problems else 1
    except (BenchError, OSError) as exc:  # OSError: Postgres refused the connection
        print(f"[error] {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if pg_name and args.database_url:
            try:
                asyncio.run(drop_database(args.database_url, pg_name))
            except Exception as exc:  # tell the operator, do not hide it
                print(f"[postgres] could not drop {pg_name}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
