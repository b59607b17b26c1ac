"""Retrieval-quality benchmark: ``python -m bench.quality [--quick] [--modes ...] [...]``.

How often does search bring back the right past decision? Generates a labelled corpus
(bench/quality_corpus.py: decisions and queries together, relevance known by construction),
starts the real server (``cstp serve``) on a free 127.0.0.1 port with a fresh data directory
(or a fresh Postgres database with ``--database-url``), records the corpus through JSON-RPC
in two phases (so ``dateAfter`` filters have a known answer), reviews a share of it, then
runs every query through ``cstp.queryDecisions`` (``limit`` 10) for each retrieval mode.

A mode the server does not implement is reported as "not supported by this server", never
measured: the answer's ``retrievalMode`` must name the mode asked for.

Metrics (binary relevance), per mode, per query kind and per half (tuning / held-out):

- recall@5: relevant decisions in the top 5 / min(5, number of relevant decisions), so a
  perfect ranking scores 1 even when a query has more than 5 relevant decisions (the plain
  ratio, / number relevant, is in the JSON as ``recallAt5Raw``);
- MRR@10: 1 / rank of the first relevant decision in the top 10 (0 if none);
- nDCG@10: DCG of the top 10 / DCG of an ideal top 10;
- latency of queryDecisions as the client sees it (p50, p95).

Also, unless switched off: announceIntent's ``similarDecisions`` (top 5, category filter) for
the paraphrase queries, and the vector index's recall@10 against an exact brute-force cosine
top 10 computed here with the project's own embedder, over the queries without filters.

The table goes to stdout, progress to stderr, everything to
``bench/results/quality-<UTC timestamp>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.client import Outcome, RpcClient
from bench.quality_corpus import (
    KINDS,
    LATE,
    SPLITS,
    Corpus,
    LabelledQuery,
    generate,
    satisfies,
)
from bench.run import git_info, loadavg, log, settle
from bench.seed import Progress
from bench.server import REPO_ROOT, BenchError, ServerProcess, prepare_server
from bench.stats import summarize

LIMIT = 10  # queryDecisions limit
SIMILAR = 5  # announceIntent answers at most 5 similar decisions
UNFILTERED_KINDS = ("paraphrase", "exact_token", "short_keyword")
QUERY_METHOD = "cstp.queryDecisions"


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.quality",
        description="Retrieval-quality benchmark of the real CSTP server on 127.0.0.1.",
    )
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the corpus and queries")
    p.add_argument("--decisions", type=int, default=2000, help="corpus size (default 2000)")
    p.add_argument(
        "--queries",
        type=int,
        default=320,
        help="labelled queries (default 320: paraphrase, exact_token, short_keyword, filtered)",
    )
    p.add_argument(
        "--modes",
        default="semantic,keyword,hybrid",
        help="retrievalMode values to measure, comma-separated (default semantic,keyword,hybrid)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 300 decisions, 60 queries")
    p.add_argument(
        "--database-url",
        default=None,
        help="postgresql+asyncpg://user@127.0.0.1:5432/postgres - a fresh database "
        "cstp_bench_<random> is created on that server and dropped afterwards",
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON result file (default bench/results/quality-<timestamp>.json)",
    )
    p.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the temporary data directory (its path is printed)",
    )
    p.add_argument(
        "--vector-recall",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the vector index's recall@10 against exact brute-force "
        "cosine search (embeds the corpus here; default on)",
    )
    p.add_argument(
        "--vector-sample",
        type=int,
        default=0,
        help="queries used for --vector-recall (default 0: every query without filters)",
    )
    p.add_argument(
        "--announce",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure announceIntent's similarDecisions on the paraphrase queries",
    )
    p.add_argument(
        "--seed-batch",
        type=int,
        default=50,
        help="decisions per JSON-RPC batch while recording (default 50)",
    )
    p.add_argument(
        "--seed-inflight",
        type=int,
        default=4,
        help="recording batches in flight at once (default 4)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=10,
        help="unmeasured queries per mode before the measured ones (default 10)",
    )
    p.add_argument(
        "--show-failures",
        type=int,
        default=3,
        help="queries with no relevant decision in the top 10 printed per kind",
    )
    p.add_argument(
        "--request-timeout", type=float, default=30.0, help="per-request timeout in seconds"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.decisions, args.queries = 300, 60
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.mode_list or len(set(args.mode_list)) != len(args.mode_list):
        p.error("--modes must name distinct modes")
    if args.decisions < 200:
        p.error("--decisions must be at least 200")
    if args.queries < 4:
        p.error("--queries must be at least 4")
    if not 1 <= args.seed_batch <= 1000 or args.seed_inflight < 1:
        p.error("--seed-batch must be 1-1000 and --seed-inflight positive")
    return args


# ---------------------------------------------------------------- metrics


def score(
    ranked: Sequence[str], relevant: set[str], k_recall: int = 5, k: int = LIMIT
) -> dict[str, float]:
    """recall@k_recall (capped), raw recall, MRR@k and nDCG@k of one ranked list."""
    top = list(ranked)[:k]
    hits_recall = sum(1 for i in top[:k_recall] if i in relevant)
    rank = next((n for n, i in enumerate(top, 1) if i in relevant), None)
    dcg = sum(1.0 / math.log2(n + 1) for n, i in enumerate(top, 1) if i in relevant)
    ideal = sum(1.0 / math.log2(n + 1) for n in range(1, min(k, len(relevant)) + 1))
    return {
        "recall": hits_recall / min(k_recall, len(relevant)),
        "recallRaw": hits_recall / len(relevant),
        "mrr": 1.0 / rank if rank else 0.0,
        "ndcg": dcg / ideal if ideal else 0.0,
    }


METRIC_NAMES = {
    "recall": "recallAt5",
    "recallRaw": "recallAt5Raw",
    "mrr": "mrrAt10",
    "ndcg": "ndcgAt10",
}


def aggregate(rows: list[dict[str, Any]], names: dict[str, str] = METRIC_NAMES) -> dict[str, Any]:
    """Mean of each metric over ``rows`` (each a per-query ``scores`` dict)."""
    if not rows:
        return {"n": 0, **dict.fromkeys(names.values())}
    out: dict[str, Any] = {"n": len(rows)}
    for key, name in names.items():
        values = [r[key] for r in rows]
        mean = sum(values) / len(values)
        out[name] = round(mean, 4)
        # standard error of the mean: how far another draw of queries could move it
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0
        out[name + "Se"] = round(math.sqrt(var / len(values)), 4)
    return out


def breakdown(
    per_query: list[dict[str, Any]], score_key: str = "scores", names: dict[str, str] = METRIC_NAMES
) -> dict[str, Any]:
    """Aggregates by kind x split (``all``, ``tuning``, ``heldout``), over every kind
    (``ALL``) and by kind/subkind."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    subkinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for q in per_query:
        s = q.get(score_key)
        if s is None:
            continue
        for kind in (q["kind"], "ALL"):
            groups[(kind, "all")].append(s)
            groups[(kind, q["split"])].append(s)
        subkinds[f"{q['kind']}/{q['subkind']}"].append(s)
    kinds = [k for k in (*KINDS, "ALL") if groups.get((k, "all"))]
    return {
        "byKind": {
            k: {split: aggregate(groups[(k, split)], names) for split in ("all", *SPLITS)}
            for k in kinds
        },
        "bySubkind": {k: aggregate(v, names) for k, v in sorted(subkinds.items())},
    }


