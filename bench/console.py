"""The web console's pages at a realistic size: how long each takes to answer (issue #41's
criterion, each page in <= 100 ms server time at 10,000 decisions).

    python -m bench.console --decisions 10000 --calls 100

The decisions are loaded with ``cstp import`` from generated YAML files before the server
starts (the import embeds in batches; the embedded vector index serves one process). They
were made over the last twelve months by three agents, the signed-in one (``lead``) half of
them; about two in three of those older than two weeks carry a review (``outcome`` and
``reviewed_at`` in the file, an outcome likelier the higher the confidence), so the
calibration page has a Brier score for every month, and a share of the others carry a
``review_by`` now past, so the ready page has a work list. With the server up, a few dozen
intents are announced through the API (guardrail evaluations and the audit page's intents),
a few of them under an escalate rule of the run's own ``CSTP_GUARDRAILS_DIR``: pending
approvals, two of them then decided.

A token with every console scope (``--scopes read,review:any,approve,audit``) signs in as
a browser does: GET /console/login (a ``cstp_login`` cookie and the form's hidden ``csrf``),
POST the token with it, and the session cookie is kept. Then each page is requested one at a
time, after a warm-up, by one client over one keep-alive connection; any answer other than
200, or a page without the rows the data should show, stops the run.

The figures are client-observed over loopback: request sent to the whole body read, with the
client's own HTTP and the loopback in them. They are an upper bound of the server's time; the
server reports no timing of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.client import RpcClient, require_loopback
from bench.run import git_info, loadavg, log
from bench.seed import OUTCOMES, Generator
from bench.server import REPO_ROOT, BenchError, Prepared, prepare_server
from bench.stats import summarize

LEAD = "lead"  # the agent of the console's token, who also recorded half the decisions
AGENTS = (LEAD, "deployer", "planner")
AGENT_WEIGHTS = (0.5, 0.25, 0.25)
DAYS = 365  # decisions are spread over this many days back from now
REVIEWED_AFTER = timedelta(days=14)  # younger decisions are seldom reviewed yet
REVIEW_SHARE = (0.2, 0.65)  # share reviewed: younger than REVIEWED_AFTER, older
REVIEW_IN_DAYS = (3, 7, 14, 30, 90)
INTENTS = 40  # ordinary announcements (evaluations, the audit page's intents)
ESCALATIONS = 6  # announcements an escalate rule sends to a person; pending approvals
DECIDED = 2  # of those, approved through the API, so the page shows settled ones too
SEARCH_WORDS = ("billing", "cache", "rollback", "Kafka", "latency", "credentials")
CATEGORY = "security"
DETAIL_IDS = 10  # the decision page is asked for these many decisions in turn
MONTHS_WITH_DATA = 10  # of the calibration page's twelve months, at least this many scored
RULES = """
guardrails:
  - id: bench-needs-approval
    description: A change marked for approval needs a person's approval
    action: escalate
    timeout: 2h
    conditions:
      - {field: needs_approval, operator: "==", value: true}
    message: This change needs a person's approval