# ---------------------------------------------------------------- state of a run


@dataclass
class Run:
    args: argparse.Namespace
    corpus: Corpus
    token: str
    server: ServerProcess
    database: str
    out: Path
    tmp: Path
    report: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # decision key -> server id
    cutoff: str | None = None  # the dateAfter that means "late phase"

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=2) + "\n", "utf-8")
        tmp.replace(self.out)

    def client(self, *, timeout: float | None = None, connections: int = 1) -> RpcClient:
        return RpcClient(
            self.server.base_url,
            self.token,
            timeout=timeout or self.args.request_timeout,
            max_connections=connections,
        )


def _count(counter: dict[str, int], key: str | None) -> None:
    counter[str(key)] = counter.get(str(key), 0) + 1


# ---------------------------------------------------------------- recording


async def send_batches(
    client: RpcClient,
    method: str,
    items: list[dict[str, Any]],
    batch: int,
    inflight: int,
    label: str,
) -> list[Outcome]:
    """``items`` as JSON-RPC batches, ``inflight`` at once; outcomes in the order of items."""
    results: list[Outcome | None] = [None] * len(items)
    progress = Progress(label, len(items), log)
    sem = asyncio.Semaphore(inflight)
    done = errors = 0

    async def one(start: int) -> None:
        nonlocal done, errors
        chunk = items[start : start + batch]
        async with sem:
            outcomes = await client.batch(method, chunk)
        for i, outcome in enumerate(outcomes):
            results[start + i] = outcome
            errors += 0 if outcome.ok else 1
        done += len(chunk)
        progress.update(done, errors)

    await asyncio.gather(*(one(s) for s in range(0, len(items), batch)))
    progress.update(done, errors, final=True)
    return [r for r in results if r is not None]


def _parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def record_corpus(run: Run) -> dict[str, Any]:
    """Record the early phase, take the cutoff, record the late phase, review a share."""
    args, corpus = run.args, run.corpus
    stats: dict[str, Any] = {
        "requested": len(corpus.decisions),
        "recorded": 0,
        "reviewed": 0,
        "recordErrors": {},
        "reviewErrors": {},
        "notIndexedOnReturn": 0,
    }
    client = run.client(
        timeout=max(args.request_timeout, 3.0 * args.seed_batch), connections=args.seed_inflight
    )
    stamps: dict[str, list[datetime]] = {"early": [], "late": []}
    try:
        start = time.monotonic()
        for phase in ("early", "late"):
            if phase == "late":
                # the cutoff lies strictly between the phases' creation times
                await asyncio.sleep(1.0)
                run.cutoff = datetime.now(UTC).isoformat().replace("+00:00", "Z")
                await asyncio.sleep(1.0)
            todo = [d for d in corpus.decisions if d.phase == phase]
            outcomes = await send_batches(
                client,
                "cstp.recordDecision",
                [d.params for d in todo],
                args.seed_batch,
                args.seed_inflight,
                f"record {phase}",
            )
            for d, outcome in zip(todo, outcomes, strict=True):
                if outcome.ok:
                    run.ids[d.key] = outcome.result["id"]
                    stats["recorded"] += 1
                    if outcome.result.get("indexed") is False:
                        stats["notIndexedOnReturn"] += 1
                    if outcome.result.get("timestamp"):
                        stamps[phase].append(_parse_ts(outcome.result["timestamp"]))
                else:
                    _count(stats["recordErrors"], outcome.error)
        stats["recordSeconds"] = round(time.monotonic() - start, 2)
        stats["recordRatePerS"] = round(stats["recorded"] / max(stats["recordSeconds"], 1e-9), 1)
        if stats["recorded"] < 0.9 * len(corpus.decisions):
            raise BenchError(
                f"recording failed: {stats['recorded']} of "
                f"{len(corpus.decisions)} recorded; errors {stats['recordErrors']}"
            )
        cutoff = _parse_ts(run.cutoff or "")
        stats["dateAfterCutoff"] = run.cutoff
        stats["phasesSeparated"] = all(t < cutoff for t in stamps["early"]) and all(
            t >= cutoff for t in stamps["late"]
        )
        if not stats["phasesSeparated"]:
            log(
                "[record] WARNING: some creation times fall on the wrong side of the cutoff; "
                "dateAfter labels may be wrong"
            )

        reviews = [
            {"id": run.ids[d.key], **d.review}
            for d in corpus.decisions
            if d.review is not None and d.key in run.ids
        ]
        start = time.monotonic()
        outcomes = await send_batches(
            client, "cstp.reviewDecision", reviews, args.seed_batch, args.seed_inflight, "review"
        )
        for outcome in outcomes:
            if outcome.ok:
                stats["reviewed"] += 1
            else:
                _count(stats["reviewErrors"], outcome.error)
        stats["reviewSeconds"] = round(time.monotonic() - start, 2)
    finally:
        await client.close()
    target = SimpleNamespace(server=run.server, token=run.token)
    settle_s, outbox = await settle(target, 60 + 0.05 * len(corpus.decisions))  # type: ignore[arg-type]
    stats["outboxSettleSeconds"] = round(settle_s, 2)
    stats["outboxAfter"] = outbox
    client = run.client()
    try:
        total = await client.call("cstp.listDecisions", {"limit": 1})
        stats["serverTotal"] = total.result.get("total") if total.ok else None
    finally:
        await client.close()
    return stats