"""
CSRF_INPUT = re.compile(r'name="csrf" value="([^"]+)"')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    p.add_argument("--decisions", type=int, default=10_000, help="decisions imported")
    p.add_argument("--calls", type=int, default=100, help="measured requests per page")
    p.add_argument("--warmup", type=int, default=10, help="warm-up requests per page")
    p.add_argument("--database-url", default=None, help="a Postgres server (default SQLite)")
    p.add_argument("--seed", type=int, default=42, help="RNG seed of the texts")
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    args = p.parse_args(argv)
    if args.decisions < 100 or args.calls < 10 or args.warmup < 1:
        p.error("--decisions must be at least 100, --calls at least 10, --warmup at least 1")
    return args


@dataclass(frozen=True)
class Written:
    """One generated decision file, as the run needs to know it."""

    id: str
    agent: str
    created: datetime
    reviewed: bool
    review_by: datetime | None


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def journal(root: Path, count: int, gen: Generator, now: datetime) -> list[Written]:
    """``count`` decision files as ``cstp import`` reads them (docs/PROTOCOL.md, "Decision
    files"), made over the ``DAYS`` before ``now``. The texts come from ``gen``; dates, agents
    and outcomes from an RNG of its seed, so a seed gives the same journal relative to ``now``."""
    rng = random.Random(gen.seed + 1)
    written: list[Written] = []
    for n in range(count):
        params = gen.record_params()
        review = gen.review_params(f"{n:08x}")
        created = now - timedelta(seconds=rng.uniform(0, DAYS * 86_400))
        data: dict[str, Any] = {
            "id": f"{n:08x}",
            "decision": params["decision"],
            "category": params["category"],
            "confidence": params["confidence"],
            "stakes": params["stakes"],
            "date": _iso(created),
            "context": params["context"],
            "reasons": params["reasons"],
            "tags": params["tags"],
            "mental_state": params["mentalState"],
            "project": params["project"],
            "feature": params["feature"],
            "recorded_by": rng.choices(AGENTS, AGENT_WEIGHTS)[0],
        }
        if "kpiIndicators" in params:
            data["kpi_indicators"] = params["kpiIndicators"]
        if "pr" in params:
            data["pr"] = params["pr"]
        review_by = None
        if rng.random() < 0.6:
            review_by = created + timedelta(days=rng.choice(REVIEW_IN_DAYS))
            data["review_by"] = _iso(review_by)
        age = now - created
        reviewed = rng.random() < REVIEW_SHARE[age > REVIEWED_AFTER]
        if reviewed:
            # a success as likely as the confidence says, else one of the other outcomes
            if rng.random() < params["confidence"]:
                outcome = "success"
            else:
                outcome = rng.choices(OUTCOMES[1:], (0.4, 0.45, 0.15))[0]
            # within two months of the decision, and never after now
            delay = min(age, timedelta(days=60)) * rng.uniform(0.05, 1.0)
            data.update(
                {
                    "outcome": outcome,
                    "reviewed_at": _iso(created + delay),
                    "reviewed_by": data["recorded_by"],
                    "actual_result": review["actualResult"],
                }
            )
            if "lessons" in review:
                data["lessons"] = review["lessons"]
        folder = root / f"{created.year:04d}" / f"{created.month:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"decision-{n:08x}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        written.append(Written(data["id"], data["recorded_by"], created, reviewed, review_by))
    return written


async def announce(client: RpcClient, gen: Generator) -> list[str]:
    """Ordinary intents, then escalated ones: the ids of the approvals they asked for."""
    for _ in range(INTENTS):
        outcome = await client.call("cstp.announceIntent", gen.intent_params())
        if not outcome.ok:
            raise BenchError(f"announceIntent failed: {outcome.error} {outcome.message}")
    approvals: list[str] = []
    for n in range(ESCALATIONS):
        params = gen.intent_params()
        # clear of the shipped block rules, so only the run's escalate rule decides
        params.update({"stakes": "medium", "confidence": 0.8, "correlationId": f"bench-{n}"})
        params["metadata"] = {"needs_approval": True, "code_review": True, "ticket": f"OPS-{n}"}
        outcome = await client.call("cstp.announceIntent", params)
        escalation = (outcome.result or {}).get("guardrailStatus", {}).get("escalation")
        if not outcome.ok or not escalation or escalation.get("status") != "pending":
            raise BenchError(f"an intent did not escalate: {outcome.error} {outcome.result}")
        approvals.append(escalation["approvalId"])
    return approvals


async def decide(client: RpcClient, approval_ids: list[str]) -> None:
    """Approve the first DECIDED approvals as the console's agent (not their requester)."""
    for approval_id in approval_ids[:DECIDED]:
        params = {"id": approval_id, "verdict": "approve", "reason": "Rollback plan checked"}
        outcome = await client.call("cstp.decideApproval", params)
        if not outcome.ok:
            raise BenchError(f"decideApproval failed: {outcome.error} {outcome.message}")


async def sign_in(http: httpx.AsyncClient, token: str) -> None:
    """As a browser: the form (its cookie and hidden csrf), then the token posted with it."""
    form = await http.get("/console/login")
    found = CSRF_INPUT.search(form.text)
    if form.status_code != 200 or found is None:
        raise BenchError(f"GET /console/login: HTTP {form.status_code}, csrf input found: {found}")
    done = await http.post("/console/login", data={"token": token, "csrf": found.group(1)})
    if done.status_code != 303 or done.headers.get("location") != "/console/decisions":
        raise BenchError(f"POST /console/login: HTTP {done.status_code} {done.text[:300]}")
    if not http.cookies.get("cstp_session"):
        raise BenchError("POST /console/login set no cstp_session cookie")


@dataclass(frozen=True)
class Page:
    """A page to time: its label in the report, the paths asked in turn, and what its body
    must hold (the rows the data should show) for the time to count."""

    label: str
    paths: tuple[str, ...]
    shows: tuple[str, ...]
    at_least: tuple[str, int] | None = None  # a marker that must appear this many times


def pages(written: list[Written], pending: int) -> list[Page]:
    total = len(written)
    last = max(1, math.ceil(total / 25))  # app.console.decisions.PAGE_SIZE
    # reviewed and unreviewed ones, spread over the year
    step = max(1, total // DETAIL_IDS)
    ids = tuple(f"/console/decisions/{w.id}" for w in written[::step][:DETAIL_IDS])
    return [
        Page("decisions", ("/console/decisions",), (f"{total} decisions, page 1 of", "<tbody>")),
        Page(
            "decisions?q=<word>",
            tuple(f"/console/decisions?q={w}" for w in SEARCH_WORDS),
            ("best match", "<tbody>"),
        ),
        Page(
            f"decisions?category={CATEGORY}",
            (f"/console/decisions?category={CATEGORY}",),
            ("<tbody>",),
        ),
        Page(f"decisions?page={last}", (f"/console/decisions?page={last}",), ("<tbody>",)),
        Page("decisions/<id>", ids, ("<dt>Id</dt>",)),
        Page(
            "approvals", ("/console/approvals",), (f"Pending ({pending})", "Rollback plan checked")
        ),
        Page("ready", ("/console/ready",), (f"for {LEAD}, most urgent first", "<tbody>")),
        Page("calibration", ("/console/calibration",), (), ("data-month=", MONTHS_WITH_DATA)),
        Page("guardrails", ("/console/guardrails",), ("bench-needs-approval", "/replay")),
        Page("audit", ("/console/audit",), ("bench-0", "/replay")),
    ]


def check(page: Page, path: str, response: httpx.Response) -> None:
    """A page that did not answer 200 with its rows stops the run: its time would be that of
    an error or an empty page."""
    if response.status_code != 200:
        raise BenchError(f"GET {path}: HTTP {response.status_code} {response.text[:300]}")
    body = response.text
    missing = [s for s in page.shows if s not in body]
    if page.at_least is not None and body.count(page.at_least[0]) < page.at_least[1]:
        missing.append(f"{page.at_least[1]} x {page.at_least[0]}")
    if missing:
        raise BenchError(f"GET {path}: the page lacks {missing}")


async def measure(http: httpx.AsyncClient, page: Page, calls: int, warmup: int) -> dict[str, Any]:
    """The page's paths in turn, one request at a time; client-observed ms per request."""
    for n in range(warmup):
        path = page.paths[n % len(page.paths)]
        check(page, path, await http.get(path))
    times: list[float] = []
    by_path: dict[str, list[float]] = {}
    for n in range(calls):
        path = page.paths[n % len(page.paths)]
        start = time.perf_counter()
        response = await http.get(path)  # the whole body is read before it returns
        times.append((time.perf_counter() - start) * 1000)
        by_path.setdefault(path, []).append(times[-1])
        check(page, path, response)
    out: dict[str, Any] = {"paths": list(page.paths), "latencyMs": summarize(times)}
    if len(by_path) > 1:  # which of the page's paths is slow, when one is
        out["byPath"] = {path: summarize(seen) for path, seen in by_path.items()}
    return out


async def bench(args: argparse.Namespace, prepared: Prepared) -> dict[str, Any]:
    gen = Generator(seed=args.seed)
    started = time.monotonic()
    now = datetime.now(UTC)
    tree = prepared.tmp / "journal"
    written = journal(tree, args.decisions, gen, now)
    log(f"[seed] {len(written)} files written in {time.monotonic() - started:.0f} s; importing")
    prepared.cstp("import", str(tree))
    log(f"[seed] imported in {time.monotonic() - started:.0f} s")
    scopes = "read,review:any,approve,audit"
    made = json.loads(
        prepared.cstp("tokens", "create", "--agent", LEAD, "--scopes", scopes, "--json")
    )
    prepared.server.start()
    await prepared.server.wait_healthy(300)
    agent = RpcClient(prepared.server.base_url, prepared.token)
    lead = RpcClient(prepared.server.base_url, made["token"])
    try:
        approval_ids = await announce(agent, gen)
        await decide(lead, approval_ids)
    finally:
        await agent.close()
        await lead.close()
    log(f"[seed] {INTENTS + ESCALATIONS} intents announced, {len(approval_ids)} escalated")
    require_loopback(prepared.server.base_url)
    rows: dict[str, Any] = {}
    async with httpx.AsyncClient(
        base_url=prepared.server.base_url,
        timeout=httpx.Timeout(60.0, connect=5.0),
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        trust_env=False,  # never through a proxy from the environment
    ) as http:
        await sign_in(http, made["token"])
        for page in pages(written, ESCALATIONS - DECIDED):
            rows[page.label] = await measure(http, page, args.calls, args.warmup)
            log(f"[measure] {page.label}: p95 {rows[page.label]['latencyMs']['p95']} ms")
    reviewed = sum(w.reviewed for w in written)
    return {
        "decisions": len(written),
        "reviewed": reviewed,
        "byAgent": {a: sum(w.agent == a for w in written) for a in AGENTS},
        "reviewDue": sum(
            w.review_by is not None and w.review_by <= now and not w.reviewed for w in written
        ),
        "intents": INTENTS + ESCALATIONS,
        "approvals": {"pending": len(approval_ids) - DECIDED, "decided": DECIDED},
        "database": prepared.database.split(":")[0],
        "calls": args.calls,
        "warmup": args.warmup,
        "startedAt": _iso(now),
        "git": git_info(),
        "loadavg": loadavg(),
        "cpus": os.cpu_count(),
        "measured": "client-observed over loopback: an upper bound of the server's time",
        "pages": rows,
        "serverProblems": prepared.server.log_problems(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or REPO_ROOT / "bench" / "results" / f"console-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    prepared = prepare_server("cstp-console-", args.database_url, 64, {}, log)
    rules = prepared.tmp / "rules"
    rules.mkdir()
    (rules / "approvals.yaml").write_text(RULES, encoding="utf-8")
    # the import and `cstp tokens create` run with the server's environment too
    prepared.server.env["CSTP_GUARDRAILS_DIR"] = str(rules)
    report = prepared.run(lambda ready: bench(args, ready), args.database_url, out, log)
    if report is None:
        return 2
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        f"{report['decisions']:,} decisions ({report['reviewed']:,} reviewed), "
        f"{report['database']}, console pages, one client, {report['calls']} requests each; "
        "client-observed ms (an upper bound of server time)"
    )
    print("| page | p50 ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for label, row in report["pages"].items():
        lat = row["latencyMs"]
        print(f"| {label} | {lat['p50']} | {lat['p95']} | {lat['max']} |")
    print(f"result: {out}", file=sys.stderr)
    for line in report["serverProblems"]:
        log(f"server log: {line}")
    return 1 if report["serverProblems"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # SIGTERM unwinds like Ctrl-C, so the server is stopped and its data removed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