# ---------------------------------------------------------------- querying


def resolved_filters(run: Run, q: LabelledQuery) -> dict[str, Any] | None:
    if not q.filters:
        return None
    return {k: (run.cutoff if v == LATE else v) for k, v in q.filters.items()}


def query_params(run: Run, q: LabelledQuery, mode: str) -> dict[str, Any]:
    params: dict[str, Any] = {"query": q.text, "limit": LIMIT, "retrievalMode": mode}
    filters = resolved_filters(run, q)
    if filters:
        params["filters"] = filters
    return params


def relevant_ids(run: Run, q: LabelledQuery) -> set[str]:
    return {run.ids[k] for k in q.relevant if k in run.ids}


async def probe_mode(client: RpcClient, run: Run, mode: str) -> dict[str, Any]:
    """Does the server implement ``mode``? Only if it answers with that very retrievalMode."""
    q = run.corpus.queries[0]
    outcome = await client.call(QUERY_METHOD, query_params(run, q, mode))
    if not outcome.ok:
        return {"supported": False, "reason": f"rejected: {outcome.error} {outcome.message}"}
    answered = outcome.result.get("retrievalMode")
    if answered == mode:
        return {"supported": True, "answered": answered}
    if answered is None:
        return {
            "supported": False,
            "answered": None,
            "reason": "the answer carries no retrievalMode, so the mode cannot be confirmed",
        }
    return {
        "supported": False,
        "answered": answered,
        "reason": f"asked for {mode!r}, the server answered retrievalMode {answered!r} "
        "(accepted but ignored)",
    }


async def measure_mode(run: Run, mode: str) -> dict[str, Any]:
    args, corpus = run.args, run.corpus
    client = run.client()
    try:
        entry: dict[str, Any] = {"mode": mode, **await probe_mode(client, run, mode)}
        if not entry["supported"]:
            log(f"[{mode}] not supported by this server: {entry['reason']}")
            return entry
        for q in corpus.queries[: args.warmup]:
            await client.call(QUERY_METHOD, query_params(run, q, mode))
        per_query: list[dict[str, Any]] = []
        latencies: list[float] = []
        errors: dict[str, int] = {}
        other_modes: dict[str, int] = {}
        key_of = {sid: key for key, sid in run.ids.items()}
        by_key = corpus.by_key()
        progress = Progress(f"query {mode}", len(corpus.queries), log)
        for n, q in enumerate(corpus.queries, 1):
            relevant = relevant_ids(run, q)
            outcome = await client.call(QUERY_METHOD, query_params(run, q, mode))
            row: dict[str, Any] = {
                "id": q.id,
                "kind": q.kind,
                "subkind": q.subkind,
                "split": q.split,
                "text": q.text,
                "filters": resolved_filters(run, q),
                "relevant": sorted(relevant),
                "latencyMs": round(outcome.latency_ms, 3),
            }
            if not outcome.ok:
                _count(errors, outcome.error)
                row["error"] = f"{outcome.error} {outcome.message}"
            else:
                latencies.append(outcome.latency_ms)
                answered = outcome.result.get("retrievalMode")
                if answered != mode:
                    _count(other_modes, str(answered))
                found = outcome.result.get("decisions", [])
                row["returned"] = [d["id"] for d in found]
                row["distances"] = [d.get("distance") for d in found]
                row["titles"] = [d.get("title") for d in found[:3]]
                if q.filters:
                    # a check of the server's filters: what it returns must satisfy them
                    row["filterViolations"] = [
                        d["id"]
                        for d in found
                        if d["id"] not in key_of
                        or not satisfies(by_key[key_of[d["id"]]], q.filters)
                    ]
                if relevant:
                    row["scores"] = score(row["returned"], relevant)
                    row["relevantRanks"] = [
                        i + 1 for i, d in enumerate(row["returned"]) if d in relevant
                    ]
            per_query.append(row)
            progress.update(n, sum(errors.values()))
        progress.update(len(corpus.queries), sum(errors.values()), final=True)
        entry.update(
            {
                "latencyMs": summarize(latencies),
                "errors": errors,
                "answeredOtherModes": other_modes,
                "unscorable": sum(1 for r in per_query if "scores" not in r),
                "filterViolations": sum(len(r.get("filterViolations", [])) for r in per_query),
                **breakdown(per_query),
                "queries": per_query,
            }
        )
        return entry
    finally:
        await client.close()


async def measure_announce(run: Run) -> dict[str, Any]:
    """announceIntent's similarDecisions for the paraphrase queries, category-filtered."""
    client = run.client()
    names = {"recall": "recallAt5", "mrr": "mrrAt5", "ndcg": "ndcgAt5"}
    try:
        per_query: list[dict[str, Any]] = []
        latencies: list[float] = []
        errors: dict[str, int] = {}
        todo = [q for q in run.corpus.queries if q.kind == "paraphrase"]
        progress = Progress("announceIntent", len(todo), log)
        for n, q in enumerate(todo, 1):
            relevant = relevant_ids(run, q)
            outcome = await client.call(
                "cstp.announceIntent",
                {"intent": q.text, "category": q.category, "agent": {"id": "bench-quality"}},
            )
            row: dict[str, Any] = {
                "id": q.id,
                "kind": q.kind,
                "subkind": q.subkind,
                "split": q.split,
                "latencyMs": round(outcome.latency_ms, 3),
            }
            if outcome.ok:
                latencies.append(outcome.latency_ms)
                row["returned"] = [d["id"] for d in outcome.result.get("similarDecisions", [])]
                if relevant:
                    row["scores"] = score(row["returned"], relevant, SIMILAR, SIMILAR)
            else:
                _count(errors, outcome.error)
            per_query.append(row)
            progress.update(n, sum(errors.values()))
        progress.update(len(todo), sum(errors.values()), final=True)
        result = breakdown(per_query, names=names)
        return {
            "filter": "category of the target decision",
            "latencyMs": summarize(latencies),
            "errors": errors,
            "byKind": result["byKind"],
            "queries": per_query,
        }
    finally:
        await client.close()


# ---------------------------------------------------------------- vector index vs exact


def vector_recall(run: Run, semantic: dict[str, Any]) -> dict[str, Any]:
    """The server's semantic top 10 against an exact cosine top 10 computed here, for the
    queries without filters (both sides then rank the whole corpus)."""
    import numpy as np

    from app.records.entries import index_text
    from app.search.embedder import load_default_embedder

    args, corpus = run.args, run.corpus
    start = time.monotonic()
    embedder = load_default_embedder()
    recorded = [d for d in corpus.decisions if d.key in run.ids]
    texts = [
        index_text(
            SimpleNamespace(  # type: ignore[arg-type]  # duck-typed row
                decision=d.params["decision"].strip(),
                context=d.params.get("context"),
                reasons=[SimpleNamespace(text=r["text"]) for r in d.params.get("reasons", [])],
            )
        )
        for d in recorded
    ]
    progress = Progress("embed corpus", len(texts), log)
    vectors: list[list[float]] = []
    for i in range(0, len(texts), 64):
        vectors.extend(embedder.embed(texts[i : i + 64]))
        progress.update(len(vectors), 0)
    progress.update(len(vectors), 0, final=True)
    matrix = np.asarray(vectors, dtype=np.float32)
    ids = np.asarray([run.ids[d.key] for d in recorded])
    embed_s = time.monotonic() - start

    rows = {r["id"]: r for r in semantic["queries"] if "returned" in r}
    sample = [q for q in corpus.queries if q.kind in UNFILTERED_KINDS and q.id in rows]
    if args.vector_sample > 0:
        sample = sample[: args.vector_sample]
    qvecs = np.asarray(embedder.embed([q.text for q in sample]), dtype=np.float32)
    sims = qvecs @ matrix.T
    k = min(LIMIT, len(ids))
    recalls: list[float] = []
    tolerant: list[float] = []
    diffs: list[float] = []
    per_query: list[dict[str, Any]] = []
    exact_rows: list[dict[str, Any]] = []
    index_of = {sid: n for n, sid in enumerate(ids)}
    for q, sim in zip(sample, sims, strict=True):
        order = np.argsort(-sim, kind="stable")[:k]
        exact = [str(i) for i in ids[order]]
        server = rows[q.id]["returned"][:k]
        overlap = len(set(exact) & set(server)) / k
        # ties at the 10th place: a server id as near as the exact 10th counts as right
        kth = float(sim[order[-1]])
        near = sum(1 for sid in server if sid in index_of and sim[index_of[sid]] >= kth - 1e-6)
        recalls.append(overlap)
        tolerant.append(min(1.0, near / k))
        for sid, dist in zip(server, rows[q.id]["distances"], strict=False):
            if sid in index_of and dist is not None:
                diffs.append(abs((1.0 - float(sim[index_of[sid]])) - float(dist)))
        per_query.append(
            {
                "id": q.id,
                "kind": q.kind,
                "recallAt10": overlap,
                "missed": [i for i in exact if i not in server],
            }
        )
        relevant = relevant_ids(run, q)
        if relevant:
            exact_rows.append(
                {
                    "kind": q.kind,
                    "subkind": q.subkind,
                    "split": q.split,
                    "scores": score(exact, relevant),
                }
            )
    return {
        "queries": len(sample),
        "corpus": len(ids),
        "k": k,
        "recallAt10": {
            "mean": round(float(np.mean(recalls)), 4) if recalls else None,
            "min": round(float(np.min(recalls)), 4) if recalls else None,
            "perfectShare": round(sum(1 for r in recalls if r == 1.0) / max(1, len(recalls)), 4),
        },
        "recallAt10TieTolerant": round(float(np.mean(tolerant)), 4) if tolerant else None,
        "distanceDiff": {
            "mean": float(np.mean(diffs)) if diffs else None,
            "max": float(np.max(diffs)) if diffs else None,
        },
        "embedSeconds": round(embed_s, 2),
        "exactSearchQuality": breakdown(exact_rows)["byKind"],
        "perQuery": [r for r in per_query if r["recallAt10"] < 1.0],
    }


# ---------------------------------------------------------------- the whole run


async def bench(run: Run) -> None:
    args, report = run.args, run.report
    log(f"[server] starting on {run.server.base_url} ({run.database})")
    started = time.monotonic()
    report["server"] = {
        "health": await run.server.wait_healthy(180),
        "database": run.database,
        "startSeconds": round(time.monotonic() - started, 2),
    }
    report["record"] = await record_corpus(run)
    log(
        f"[record] {report['record']['recorded']} recorded, {report['record']['reviewed']} "
        f"reviewed; the server holds {report['record'].get('serverTotal')} decisions"
    )
    run.save()
    report["modes"] = []
    for mode in args.mode_list:
        t0 = time.monotonic()
        entry = await measure_mode(run, mode)
        entry["seconds"] = round(time.monotonic() - t0, 2)
        report["modes"].append(entry)
        run.save()
        if not run.server.running():
            raise BenchError(
                f"the server died during mode {mode}; its log ends with:\n{run.server.log_tail()}"
            )
    if args.announce:
        t0 = time.monotonic()
        report["announceIntent"] = await measure_announce(run)
        report["announceIntent"]["seconds"] = round(time.monotonic() - t0, 2)
        run.save()
    semantic = next(
        (m for m in report["modes"] if m["mode"] == "semantic" and m.get("supported")), None
    )
    if args.vector_recall:
        if semantic is None:
            report["vectorRecall"] = {"skipped": "needs the semantic mode's results"}
        else:
            # in this process, after every server call, so the server's timings are clean
            t0 = time.monotonic()
            report["vectorRecall"] = vector_recall(run, semantic)
            report["vectorRecall"]["seconds"] = round(time.monotonic() - t0, 2)
        run.save()


# ---------------------------------------------------------------- report


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _triple(agg: dict[str, Any], names: Sequence[str]) -> str:
    if not agg or not agg.get("n"):
        return f"{'-':>6}{'-':>7}{'-':>7}"
    return "".join(f"{_f(agg.get(n)):>{w}}" for n, w in zip(names, (6, 7, 7), strict=True))


def render_table(
    by_kind: dict[str, Any],
    names: Sequence[str],
    heads: str,
    by_subkind: dict[str, Any] | None = None,
) -> list[str]:
    lines = [f"{'kind':<30}{'n':>5} |{'all: ' + heads:>21} |{'tuning':>21} |{'held-out':>21}"]
    for kind, splits in by_kind.items():
        row = f"{kind:<30}{splits['all']['n']:>5} |"
        row += " |".join(f"{_triple(splits[s], names):>21}" for s in ("all", *SPLITS))
        lines.append(row)
    for sub, agg in (by_subkind or {}).items():
        lines.append(f"  {sub:<28}{agg['n']:>5} |{_triple(agg, names):>21} |")
    return lines


def render(report: dict[str, Any]) -> str:
    cfg, corpus = report.get("config", {}), report.get("corpus", {})
    lines = [
        "",
        f"== retrieval quality: {corpus.get('decisions')} decisions, "
        f"{corpus.get('queries')} queries (seed {cfg.get('seed')}, corpus "
        f"{corpus.get('fingerprint')}, {report.get('server', {}).get('database')}) ==",
    ]
    rec = report.get("record") or {}
    if rec:
        lines.append(
            f"recorded {rec.get('recorded')} in {rec.get('recordSeconds')} s "
            f"({rec.get('recordRatePerS')}/s), reviewed {rec.get('reviewed')}, errors "
            f"{rec.get('recordErrors') or rec.get('reviewErrors') or 'none'}; phases separated "
            f"at {rec.get('dateAfterCutoff')}: {rec.get('phasesSeparated')}"
        )
    heads = "R@5   MRR  nDCG"
    for m in report.get("modes", []):
        if not m.get("supported"):
            lines.append(f"mode {m['mode']}: not supported by this server ({m.get('reason')})")
            continue
        lat = m.get("latencyMs", {})
        lines.append("")
        lines.append(
            f"-- mode {m['mode']}: recall@5 / MRR@10 / nDCG@10; queryDecisions "
            f"latency p50 {_f(lat.get('p50'), 1)} ms, p95 {_f(lat.get('p95'), 1)} ms "
            f"(n={lat.get('n')}), errors {m.get('errors') or 'none'} --"
        )
        if m.get("filterViolations"):
            lines.append(
                f"   WARNING: {m['filterViolations']} returned decision(s) break the "
                "query's filters (see filterViolations in the JSON)"
            )
        if m.get("answeredOtherModes"):
            lines.append(f"   WARNING: some answers named another mode: {m['answeredOtherModes']}")
        lines.extend(
            render_table(
                m.get("byKind", {}), ("recallAt5", "mrrAt10", "ndcgAt10"), heads, m.get("bySubkind")
            )
        )
        ses = [
            agg.get("mrrAt10Se")
            for splits in m.get("byKind", {}).values()
            for agg in splits.values()
            if agg.get("mrrAt10Se") is not None
        ]
        if ses:
            lines.append(
                f"   (standard error of these means: {min(ses):.3f}-{max(ses):.3f} for "
                "MRR@10; each metric's is in the JSON as <metric>Se)"
            )
    ann = report.get("announceIntent")
    if ann:
        lat = ann.get("latencyMs", {})
        lines.append("")
        lines.append(
            f"-- announceIntent similarDecisions (paraphrase queries, filtered by the "
            f"target's category, top 5): recall@5 / MRR@5 / nDCG@5; latency p50 "
            f"{_f(lat.get('p50'), 1)} ms, p95 {_f(lat.get('p95'), 1)} ms --"
        )
        lines.extend(render_table(ann.get("byKind", {}), ("recallAt5", "mrrAt5", "ndcgAt5"), heads))
    vr = report.get("vectorRecall")
    if vr:
        lines.append("")
        if vr.get("skipped"):
            lines.append(f"-- vector index vs exact search: skipped ({vr['skipped']}) --")
        else:
            r10, dd = vr["recallAt10"], vr["distanceDiff"]
            lines.append(
                f"-- vector index vs exact brute-force cosine ({vr['queries']} queries without "
                f"filters, {vr['corpus']} decisions): recall@10 mean {_f(r10['mean'])}, min "
                f"{_f(r10['min'])}, {_f(100 * r10['perfectShare'], 1)}% of queries identical; "
                f"tie-tolerant {_f(vr['recallAt10TieTolerant'])}; |server distance - exact| "
                f"mean {_f(dd['mean'], 6)} max {_f(dd['max'], 6)} --"
            )
            lines.append(
                "   the same queries ranked by exact search (what a perfect index would score):"
            )
            lines.extend(
                "   " + line
                for line in render_table(
                    vr.get("exactSearchQuality", {}), ("recallAt5", "mrrAt10", "ndcgAt10"), heads
                )
            )
    show = report.get("config", {}).get("show_failures", 0)
    for m in report.get("modes", []):
        if not m.get("supported") or not show:
            continue
        misses = defaultdict(list)
        for q in m.get("queries", []):
            if q.get("scores") and q["scores"]["mrr"] == 0.0:
                misses[q["kind"]].append(q)
        if misses:
            lines.append("")
            lines.append(
                f"-- {m['mode']}: queries with no relevant decision in the top "
                f"{LIMIT} (first {show} per kind; all in the JSON) --"
            )
        for kind in KINDS:
            for q in misses.get(kind, [])[:show]:
                filt = f" filters={q['filters']}" if q.get("filters") else ""
                lines.append(
                    f"  [{kind}] {q['text']!r}{filt}: {len(q['relevant'])} relevant; "
                    f"top 3: {q.get('titles')}"
                )
            if misses.get(kind):
                lines.append(f"  [{kind}] {len(misses[kind])} such queries in all")
    if report.get("serverLogProblemCount"):
        lines.append(
            f"== the server logged {report['serverLogProblemCount']} error line(s); first ones: =="
        )
        lines.extend(f"  {p}" for p in report.get("serverLogProblems", [])[:5])
    if report.get("aborted"):
        lines.append(f"== ABORTED: {report['aborted']} ==")
    lines.append(f"wall time {_f(report.get('wallSeconds'), 1)} s")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wall = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else REPO_ROOT / "bench" / "results" / f"quality-{stamp}.json"
    t0 = time.monotonic()
    corpus = generate(args.seed, args.decisions, args.queries)
    gen_s = time.monotonic() - t0
    log(
        f"[corpus] {len(corpus.decisions)} decisions, {len(corpus.queries)} queries in "
        f"{gen_s:.2f} s (fingerprint {corpus.fingerprint()})"
    )
    prepared = prepare_server("cstp-quality-", args.database_url, args.seed_batch, log=log)
    server, database = prepared.server, prepared.database
    run = Run(args, corpus, prepared.token, server, database, out, prepared.tmp)
    run.report = {
        "benchmark": "retrieval-quality",
        "startedAt": datetime.now(UTC).isoformat(),
        "command": [
            sys.executable,
            "-m",
            "bench.quality",
            *(argv if argv is not None else sys.argv[1:]),
        ],
        "config": {k: v for k, v in vars(args).items() if k != "mode_list"},
        "metrics": {
            "recallAt5": "relevant in the top 5 / min(5, number relevant)",
            "recallAt5Raw": "relevant in the top 5 / number relevant",
            "mrrAt10": "1 / rank of the first relevant in the top 10, 0 if none",
            "ndcgAt10": "binary-relevance DCG@10 / ideal DCG@10",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadAvgStart": loadavg(),
        },
        "git": git_info(),
        "corpus": {**corpus.summary(), "generateSeconds": round(gen_s, 3)},
        "labelledQueries": [q.as_json() for q in corpus.queries],
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
        run.report["serverExitCode"] = server.stop()
        problems = server.log_problems()
        run.report["serverLogProblemCount"] = len(problems)
        run.report["serverLogProblems"] = problems[:20]
        prepared.drop_database(args.database_url, log)
        run.report["machine"]["loadAvgEnd"] = loadavg()
        run.report["finishedAt"] = datetime.now(UTC).isoformat()
        run.report["wallSeconds"] = round(time.monotonic() - wall, 1)
        run.save()
        prepared.finish(out, args.keep_data, log)
        print(render(run.report), flush=True)
        log(f"[done] results in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
