"""Nothing crosses a workspace (SPEC.md sections 7 and 8; the acceptance of issue 38).

Three workspaces (``default``, ``red``, ``blue``) hold journals that look alike: the same
agent names (``alice`` and ``bob`` with role agent, ``rita`` a reviewer, ``carol`` an
approver, ``audra`` an auditor) in each, the same correlationIds (``cid-shared`` of alice,
``cid-bob`` of bob) announced in each with other intents, twin decisions with the same text,
and decisions and texts of each workspace's own (its marker word: heron, kestrel, osprey).
An escalate rule (a ``migration`` fact) gives each workspace approvals of the same kinds:
pending ones under correlationIds every workspace has (``mig-shared``, ``mig-bob``) and one of
its own (``mig-<ws>``), one denied and two approved by its carol (one asked by
checkGuardrails, with no correlationId), one expired, and spare pending ones for carol to
decide. Then every method, over ``/cstp`` and every tool over ``/mcp`` (the MCP SDK's client),
is called with a token of one workspace against the ids, approval ids, correlationIds and
texts of another, first once per method, face and direction, then as Hypothesis chooses the
method, the face, the two workspaces, the agent, which of the other workspace's values to
send, and the other params.

Each answer is held to a model of the caller's workspace alone, read from SQL before the
call: the decisions listed, counted (listDecisions ``total``, getCalibration's counts and
figures), found (queryDecisions; semantic and hybrid search return every matching decision
of a journal this small) and shown as similar or suggested (announceIntent) are exactly the
caller's own; an id of another workspace answers exactly as an id that exists nowhere
(-32007, the same message and data, the id put in); a correlationId another workspace's
agent of the same name announced is unknown to recordDecision (as a fresh one is) and a
fresh announcement for announceIntent (no replay, no -32008 of the other's row). Approvals
likewise: getApproval, decideApproval and checkGuardrails' ``approvalId`` answer another
workspace's approval exactly as one that exists nowhere (-32007), even for an approver;
listApprovals lists and counts the caller's workspace's alone (status by time, pending first by
deadline, then newest first); an escalated announcement finds only its own workspace's
approval under its correlationId (its status, or -32008 for another action), else asks anew
in the caller's workspace. And around every call, in SQL: no row of another workspace is
added, changed or removed (decisions, reasons, tags, reviews, intents, matches, evaluations,
rule results, outbox events, approvals and their decisions, chain entries), and every row the
call writes carries the caller's workspace and points only at rows of it.

Then what is not a method: each workspace's YAML files are under its own folder (default's
as ever), and rate-limit budgets are per workspace. A busy workspace cannot push a word
out of a small one's keyword search, nor move its keyword scores.

Runs on SQLite, and on Postgres with CSTP_TEST_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import yaml
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.approvals import expiry
from app.asgi import build_registry, create_app
from app.config import Settings, parse_rate_limits
from app.runtime import iso
from app.scopes import DEFAULT_WORKSPACE, ROLES
from app.search.embedder import Embedder
from support.app import AppClient, Rpc, add_token, serve_app

T = TypeVar("T")

WORKSPACES = ("default", "red", "blue")
ROLE = {
    "alice": "agent",
    "bob": "agent",
    "rita": "reviewer",
    "carol": "approver",
    "audra": "auditor",
}
MARK = {"default": "heron", "red": "kestrel", "blue": "osprey"}
TICKET = {"default": "OPS-1101", "red": "OPS-2202", "blue": "OPS-3303"}
CATEGORIES = ("architecture", "process", "tooling", "security")
STAKES = ("low", "medium", "high", "critical")
OUTCOMES = ("success", "partial", "failure", "abandoned")
MODES = ("semantic", "keyword", "hybrid")
SCORES = {"success": 1.0, "partial": 0.5, "failure": 0.0}
NOT_FOUND = -32007
FORBIDDEN = -32010
CONFLICT = -32008
APPROVAL_STATUSES = ("pending", "approved", "denied", "expired")
REGISTRY = build_registry()
METHODS = tuple(REGISTRY.names())
TOOL = {op.name: op.tool for op in REGISTRY.tools() if op.tool}
WRITERS = ("alice", "bob")  # may announce, record and check guardrails
DECIDERS = ("carol", "carol", "bob")  # mostly the approver; bob lacks the scope
LISTERS = ("carol", "audra", "carol", "audra", "alice")  # approve, audit; alice neither
MCP_HOST = "http://127.0.0.1:9991"  # a Host /mcp serves (loopback)


def token(workspace: str, agent: str) -> str:
    return f"token-{workspace}-{agent}"


# ---------------------------------------------------------------- the escalate rules

# Added to the shipped rules (Settings.guardrails_dir). A migration waits a day, so that no
# approval asked for during the calls expires while they run (an expiry row the server's loop
# wrote in the middle of another workspace's call would be a row that call did not write);
# a quick one expires while the world is built, and its expiry row is written before the calls.
MIGRATION_RULE = "migration-needs-approval"
RULES = f"""
guardrails:
  - id: {MIGRATION_RULE}
    description: A database migration waits for a person's approval
    action: escalate
    timeout: 1d
    conditions:
      - {{field: migration, op: "==", value: true}}
    message: A migration needs approval
  - id: quick-approval
    description: Asks a person, who has one second to answer
    action: escalate
    timeout: 1s
    conditions:
      - {{field: quick, op: "==", value: true}}
    message: Needs a quick approval
"""


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The tests' settings with the escalate rules (``client`` is built from these)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "approvals.yaml").write_text(RULES, encoding="utf-8")
    return settings.with_overrides(guardrails_dir=rules)


# ---------------------------------------------------------------- the journals


def announcements(ws: str) -> list[tuple[str, dict[str, Any]]]:
    """Each workspace's announcements: the same correlationIds, the workspace's own intents
    (and one correlationId, ``cid-<ws>``, no other workspace has)."""
    m, t = MARK[ws], TICKET[ws]
    return [
        (
            "alice",
            {
                "intent": f"Roll out the {m} plan in stages",
                "context": f"Tracked as {t}",
                "category": "process",
                "stakes": "medium",
                "confidence": 0.7,
                "correlationId": "cid-shared",
            },
        ),
        (
            "alice",
            {
                "intent": f"Cache the {m} catalogue at the edge",
                "context": "Pages are slow at peak",
                "category": "architecture",
                "stakes": "high",
                "confidence": 0.9,
                "correlationId": f"cid-{ws}",
            },
        ),
        (
            "bob",
            {
                "intent": f"Rotate the {m} database credentials",
                "context": "An audit finding",
                "category": "security",
                "stakes": "high",
                "confidence": 0.5,
                "correlationId": "cid-bob",
            },
        ),
    ]


def migrations(ws: str) -> list[tuple[str, dict[str, Any]]]:
    """Each workspace's escalated announcements: ``mig-shared`` and ``mig-bob`` every
    workspace has (with other intents), ``mig-<ws>`` its own; ``mig-approved`` is approved
    and announced again (then stored as allowed, and replayed)."""
    m, t = MARK[ws], TICKET[ws]

    def migration(agent: str, what: str, cid: str) -> tuple[str, dict[str, Any]]:
        return (
            agent,
            {
                "intent": f"Migrate the {m} {what}",
                "context": f"Tracked as {t}",
                "category": "architecture",
                "stakes": "medium",
                "confidence": 0.8,
                "metadata": {"migration": True, "database": m},
                "correlationId": cid,
            },
        )

    return [
        migration("alice", "orders table", "mig-shared"),
        migration("alice", "users table", f"mig-{ws}"),
        migration("bob", "audit log", "mig-bob"),
        migration("alice", "invoices table", "mig-approved"),
    ]


def migration_check(ws: str, what: str) -> dict[str, Any]:
    """An action checkGuardrails escalates (its approval has no correlationId)."""
    return {
        "description": f"Migrate the {MARK[ws]} {what}",
        "category": "architecture",
        "stakes": "medium",
        "confidence": 0.8,
        "context": {"migration": True},
    }


def hurried(ws: str) -> dict[str, Any]:
    """bob's announcement whose approval expires in a second: sent again only in its own
    workspace (where it finds that approval, expired); elsewhere it would ask for one that
    expires while the calls run."""
    return {
        "intent": f"Migrate the {MARK[ws]} cache in a hurry",
        "stakes": "medium",
        "confidence": 0.8,
        "metadata": {"quick": True},
        "correlationId": f"quick-{ws}",
    }


SPARES = 4  # pending approvals per workspace that carol decides in the telling calls
WAITING = 6  # and those the chosen calls may decide


@dataclass
class Planned:
    agent: str
    params: dict[str, Any]
    review: tuple[str, str, str] | None = None  # reviewer, outcome, lessons


def decisions(ws: str) -> list[Planned]:
    """Twins (the same text in every workspace), the workspace's own decisions (linked to its
    announcements), and as many extra ones as the workspace's position: the journals differ
    in size, so a count of another's rows cannot pass unnoticed."""
    m, t = MARK[ws], TICKET[ws]
    reasons = [{"type": "analysis", "text": f"Fewer {m} pages at night", "strength": 0.7}]
    planned = [
        Planned(
            "alice",
            {
                "decision": "Move the billing queue to a managed broker",
                "confidence": 0.8,
                "category": "architecture",
                "context": "The same plan in every team",
                "tags": ["queue"],
                "reasons": reasons,
            },
            ("alice", "success", f"Size the {m} broker for the peak"),
        ),
        Planned(
            "bob",
            {
                "decision": "Pin the build toolchain in CI",
                "confidence": 0.6,
                "category": "tooling",
                "tags": ["ci"],
            },
        ),
        Planned(
            "alice",
            {
                "decision": f"Adopt the {m} rollout plan for {t}",
                "confidence": 0.7,
                "category": "process",
                "context": f"The {m} teams asked for stages",
                "tags": [m, "rollout"],
                "correlationId": "cid-shared",
            },
            None if ws == "default" else ("alice", "partial", f"The {m} stages took longer"),
        ),
        Planned(
            "alice",
            {
                "decision": f"Cache the {m} catalogue at the edge",
                "confidence": 0.9,
                "category": "architecture",
                "tags": ["cache"],
                "correlationId": f"cid-{ws}",
            },
        ),
        Planned(
            "bob",
            {
                "decision": f"Rotate the {m} database credentials monthly",
                "confidence": 0.5,
                "category": "security",
                "correlationId": "cid-bob",
                "reasons": reasons,
            },
            ("rita", "failure", f"Automate the {m} rotation first"),
        ),
    ]
    for k in range(WORKSPACES.index(ws)):
        planned.append(
            Planned(
                "bob",
                {
                    "decision": f"Split the {m} search indexer into service {k}",
                    "confidence": round(0.4 + 0.3 * k, 2),
                    "category": "architecture",
                    "tags": ["search"],
                },
                ("bob", "success", f"The {m} indexer scaled") if k else None,
            )
        )
    return planned


@dataclass
class World:
    """What the journals hold, for choosing the other workspace's values."""

    ids: dict[str, list[str]] = field(default_factory=dict)  # workspace -> decision ids
    by_agent: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (ws, agent)
    cids: dict[str, list[str]] = field(default_factory=dict)  # workspace -> correlationIds
    announced: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)  # whole texts
    words: dict[str, list[str]] = field(default_factory=dict)  # their words
    tags: list[str] = field(default_factory=list)
    approvals: dict[str, list[str]] = field(default_factory=dict)  # workspace -> approval ids
    # (workspace, kind) -> an approval id; kinds: pending (alice's mig-shared), own (alice's
    # mig-<ws>), denied (bob's mig-bob), granted (mig-approved), checked (approved, asked by
    # checkGuardrails), expired (bob's quick one)
    approval: dict[tuple[str, str], str] = field(default_factory=dict)
    spare: dict[str, list[str]] = field(default_factory=dict)  # pending, asked by checks
    waiting: dict[str, list[str]] = field(default_factory=dict)  # pending, for chosen calls
    # workspace -> (requester, action, approval id) of its checkGuardrails approvals
    checks: dict[str, list[tuple[str, dict[str, Any], str]]] = field(default_factory=dict)


async def build_world(client: AppClient) -> World:
    rpc = Rpc(client)
    world = World()
    for ws in WORKSPACES:
        for agent, role in ROLE.items():
            add_token(client, token(ws, agent), agent, role, workspace=ws)
    quick_until = []
    for ws in WORKSPACES:
        texts: list[str] = []
        # first, so that it has expired by the time the world is built
        quick_until.append(await ask_quick(rpc, world, ws))
        world.announced[ws] = announcements(ws)
        for agent, params in world.announced[ws]:
            await rpc.ok("cstp.announceIntent", params, token=token(ws, agent))
            texts += [params["intent"], params["context"]]
        world.ids[ws] = []
        for planned in decisions(ws):
            result = await rpc.ok(
                "cstp.recordDecision", planned.params, token=token(ws, planned.agent)
            )
            world.ids[ws].append(result["id"])
            world.by_agent.setdefault((ws, planned.agent), []).append(result["id"])
            texts.append(planned.params["decision"])
            texts += [planned.params["context"]] if "context" in planned.params else []
            texts += [r["text"] for r in planned.params.get("reasons", [])]
            world.tags += planned.params.get("tags", [])
            if planned.review is not None:
                reviewer, outcome, lessons = planned.review
                await rpc.ok(
                    "cstp.reviewDecision",
                    {"id": result["id"], "outcome": outcome, "lessons": lessons},
                    token=token(ws, reviewer),
                )
                texts.append(lessons)
        texts += await ask_approvals(rpc, world, ws)
        world.cids[ws] = sorted({p["correlationId"] for _, p in world.announced[ws]})
        world.texts[ws] = sorted(set(texts))
        world.words[ws] = sorted({w for t in texts for w in t.split() if len(w) > 3})
    world.tags = sorted(set(world.tags))
    await expired(client, max(quick_until))
    return world


async def ask_quick(rpc: Rpc, world: World, ws: str) -> datetime:
    """bob's approval that expires in a second; its deadline."""
    asked = await rpc.ok("cstp.announceIntent", hurried(ws), token=token(ws, "bob"))
    escalation = asked["guardrailStatus"]["escalation"]
    world.approval[(ws, "expired")] = escalation["approvalId"]
    world.approvals[ws] = [escalation["approvalId"]]
    return datetime.fromisoformat(escalation["expiresAt"])


async def ask_approvals(rpc: Rpc, world: World, ws: str) -> list[str]:
    """The workspace's approvals, asked by its agents and decided by its carol (never by the
    agent that asked); the texts they sent."""
    carol = token(ws, "carol")
    asked: dict[str, str] = {}
    for agent, params in migrations(ws):
        answer = await rpc.ok("cstp.announceIntent", params, token=token(ws, agent))
        asked[params["correlationId"]] = answer["guardrailStatus"]["escalation"]["approvalId"]
    world.announced[ws] += migrations(ws)
    await rpc.ok(
        "cstp.decideApproval",
        {"id": asked["mig-bob"], "verdict": "deny", "reason": f"Not during the {MARK[ws]} sale"},
        token=carol,
    )
    await rpc.ok("cstp.decideApproval", {"id": asked["mig-approved"], "verdict": "approve"}, carol)
    granted = dict(migrations(ws)[-1][1])
    again = await rpc.ok("cstp.announceIntent", granted, token=token(ws, "alice"))
    assert again["guardrailStatus"]["allowed"] is True
    world.approval |= {
        (ws, "pending"): asked["mig-shared"],
        (ws, "own"): asked[f"mig-{ws}"],
        (ws, "denied"): asked["mig-bob"],
        (ws, "granted"): asked["mig-approved"],
    }
    world.checks[ws] = []
    for what in ("billing database", *(f"ledger, part {k}" for k in range(SPARES))):
        action = migration_check(ws, what)
        answer = await rpc.ok("cstp.checkGuardrails", {"action": action}, token(ws, "alice"))
        world.checks[ws].append(("alice", action, answer["escalation"]["approvalId"]))
    world.approval[(ws, "checked")] = world.checks[ws][0][2]
    await rpc.ok(
        "cstp.decideApproval",
        {"id": world.checks[ws][0][2], "verdict": "approve", "reason": "Window agreed"},
        carol,
    )
    world.spare[ws] = [c[2] for c in world.checks[ws][1:]]
    for k in range(WAITING):
        action = migration_check(ws, f"archive, batch {k}")
        answer = await rpc.ok("cstp.checkGuardrails", {"action": action}, token(ws, "bob"))
        world.checks[ws].append(("bob", action, answer["escalation"]["approvalId"]))
    world.waiting[ws] = [c[2] for c in world.checks[ws][1 + SPARES :]]
    world.waiting[ws] += [asked["mig-shared"], asked[f"mig-{ws}"]]
    world.approvals[ws] += [*asked.values(), *(c[2] for c in world.checks[ws])]
    sent = [p["intent"] for _, p in migrations(ws)]
    sent += [action["description"] for _, action, _ in world.checks[ws]]
    return [*sent, f"Not during the {MARK[ws]} sale", "Window agreed"]


async def expired(client: AppClient, until: datetime) -> None:
    """Past the quick approvals' deadline, with their expiry rows written (by the server's
    loop or here): nothing is left for the loop to write while the calls run."""
    await asyncio.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 0.2)
    services = client.app.state.services

    def later() -> datetime:  # past the writer's grace after the deadline
        return services.runtime.now() + expiry.GRACE

    while await expiry.expire_overdue(services.db, later):
        pass


# ---------------------------------------------------------------- SQL: every row, by table

# table -> (its key column, or None; the columns that point at another table's rows)
TABLES: dict[str, tuple[str | None, dict[str, str]]] = {
    "decisions": (
        "id",
        {"intent_id": "intents", "guardrail_evaluation_id": "guardrail_evaluations"},
    ),
    "decision_reasons": ("id", {"decision_id": "decisions"}),
    "decision_tags": (None, {"decision_id": "decisions"}),
    "decision_reviews": ("id", {"decision_id": "decisions"}),
    "intents": ("id", {"evaluation_id": "guardrail_evaluations"}),
    "intent_matches": ("id", {"intent_id": "intents", "decision_id": "decisions"}),
    "guardrail_evaluations": ("id", {}),
    "guardrail_rule_results": ("id", {"evaluation_id": "guardrail_evaluations"}),
    "outbox_events": ("id", {"decision_id": "decisions"}),
    "approvals": ("id", {"evaluation_id": "guardrail_evaluations"}),
    "approval_decisions": ("approval_id", {"approval_id": "approvals"}),
    "session_briefs": ("id", {}),
    "audit_chain": ("seq", {}),
}
# An outbox event's progress (status, attempts, lease) is the relay's to change, whenever it
# runs: its identity is what no call of another workspace may touch.
COLUMNS = {"outbox_events": "id, workspace, kind, decision_id, created_at"}


def canonical(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def loaded(value: Any) -> Any:
    """A JSON column's value as read by plain SQL: text on either database here."""
    return json.loads(value) if isinstance(value, str) else value


def moment(value: Any) -> datetime:
    """A timestamp column's value as read by plain SQL: an aware datetime on Postgres, the
    naive UTC text SQLite stores."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


@dataclass
class Snapshot:
    rows: dict[str, list[dict[str, Any]]]

    def workspace_of(self, table: str) -> dict[str, str]:
        key = TABLES[table][0]
        assert key is not None
        return {str(r[key]): r["workspace"] for r in self.rows[table]}

    def of(self, table: str, ws: str) -> list[dict[str, Any]]:
        return [r for r in self.rows[table] if r["workspace"] == ws]

    def added(self, before: Snapshot, table: str) -> list[dict[str, Any]]:
        """The rows of ``table`` here that ``before`` did not have (by key)."""
        key = TABLES[table][0]
        assert key is not None
        known = {str(r[key]) for r in before.rows[table]}
        return [r for r in self.rows[table] if str(r[key]) not in known]


async def snapshot(engine: AsyncEngine) -> Snapshot:
    rows: dict[str, list[dict[str, Any]]] = {}
    async with engine.connect() as conn:
        for table in TABLES:
            result = await conn.execute(text(f"SELECT {COLUMNS.get(table, '*')} FROM {table}"))
            rows[table] = [dict(r._mapping) for r in result]
    return Snapshot(rows)


def check_rows(before: Snapshot, after: Snapshot, me: str, seen: Counter[str]) -> None:
    """No row of another workspace added, changed or removed; every row added or changed is
    of ``me`` and points only at rows of ``me``."""
    for table, (key, refs) in TABLES.items():
        old = {canonical(r): r for r in before.rows[table]}
        new = {canonical(r): r for r in after.rows[table]}
        gone = [r for k, r in old.items() if k not in new and r["workspace"] != me]
        assert not gone, (me, table, "another workspace's rows changed or removed", gone)
        added = [r for k, r in new.items() if k not in old]
        strangers = [r for r in added if r["workspace"] != me]
        assert not strangers, (me, table, "rows written in another workspace", strangers)
        for column, target in refs.items():
            owner = after.workspace_of(target)
            for r in added:
                if r[column] is not None:
                    assert owner[str(r[column])] == me, (me, table, column, r)
        if key is not None:
            known = {str(r[key]) for r in before.rows[table]}
            seen[table] += sum(1 for r in added if str(r[key]) not in known)
        else:
            seen[table] += len(added)
    old_entries = {canonical(r) for r in before.rows["audit_chain"]}
    for entry in after.rows["audit_chain"]:
        if canonical(entry) in old_entries:
            continue
        key, _ = TABLES.get(entry["table_name"], (None, {}))
        if key is not None:  # the row the entry covers is of the caller's workspace too
            assert after.workspace_of(entry["table_name"])[entry["row_id"]] == me, entry


# ---------------------------------------------------------------- the model of one workspace


def announced(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (agent, correlationId): the ok announcement, else the latest escalated one (what
    the server reads to replay, or to refuse another intent, and to link a decision)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["outcome"] == "ok", r["received_at"])):
        if r["outcome"] in ("ok", "escalated"):
            out[(r["agent"], r["correlation_id"])] = r
    return out


@dataclass
class Model:
    """One workspace as its own SQL rows say, and what each method must answer from them."""

    decisions: dict[str, dict[str, Any]]
    tags: dict[str, set[str]]
    reviews: Counter[str]
    # (agent, cid) -> its ok announcement, else its latest escalated one
    intents: dict[tuple[str, str], dict[str, Any]]
    # id -> the approval's row with its decision's columns (verdict None while undecided)
    approvals: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, snap: Snapshot, ws: str) -> Model:
        tags: dict[str, set[str]] = {}
        for r in snap.of("decision_tags", ws):
            tags.setdefault(r["decision_id"], set()).add(r["tag"])
        undecided = {"verdict": None, "decided_by": None, "decided_at": None, "reason": None}
        decided = {r["approval_id"]: r for r in snap.of("approval_decisions", ws)}
        approvals = {}
        for r in snap.of("approvals", ws):
            d = decided.get(r["id"], undecided)
            approvals[r["id"]] = {**r, **{k: d[k] for k in undecided}}
        return cls(
            decisions={r["id"]: r for r in snap.of("decisions", ws)},
            tags=tags,
            reviews=Counter(r["decision_id"] for r in snap.of("decision_reviews", ws)),
            intents=announced(snap.of("intents", ws)),
            approvals=approvals,
        )

    # ---- approvals

    @staticmethod
    def status(a: dict[str, Any], now: datetime) -> str:
        """Its decision's verdict, else expired from its deadline on, else pending."""
        if a["verdict"] is not None:
            return str(a["verdict"])
        return "expired" if now >= moment(a["expires_at"]) else "pending"

    def shown(self, approval_id: str, now: datetime) -> dict[str, Any]:
        """The approval as getApproval, listApprovals and decideApproval answer it."""
        a = self.approvals[approval_id]
        out = {
            "id": a["id"],
            "status": self.status(a, now),
            "requestedBy": a["requested_by"],
            "correlationId": a["correlation_id"],
            "action": loaded(a["action"]),
            "rules": loaded(a["rules"]),
            "createdAt": iso(moment(a["created_at"])),
            "expiresAt": iso(moment(a["expires_at"])),
            "evaluationId": a["evaluation_id"],
        }
        if a["decided_at"] is not None:
            out["decidedAt"] = iso(moment(a["decided_at"]))
        out |= {"decidedBy": a["decided_by"]} if a["decided_by"] is not None else {}
        out |= {"reason": a["reason"]} if a["reason"] is not None else {}
        return out

    def approvals_listed(self, status: str | None, now: datetime) -> list[str]:
        """listApprovals' order of the matching ids: pending first, the soonest to expire
        first, then the others, newest first (ties by id)."""
        matching = [a for a in self.approvals.values() if status in (None, self.status(a, now))]
        pending = [a for a in matching if self.status(a, now) == "pending"]
        rest = [a for a in matching if self.status(a, now) != "pending"]
        pending.sort(key=lambda a: a["id"])
        pending.sort(key=lambda a: moment(a["created_at"]), reverse=True)
        pending.sort(key=lambda a: moment(a["expires_at"]))
        rest.sort(key=lambda a: a["id"])
        rest.sort(key=lambda a: moment(a["created_at"]), reverse=True)
        return [a["id"] for a in pending + rest]

    def asked(self, agent: str, cid: str) -> dict[str, Any] | None:
        """The approval ``agent`` asked for under ``cid``, if any."""
        found = [
            a
            for a in self.approvals.values()
            if (a["requested_by"], a["correlation_id"]) == (agent, cid)
        ]
        assert len(found) <= 1, found
        return found[0] if found else None

    @staticmethod
    def escalation(a: dict[str, Any], status: str) -> dict[str, Any]:
        """The ``escalation`` a guardrail answer shows for approval ``a``."""
        return {
            "approvalId": a["id"],
            "status": status,
            "expiresAt": iso(moment(a["expires_at"])),
            "rules": loaded(a["rules"]),
        }

    def listed(self, p: dict[str, Any]) -> set[str]:
        out = set()
        for i, d in self.decisions.items():
            if any(
                p.get(name) is not None and d[column] != p[name]
                for name, column in (
                    ("category", "category"),
                    ("stakes", "stakes"),
                    ("status", "status"),
                    ("agent", "recorded_by"),
                    ("correlationId", "correlation_id"),
                )
            ):
                continue
            if not set(p.get("tags") or ()) <= self.tags.get(i, set()):
                continue
            needle = (p.get("search") or "").strip().lower()
            if needle and needle not in f"{d['decision']}\n{d['context'] or ''}".lower():
                continue
            out.add(i)
        return out

    def found(self, f: dict[str, Any]) -> set[str]:
        out = set()
        for i, d in self.decisions.items():
            if f.get("category") is not None and d["category"] != f["category"]:
                continue
            if f.get("agent") is not None and d["recorded_by"] != f["agent"]:
                continue
            if f.get("status") and d["status"] not in f["status"]:
                continue
            if f.get("hasOutcome") is not None and (d["outcome"] is not None) != f["hasOutcome"]:
                continue
            if f.get("minConfidence") is not None and d["confidence"] < f["minConfidence"]:
                continue
            if not set(f.get("tags") or ()) <= self.tags.get(i, set()):
                continue
            out.add(i)
        return out

    def calibrated(self, agent: str | None, category: str | None) -> list[dict[str, Any]]:
        return [
            d
            for d in self.decisions.values()
            if (agent is None or d["recorded_by"] == agent)
            and (category is None or d["category"] == category)
        ]


def sums(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """getCalibration's counts and figures of ``rows`` (SPEC.md: success 1, partial 0.5,
    failure 0, abandoned not scored)."""
    scored = [(d["confidence"], SCORES[d["outcome"]]) for d in rows if d["outcome"] in SCORES]
    n = len(scored)

    def mean(values: list[float]) -> float | None:
        return sum(values) / n if n else None

    return {
        "totalDecisions": n,
        "reviewedDecisions": sum(1 for d in rows if d["outcome"] is not None),
        "pendingDecisions": sum(1 for d in rows if d["outcome"] is None),
        "brierScore": mean([(c - s) ** 2 for c, s in scored]),
        "accuracy": mean([s for _, s in scored]),
        "meanConfidence": mean([c for c, _ in scored]),
    }


def drift_of(
    model: Model, agent: str | None, category: str | None, min_decisions: int
) -> dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any], bool]]:
    """checkDrift's groups of the model's decisions: per (agent, category), the recent (last 30
    days by review time) and baseline (the 90 before) windows' figures and the verdict."""
    now = datetime.now(UTC)
    split, since = now - timedelta(days=30), now - timedelta(days=120)
    windows: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    for d in model.decisions.values():
        if d["outcome"] not in SCORES or d["reviewed_at"] is None:
            continue
        if (agent is not None and d["recorded_by"] != agent) or (
            category is not None and d["category"] != category
        ):
            continue
        reviewed = moment(d["reviewed_at"])
        if not since < reviewed <= now:
            continue
        side = "recent" if reviewed > split else "baseline"
        sides = windows.setdefault((d["recorded_by"], d["category"]), {})
        sides.setdefault(side, []).append((d["confidence"], SCORES[d["outcome"]]))

    def figures(pairs: list[tuple[float, float]]) -> dict[str, Any]:
        n = len(pairs)
        if not n:
            return {"n": 0, "brierScore": None, "accuracy": None}
        return {
            "n": n,
            "brierScore": sum((c - s) ** 2 for c, s in pairs) / n,
            "accuracy": sum(s for _, s in pairs) / n,
        }

    out = {}
    for key, sides in windows.items():
        recent, baseline = figures(sides.get("recent", [])), figures(sides.get("baseline", []))
        drifted = (
            recent["n"] >= min_decisions
            and baseline["n"] >= min_decisions
            and (
                recent["brierScore"] > baseline["brierScore"] * 1.2
                or baseline["accuracy"] - recent["accuracy"] > 0.15
            )
        )
        out[key] = (recent, baseline, drifted)
    return out


def sees_every_approval(agent: str) -> bool:
    """An approver or auditor reads every approval of its workspace, an agent its own."""
    return bool(ROLES[ROLE[agent]] & {"approve", "audit"})


def may_call(agent: str, method: str) -> bool:
    """Whether ``agent``'s role has one of the scopes the method declares."""
    op = REGISTRY.get(method)
    assert op is not None, method
    return bool(ROLES[ROLE[agent]] & set(op.scopes))


def action_of(
    description: str,
    category: str | None,
    stakes: str | None,
    confidence: float | None,
    project: str | None,
    facts: dict[str, Any],
) -> dict[str, Any]:
    """The action an approval keeps: what was evaluated, as the caller sent it."""
    return {
        "description": description,
        "category": category,
        "stakes": stakes,
        "confidence": confidence,
        "project": project,
        "context": facts,
    }


def blocked(action: dict[str, Any]) -> bool:
    """Whether a block rule of the shipped ones fires (the calls send no fact of another)."""
    facts = action["context"]
    return (
        action["stakes"] in ("high", "critical")
        and action["confidence"] is not None
        and action["confidence"] < 0.5
    ) or (facts.get("affects_production") is True and facts.get("code_review") is not True)


def escalates(action: dict[str, Any]) -> bool:
    """Whether an escalate rule asks for an approval: its fact, and no block rule (block
    wins)."""
    facts = action["context"]
    return (facts.get("migration") is True or facts.get("quick") is True) and not blocked(action)


def bucket(confidence: float) -> int:
    return next((i for i in range(9, 0, -1) if confidence >= i / 10), 0)


def bucket_label(index: int) -> str:
    return f"{index / 10:.1f}-{(index + 1) / 10:.1f}"


def same_figures(got: dict[str, Any], want: dict[str, Any], where: Any) -> None:
    for name, value in want.items():
        if isinstance(value, float):
            assert got[name] is not None and abs(got[name] - value) < 0.0011, (where, name, got)
        else:
            assert got[name] == value, (where, name, got, want)


# ---------------------------------------------------------------- the two faces


class Faces:
    """One call of a method, over /cstp (JSON-RPC) or /mcp (the MCP SDK's client, one
    session per token): ``{"result": ...}`` or ``{"error": {code, message, data?}}``."""

    def __init__(self, client: AppClient, stack: AsyncExitStack) -> None:
        self.rpc = Rpc(client)
        self.client = client
        self.stack = stack
        self.sessions: dict[str, ClientSession] = {}

    async def open_mcp(self, who: list[tuple[str, str]] | None = None) -> None:
        """A session for each (workspace, agent), by default for every one."""
        for ws, agent in who or [(ws, agent) for ws in WORKSPACES for agent in ROLE]:
            tok = token(ws, agent)
            http = await self.stack.enter_async_context(
                httpx2.AsyncClient(
                    transport=httpx2.ASGITransport(app=self.client.app),
                    base_url=MCP_HOST,
                    headers={"Authorization": f"Bearer {tok}"},
                    timeout=httpx2.Timeout(60),
                )
            )
            read, write = await self.stack.enter_async_context(
                streamable_http_client(f"{MCP_HOST}/mcp", http_client=http)
            )
            session = await self.stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            self.sessions[tok] = session

    async def call(
        self, face: str, ws: str, agent: str, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        if face == "cstp":
            answer = await self.rpc.call(method, params or None, token=token(ws, agent))
            return {k: answer[k] for k in ("result", "error") if k in answer}
        result = await self.sessions[token(ws, agent)].call_tool(TOOL[method], params)
        assert result.structured_content is not None, result
        if result.is_error:
            return {"error": result.structured_content["error"]}
        return {"result": dict(result.structured_content)}


# ---------------------------------------------------------------- one call, checked


@dataclass(frozen=True)
class Case:
    face: str  # "cstp" or "mcp"
    me: str  # the caller's workspace
    agent: str
    method: str
    params: dict[str, Any]


def put(answer: Any, old: str, new: str) -> Any:
    """``answer`` with every ``old`` replaced by ``new`` (an id or a correlationId)."""
    return json.loads(json.dumps(answer).replace(old, new))


def unknown_id(snap: Snapshot) -> str:
    """A decision id no workspace has."""
    taken = {r["id"] for r in snap.rows["decisions"]}
    while (fresh := uuid.uuid4().hex[:8]) in taken:
        pass
    return fresh


def unknown_approval(snap: Snapshot) -> str:
    """An approval id no workspace has."""
    taken = {r["id"] for r in snap.rows["approvals"]}
    while (fresh := str(uuid.uuid4())) in taken:
        pass
    return fresh


class Checker:
    def __init__(
        self, faces: Faces, engine: AsyncEngine, settings: Settings, baseline: dict[str, Any]
    ) -> None:
        self.faces = faces
        self.engine = engine
        self.settings = settings
        self.baseline = baseline  # listGuardrails' and rpc.discover's answers, by params
        self.seen: Counter[str] = Counter()  # rows written, by table
        self.crossed: Counter[tuple[str, str]] = Counter()  # (method, face) of cross calls
        self.answered: Counter[str] = Counter()  # results and errors

    async def check(self, case: Case) -> None:
        first = await snapshot(self.engine)
        mine = Model.of(first, case.me)
        reference = await self.reference(case, first, mine)
        before = await snapshot(self.engine) if reference else first
        check_rows(first, before, case.me, self.seen)  # a reference call writes nothing
        model = Model.of(before, case.me)
        answer = await self.faces.call(case.face, case.me, case.agent, case.method, case.params)
        after = await snapshot(self.engine)
        check_rows(before, after, case.me, self.seen)
        self.answered[next(iter(answer))] += 1
        if not may_call(case.agent, case.method):  # refused before anything is read
            if reference is not None:
                assert answer == put(reference["answer"], reference["value"], reference["sent"])
            op = REGISTRY.get(case.method)
            assert op is not None
            assert answer["error"]["code"] == FORBIDDEN, (case, answer)
            assert answer["error"]["data"] == {"scope": op.scopes[0]}, (case, answer)
            return
        expect = getattr(self, "expect_" + case.method.split(".")[-1])
        expect(case, model, answer, reference, before, after)

    async def reference(self, case: Case, snap: Snapshot, mine: Model) -> dict[str, Any] | None:
        """The answer to the same call with a value that exists nowhere, where the call
        names another workspace's id, approval id or correlationId (or an approval of its
        own workspace the caller may not see): what it must answer too."""
        p = case.params
        name, fresh = None, ""
        if case.method in ("cstp.getDecision", "cstp.reviewDecision"):
            if p["id"] not in mine.decisions:
                name, fresh = "id", unknown_id(snap)
        elif case.method == "cstp.recordDecision" and "correlationId" in p:
            if (case.agent, p["correlationId"]) not in mine.intents:
                name, fresh = "correlationId", f"never-{uuid.uuid4().hex[:12]}"
        elif case.method in ("cstp.getApproval", "cstp.decideApproval"):
            a = mine.approvals.get(p["id"])
            if a is None or (
                case.method == "cstp.getApproval"
                and a["requested_by"] != case.agent
                and not sees_every_approval(case.agent)
            ):
                name, fresh = "id", unknown_approval(snap)
        elif case.method == "cstp.checkGuardrails" and "approvalId" in p:
            a = mine.approvals.get(p["approvalId"])
            if a is None or a["requested_by"] != case.agent:  # only the caller's own
                name, fresh = "approvalId", unknown_approval(snap)
        if name is None:
            return None
        answer = await self.faces.call(
            case.face, case.me, case.agent, case.method, {**p, name: fresh}
        )
        return {"value": fresh, "sent": p[name], "answer": answer}

    def crossing(self, case: Case, before: Snapshot, *values: Any) -> bool:
        """Whether the call names an id, correlationId or text of another workspace (counted
        for the coverage check at the end)."""
        others = [ws for ws in WORKSPACES if ws != case.me]
        ids = {r["id"] for r in before.rows["decisions"] if r["workspace"] in others}
        ids |= {r["id"] for r in before.rows["approvals"] if r["workspace"] in others}
        cids = {r["correlation_id"] for r in before.rows["intents"] if r["workspace"] in others}
        marks = [MARK[ws] for ws in others] + [TICKET[ws] for ws in others]
        crossed = any(
            v in ids or v in cids or (isinstance(v, str) and any(m in v for m in marks))
            for v in values
        )
        if crossed:
            self.crossed[(case.method, case.face)] += 1
        return crossed

    # ---- the methods that take a decision id

    def as_unknown(self, case: Case, answer: dict[str, Any], reference: dict[str, Any]) -> None:
        value = reference["sent"]
        assert answer == put(reference["answer"], reference["value"], value), (case, answer)
        assert answer["error"]["code"] == NOT_FOUND and answer["error"]["data"] == {"id": value}

    def expect_getDecision(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        _: Any,
    ) -> None:
        self.crossing(case, before, case.params["id"])
        if reference is not None:
            return self.as_unknown(case, answer, reference)
        row = model.decisions[case.params["id"]]
        got = answer["result"]["decision"]
        assert got["id"] == row["id"] and got["recordedBy"] == row["recorded_by"]
        assert got["decision"] == row["decision"] and got["outcome"] == row["outcome"]
        assert got["correlationId"] == row["correlation_id"]
        assert len(got["reviews"]) == model.reviews[row["id"]]
        return None

    def expect_reviewDecision(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        after: Snapshot,
    ) -> None:
        p = case.params
        self.crossing(case, before, p["id"], p.get("lessons"))
        if reference is not None:
            return self.as_unknown(case, answer, reference)
        row = model.decisions[p["id"]]
        if row["recorded_by"] != case.agent and ROLE[case.agent] != "reviewer":
            assert answer["error"]["code"] == -32010, answer
            assert answer["error"]["data"]["scope"] == "review:any"
            return None
        assert answer["result"]["status"] == "reviewed" and answer["result"]["id"] == p["id"]
        now = Model.of(after, case.me)
        assert now.decisions[p["id"]]["outcome"] == p["outcome"]
        assert now.reviews[p["id"]] == model.reviews[p["id"]] + 1
        return None

    # ---- reads of many rows

    def expect_listDecisions(
        self, case: Case, model: Model, answer: dict[str, Any], _: Any, before: Snapshot, *__: Any
    ) -> None:
        p = case.params
        self.crossing(case, before, p.get("correlationId"), p.get("search"))
        want = model.listed(p)
        result = answer["result"]
        got = [d["id"] for d in result["decisions"]]
        assert result["total"] == len(want), (case, result["total"], len(want))
        assert set(got) <= want, (case, set(got) - want)
        assert len(got) == min(p["limit"], len(want)), (case, got, want)
        for item in result["decisions"]:
            assert item["agent"] == model.decisions[item["id"]]["recorded_by"]

    def expect_queryDecisions(
        self, case: Case, model: Model, answer: dict[str, Any], _: Any, before: Snapshot, *__: Any
    ) -> None:
        p = case.params
        self.crossing(case, before, p["query"])
        want = model.found(p.get("filters") or {})
        result = answer["result"]
        got = [d["id"] for d in result["decisions"]]
        assert set(got) <= want, (case, set(got) - want)
        assert result["total"] == len(got) and result["agent"] == case.agent
        assert result["retrievalMode"] == p["retrievalMode"]
        if p["retrievalMode"] != "keyword" and len(want) <= p["limit"]:
            # a vector search returns the nearest, however far: all of a journal this small
            assert set(got) == want, (case, want - set(got))
        own = [i for i in want if model.decisions[i]["decision"] == p["query"]]
        assert set(own) <= set(got), (case, "its own text not found", own)

    def expect_getCalibration(
        self, case: Case, model: Model, answer: dict[str, Any], _: Any, before: Snapshot, *__: Any
    ) -> None:
        p = case.params
        f = {
            **{k: v for k, v in p.items() if k not in ("filters", "groupBy")},
            **p.get("filters", {}),
        }
        if f.get("agent") in ROLE:  # a name every workspace has an agent of
            self.crossed[(case.method, case.face)] += 1
        rows = model.calibrated(f.get("agent"), f.get("category"))
        result = answer["result"]
        same_figures(result["overall"], sums(rows), (case, "overall"))
        by_bucket = Counter(bucket(d["confidence"]) for d in rows if d["outcome"] in SCORES)
        got_buckets = {round(b["low"] * 10): b["count"] for b in result["buckets"]}
        assert got_buckets == dict(by_bucket), (case, got_buckets, by_bucket)
        group = p.get("groupBy")
        if group is not None:
            keyed: dict[str, list[dict[str, Any]]] = {}
            for d in rows:
                key = {
                    "agent": d["recorded_by"],
                    "category": d["category"],
                    "stakes": d["stakes"],
                    "confidenceBucket": bucket_label(bucket(d["confidence"])),
                }[group]
                keyed.setdefault(key, []).append(d)
            got_groups = {str(g["key"]): g for g in result["groups"]}
            assert set(got_groups) == set(keyed), (case, set(got_groups), set(keyed))
            for key, members in keyed.items():
                same_figures(got_groups[key], sums(members), (case, key))

    def expect_checkDrift(self, case: Case, model: Model, answer: dict[str, Any], *_: Any) -> None:
        p = case.params
        if p.get("agent") in ROLE:  # a name every workspace has an agent of
            self.crossed[(case.method, case.face)] += 1
        want = drift_of(model, p.get("agent"), p.get("category"), p.get("minDecisions", 5))
        got = {(g["agent"], g["category"]): g for g in answer["result"]["groups"]}
        assert set(got) == set(want), (case, set(got), set(want))
        for key, (recent, baseline, drifted) in want.items():
            same_figures(got[key]["recent"], recent, (case, key, "recent"))
            same_figures(got[key]["baseline"], baseline, (case, key, "baseline"))
            assert got[key]["drifted"] is drifted, (case, key)

    def expect_getSessionContext(
        self, case: Case, model: Model, answer: dict[str, Any], _: Any, before: Snapshot, *__: Any
    ) -> None:
        p = case.params
        self.crossing(case, before, p.get("task"))
        result = answer["result"]
        brief = result["context"]
        assert brief["agent"] == case.agent and result["tokens"] <= p.get("maxTokens", 1500)
        shown = [d["id"] for d in brief["relevant"] + brief["recentFailures"]]
        shown += [r["decisionId"] for r in brief["ready"] if "decisionId" in r]
        assert set(shown) <= set(model.decisions), (case, set(shown) - set(model.decisions))
        for f in brief["recentFailures"]:
            d = model.decisions[f["id"]]
            assert d["recorded_by"] == case.agent and d["outcome"] == "failure", (case, f)
        mine = {
            d["category"]
            for d in model.decisions.values()
            if d["recorded_by"] == case.agent and d["outcome"] in SCORES
        }
        assert {c["category"] for c in brief["calibration"]} <= mine, case

    def expect_ready(self, case: Case, model: Model, answer: dict[str, Any], *_: Any) -> None:
        p = case.params
        agent = p.get("agent") or case.agent
        if agent != case.agent and "review:any" not in ROLES[ROLE[case.agent]]:
            assert answer["error"]["code"] == -32010, (case, answer)
            assert answer["error"]["data"] == {"scope": "review:any"}
            return
        if agent != case.agent and agent in ROLE:
            self.crossed[(case.method, case.face)] += 1
        now = datetime.now(UTC)
        mine = [d for d in model.decisions.values() if d["recorded_by"] == agent]
        due = sorted(
            (
                d
                for d in mine
                if d["outcome"] is None
                and d["review_by"] is not None
                and moment(d["review_by"]) <= now
            ),
            key=lambda d: (moment(d["review_by"]), d["id"]),
        )
        stale = [
            d
            for d in mine
            if d["outcome"] is None
            and d["review_by"] is None
            and moment(d["created_at"]) < now - timedelta(days=30)
        ]
        drifted = [k for k, (_, _, flag) in drift_of(model, agent, None, 5).items() if flag]
        result = answer["result"]
        assert result["total"] == len(due) + len(stale) + len(drifted), (case, result)
        listed = [i.get("decisionId") for i in result["items"] if i["kind"] == "review_due"]
        assert listed == [d["id"] for d in due][: len(listed)], (case, listed)
        assert all(i["agent"] == agent for i in result["items"]), case
        known = {d["id"] for d in mine}
        assert {i["decisionId"] for i in result["items"] if "decisionId" in i} <= known, case

    def expect_listGuardrails(
        self, case: Case, _: Model, answer: dict[str, Any], __: Any, before: Snapshot, *___: Any
    ) -> None:
        self.crossing(case, before, case.params.get("scope"))
        result = dict(answer["result"])
        assert result.pop("agent") == case.agent
        assert result == self.baseline[json.dumps(case.params, sort_keys=True)], case

    def expect_discover(self, case: Case, _: Model, answer: dict[str, Any], *__: Any) -> None:
        assert answer["result"] == self.baseline["discover"]

    # ---- approvals

    def expect_getApproval(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        _: Any,
    ) -> None:
        self.crossing(case, before, case.params["id"])
        if reference is not None:
            return self.as_unknown(case, answer, reference)
        now = datetime.now(UTC)
        assert answer["result"] == {"approval": model.shown(case.params["id"], now)}, case
        return None

    def expect_listApprovals(
        self, case: Case, model: Model, answer: dict[str, Any], _: Any, before: Snapshot, *__: Any
    ) -> None:
        p = case.params
        now = datetime.now(UTC)
        if any(  # another workspace holds approvals this filter would list
            ws != case.me and p.get("status") in (None, Model.status(a, now))
            for ws in WORKSPACES
            for a in Model.of(before, ws).approvals.values()
        ):
            self.crossed[(case.method, case.face)] += 1
        want = model.approvals_listed(p.get("status"), now)
        offset, limit = p.get("offset", 0), p.get("limit", 20)
        result = answer["result"]
        assert result["total"] == len(want), (case, result["total"], len(want))
        got = [a["id"] for a in result["approvals"]]
        assert got == want[offset : offset + limit], (case, got, want)
        assert result["approvals"] == [model.shown(i, now) for i in got], case

    def expect_decideApproval(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        after: Snapshot,
    ) -> None:
        p = case.params
        self.crossing(case, before, p["id"], p.get("reason"))
        written = after.added(before, "approval_decisions")
        if reference is not None:
            assert written == [], (case, written)
            return self.as_unknown(case, answer, reference)
        a = model.approvals[p["id"]]
        status = Model.status(a, datetime.now(UTC))
        if a["requested_by"] == case.agent:  # four eyes
            assert answer["error"]["code"] == FORBIDDEN and written == [], (case, answer)
            return None
        if status != "pending":
            assert answer["error"]["code"] == CONFLICT, (case, answer)
            assert answer["error"]["data"] == {"id": p["id"], "status": status}, (case, answer)
            assert written == [], (case, written)
            return None
        [row] = written
        verdict = {"approve": "approved", "deny": "denied"}[p["verdict"]]
        assert (row["approval_id"], row["workspace"], row["verdict"]) == (p["id"], case.me, verdict)
        assert (row["decided_by"], row["reason"]) == (case.agent, p.get("reason")), row
        now = Model.of(after, case.me)
        assert answer["result"] == {"approval": now.shown(p["id"], datetime.now(UTC))}, case
        return None

    # ---- the methods that write

    def expect_checkGuardrails(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        after: Snapshot,
    ) -> None:
        p = case.params
        self.crossing(case, before, p["action"]["description"], p.get("approvalId"))
        added = {r["id"] for r in after.added(before, "guardrail_evaluations")}
        asked = after.added(before, "approvals")
        if reference is not None:  # an approval of another workspace, or agent, or none
            assert added == set() and asked == [], (case, added, asked)
            return self.as_unknown(case, answer, reference)
        a = p["action"]
        action = action_of(
            a["description"],
            a.get("category"),
            a.get("stakes"),
            a.get("confidence"),
            a.get("project"),
            a.get("context", {}),
        )
        existing = model.approvals.get(p["approvalId"]) if "approvalId" in p else None
        if escalates(action) and existing is not None and loaded(existing["action"]) != action:
            assert answer["error"]["code"] == CONFLICT, (case, answer)
            assert answer["error"]["data"] == {"approvalId": existing["id"]}, (case, answer)
            assert added == set() and asked == [], (case, added, asked)
            return None
        result = answer["result"]
        assert result["agent"] == case.agent
        assert added == {result["evaluationId"]}
        assert after.workspace_of("guardrail_evaluations")[result["evaluationId"]] == case.me
        if not escalates(action):
            assert "escalation" not in result and asked == [], (case, result, asked)
            assert result["allowed"] is not blocked(action), (case, result)
            return None
        if existing is not None:  # the caller's own approval: where it stands
            assert asked == [], (case, asked)
            status = Model.status(existing, datetime.now(UTC))
        else:
            [existing] = asked
            self.check_asked(case, existing, result["evaluationId"], action, None)
            status = "pending"
        assert result["escalation"] == Model.escalation(existing, status), (case, result)
        assert result["allowed"] is (status == "approved"), (case, result)
        return None

    def check_asked(
        self,
        case: Case,
        row: dict[str, Any],
        evaluation_id: str,
        action: dict[str, Any],
        cid: str | None,
    ) -> None:
        """A new approval: of the caller's workspace and agent, for this action, evaluation
        and correlationId, waiting a day."""
        source = case.method.split(".")[-1]
        assert (row["workspace"], row["requested_by"], row["source"]) == (
            case.me,
            case.agent,
            source,
        ), row
        assert (row["evaluation_id"], row["correlation_id"]) == (evaluation_id, cid), row
        assert loaded(row["action"]) == action and loaded(row["rules"]) == [MIGRATION_RULE]
        assert moment(row["expires_at"]) - moment(row["created_at"]) == timedelta(days=1)

    def expect_announceIntent(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        _: Any,
        before: Snapshot,
        after: Snapshot,
    ) -> None:
        p = case.params
        cid = p.get("correlationId")
        self.crossing(case, before, cid, p["intent"])
        stored = model.intents.get((case.agent, cid)) if cid is not None else None
        new_intents = after.added(before, "intents")
        asked = after.added(before, "approvals")
        if stored is not None:
            same = all(
                stored[column] == p.get(name)
                for name, column in (
                    ("intent", "intent"),
                    ("context", "context"),
                    ("category", "category"),
                    ("stakes", "stakes"),
                    ("confidence", "confidence"),
                )
            ) and loaded(stored["metadata"]) == p.get("metadata", {})
            if not same:  # this workspace's own announcement with that id was of another intent
                assert answer["error"]["code"] == CONFLICT, (case, answer)
                assert answer["error"]["data"] == {"correlationId": cid}
                assert asked == [], (case, asked)
                return
            if stored["outcome"] == "ok":  # a retry of this workspace's own: its stored answer
                assert answer["result"] == json.loads(stored["response"]), case
                assert new_intents == []
                assert asked == [], (case, asked)
                return
            # the same intent, escalated before: announced again, below
        action = action_of(
            p["intent"],
            p.get("category"),
            p.get("stakes", "medium"),
            p.get("confidence"),
            p.get("project"),
            p.get("metadata", {}),
        )
        if p.get("context") is not None:  # an announcement's text: shown to the approver
            action["statedContext"] = p["context"]
        # only this workspace's approval of this agent under the correlationId counts
        existing = model.asked(case.agent, cid) if cid is not None else None
        if escalates(action) and existing is not None and loaded(existing["action"]) != action:
            assert answer["error"]["code"] == CONFLICT, (case, answer)
            assert answer["error"]["data"] == {"approvalId": existing["id"]}, (case, answer)
            assert asked == [], (case, asked)
            return
        # a fresh announcement of this workspace, whatever another announced with that id
        result = answer["result"]
        if cid is not None:
            assert result["correlationId"] == cid
        status = self.escalated(case, model, result, action, existing, asked)
        outcome = "escalated" if status not in (None, "approved") else "ok"
        [row] = [r for r in new_intents if r["outcome"] == outcome]
        assert (row["workspace"], row["agent"], row["correlation_id"]) == (
            case.me,
            case.agent,
            result["correlationId"],
        )
        want = model.found({"category": p.get("category")})
        similar = [d["id"] for d in result["similarDecisions"]]
        assert set(similar) <= want, (case, set(similar) - want)
        assert len(similar) == min(5, len(want)), (case, similar, want)
        matched = [
            r["decision_id"] for r in after.rows["intent_matches"] if r["intent_id"] == row["id"]
        ]
        assert sorted(matched) == sorted(similar)
        outcome_of = {d["title"]: d.get("outcome") for d in result["similarDecisions"]}
        prefixes = {
            "Similar action succeeded: ": "success",
            "Warning: Similar action failed: ": "failure",
            "Similar action had issues: ": "partial",
        }
        for suggestion in result["suggestions"]:
            for prefix, outcome in prefixes.items():
                if suggestion.startswith(prefix):
                    title = suggestion[len(prefix) :]
                    assert outcome_of.get(title) == outcome, (case, suggestion, outcome_of)

    def escalated(
        self,
        case: Case,
        model: Model,
        result: dict[str, Any],
        action: dict[str, Any],
        existing: dict[str, Any] | None,
        asked: list[dict[str, Any]],
    ) -> str | None:
        """announceIntent's escalation, as the model predicts it: the status of the approval
        it names (None when it escalated not)."""
        verdict = result["guardrailStatus"]
        if not escalates(action):
            assert "escalation" not in verdict and asked == [], (case, verdict, asked)
            return None
        if existing is not None:  # asking again: where this workspace's approval stands
            assert asked == [], (case, asked)
            status = Model.status(existing, datetime.now(UTC))
        else:
            [existing] = asked
            cid = result["correlationId"]
            self.check_asked(case, existing, verdict["evaluationId"], action, cid)
            status = "pending"
        assert verdict["escalation"] == Model.escalation(existing, status), (case, verdict)
        assert verdict["allowed"] is (status == "approved") and verdict["violations"] == []
        return status

    def expect_recordDecision(
        self,
        case: Case,
        model: Model,
        answer: dict[str, Any],
        reference: Any,
        before: Snapshot,
        after: Snapshot,
    ) -> None:
        p = case.params
        cid = p.get("correlationId")
        self.crossing(case, before, cid, p["decision"])
        if reference is not None:  # a correlationId this agent never announced here
            assert answer == reference["answer"], (case, answer, reference)
            assert answer["error"]["code"] == -32602
            assert answer["error"]["data"]["field"] == "correlationId"
            return
        result = answer["result"]
        row = {r["id"]: r for r in after.rows["decisions"]}[result["id"]]
        assert row["workspace"] == case.me and row["recorded_by"] == case.agent
        if cid is not None:
            assert row["intent_id"] == model.intents[(case.agent, cid)]["id"]
        check_file(self.settings, result["path"], case.me, result["id"])


def check_file(settings: Settings, path: str, ws: str, decision_id: str) -> None:
    """The decision's YAML file: under ``decisions/<ws>/`` with a ``workspace:`` key, or
    for ``default`` where it always was, without one."""
    folder = "" if ws == DEFAULT_WORKSPACE else f"{ws}/"
    assert re.fullmatch(
        rf"decisions/{folder}\d{{4}}/\d{{2}}/\d{{4}}-\d{{2}}-\d{{2}}-decision-{decision_id}\.yaml",
        path,
    ), path
    content = yaml.safe_load((settings.decisions_dir / path.removeprefix("decisions/")).read_text())
    assert content["id"] == decision_id
    assert content.get("workspace") == (None if ws == DEFAULT_WORKSPACE else ws), content


# ---------------------------------------------------------------- what to call


def others(me: str) -> list[str]:
    return [ws for ws in WORKSPACES if ws != me]


def representative(
    world: World, face: str, method: str, me: str, them: str
) -> list[tuple[str, dict[str, Any]]]:
    """The most telling calls of ``method`` from ``me`` against ``them`` (agent, params):
    another workspace's decision and approval ids, its alice's correlationIds and texts sent
    by this workspace's alice (and approver, and auditor), and the calls that must succeed (a
    review by this workspace's reviewer, a decision linked to this workspace's
    ``cid-shared``, a decision of one of this workspace's pending approvals by its approver,
    a new approval asked in this workspace), so that every table is written."""
    their_alice = world.by_agent[(them, "alice")]
    their_bob = world.by_agent[(them, "bob")]
    shared, own_cid = (dict(a[1]) for a in world.announced[them][:2])  # verbatim
    their_mig_shared, their_mig_own = (dict(a[1]) for a in migrations(them)[:2])
    _, my_mig_bob, my_mig_approved = (dict(a[1]) for a in migrations(me)[1:])
    my_quick = hurried(me)
    my_quick_check = action_of(
        my_quick["intent"], None, "medium", 0.8, None, my_quick["metadata"]
    )  # the action bob's quick announcement asked for, as a check sends it
    m, t = MARK[them], TICKET[them]
    theirs = {kind: world.approval[(them, kind)] for ws, kind in world.approval if ws == them}
    mine = {kind: world.approval[(me, kind)] for ws, kind in world.approval if ws == me}
    _, their_check, _ = world.checks[them][0]
    _, my_check, _ = world.checks[me][0]
    # each (face, direction) decides a spare pending approval of its own
    spare = world.spare[me][2 * ("cstp", "mcp").index(face) + others(me).index(them)]
    calls: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "cstp.getDecision": [("alice", {"id": their_alice[0]}), ("rita", {"id": their_bob[-1]})],
        "cstp.reviewDecision": [
            ("alice", {"id": their_alice[0], "outcome": "failure", "lessons": f"By {me}"}),
            ("rita", {"id": their_bob[-1], "outcome": "abandoned"}),  # review:any, still not
            ("rita", {"id": world.by_agent[(me, "bob")][0], "outcome": "partial"}),  # its own
        ],
        "cstp.listDecisions": [
            ("alice", {"limit": 500, "agent": "alice", "correlationId": f"cid-{them}"}),
            ("bob", {"limit": 500, "search": m}),
        ],
        "cstp.queryDecisions": [
            (
                "alice",
                {
                    "query": f"Cache the {m} catalogue at the edge",
                    "limit": 50,
                    "retrievalMode": mode,
                    "filters": {"agent": "alice"},
                },
            )
            for mode in MODES
        ],
        "cstp.getCalibration": [
            ("alice", {"filters": {"agent": "alice", "minDecisions": 1}, "groupBy": "agent"})
        ],
        "cstp.listGuardrails": [("alice", {"scope": m})],
        "cstp.ready": [("alice", {}), ("rita", {"agent": "bob"}), ("alice", {"agent": "bob"})],
        "cstp.checkDrift": [("alice", {}), ("alice", {"agent": "alice", "minDecisions": 1})],
        "cstp.getSessionContext": [
            ("alice", {"format": "json", "task": f"Cache the {m} catalogue at the edge"}),
            ("bob", {"format": "json"}),
        ],
        "rpc.discover": [("alice", {})],
        "cstp.checkGuardrails": [
            ("alice", {"action": {"description": shared["intent"], "category": "process"}}),
            # their approved approval of the same action (its alice's): as none at all
            ("alice", {"action": their_check, "approvalId": theirs["checked"]}),
            ("alice", {"action": my_check, "approvalId": mine["checked"]}),  # its own
            ("bob", {"action": my_check, "approvalId": mine["checked"]}),  # alice's
            ("alice", {"action": migration_check(them, "ledger, part 0")}),  # asks anew
            ("bob", {"action": my_quick_check, "approvalId": mine["expired"]}),  # announced
        ],
        "cstp.announceIntent": [
            ("alice", shared),
            ("alice", own_cid),
            ("alice", their_mig_shared),  # -32008: this workspace's mig-shared, another action
            ("alice", their_mig_own),  # a cid no approval here has: asks anew
            ("alice", my_mig_approved),  # approved, then allowed: the stored answer
            ("bob", my_mig_bob),  # denied: evaluated again, still not allowed
            ("bob", my_quick),  # expired: the same, and no new approval
        ],
        "cstp.getApproval": [
            ("alice", {"id": theirs["own"]}),  # their alice's, asked by this one's namesake
            ("carol", {"id": theirs["denied"]}),
            ("audra", {"id": theirs["expired"]}),
            ("alice", {"id": mine["own"]}),
            ("bob", {"id": mine["pending"]}),  # alice's: as none at all
            ("carol", {"id": mine["denied"]}),
            ("audra", {"id": mine["expired"]}),
        ],
        "cstp.listApprovals": [
            ("carol", {"limit": 500}),
            ("audra", {"status": "pending", "limit": 500}),
            ("carol", {"status": "approved", "limit": 1, "offset": 1}),
            ("audra", {"status": "expired"}),
            ("alice", {}),  # -32010: neither approve nor audit
        ],
        "cstp.decideApproval": [
            ("carol", {"id": theirs["pending"], "verdict": "approve", "reason": f"By {me}"}),
            ("carol", {"id": theirs["checked"], "verdict": "deny"}),  # decided there
            ("carol", {"id": theirs["expired"], "verdict": "approve"}),
            ("alice", {"id": theirs["own"], "verdict": "approve"}),  # -32010: no approve
            ("carol", {"id": mine["denied"], "verdict": "approve"}),  # -32008: denied
            (
                "carol",
                {
                    "id": spare,
                    "verdict": ("approve", "deny")[face == "mcp"],
                    "reason": f"The {MARK[me]} window is agreed",
                },
            ),
        ],
        "cstp.recordDecision": [
            (
                "alice",
                {
                    "decision": f"Adopt the {m} rollout plan for {t}",
                    "confidence": 0.7,
                    "category": "process",
                    "correlationId": f"cid-{them}",
                },
            ),
            (
                "alice",  # this workspace's own cid-shared: linked to its own announcement
                {
                    "decision": f"Adopt the {m} rollout plan for {t}",
                    "confidence": 0.7,
                    "category": "process",
                    "correlationId": "cid-shared",
                    "tags": [m],
                    "reasons": [{"type": "analogy", "text": f"As {t} went"}],
                },
            ),
        ],
    }
    return calls[method]


def strategies(world: World) -> st.SearchStrategy[Case]:
    """A call: the face, the workspaces, the agent, the method and its params, most of them
    naming another workspace's values (some the caller's own, or ones nowhere, to compare)."""

    @st.composite
    def case(draw: st.DrawFn) -> Case:
        face = draw(st.sampled_from(("cstp", "mcp")))
        methods = METHODS if face == "cstp" else tuple(TOOL)
        method = draw(st.sampled_from(methods))
        me = draw(st.sampled_from(WORKSPACES))
        them = draw(st.sampled_from(others(me)))
        writes = method in ("cstp.announceIntent", "cstp.recordDecision", "cstp.checkGuardrails")
        agents = {"cstp.decideApproval": DECIDERS, "cstp.listApprovals": LISTERS}
        agent = draw(st.sampled_from(agents.get(method, WRITERS if writes else tuple(ROLE))))
        whose = draw(st.sampled_from((them, them, them, me)))  # mostly the other's values

        def some_id() -> str:
            return draw(
                st.one_of(
                    st.sampled_from(world.ids[whose]),
                    st.from_regex(r"[0-9a-f]{8}", fullmatch=True),  # (almost surely) nowhere
                )
            )

        def some_approval() -> str:
            return draw(
                st.one_of(
                    st.sampled_from(world.approvals[whose]),
                    st.uuids().map(str),  # (almost surely) nowhere
                )
            )

        def some_cid() -> str:
            return draw(
                st.one_of(
                    st.sampled_from(world.cids[whose]),
                    st.from_regex(r"fresh-[a-z0-9]{6}", fullmatch=True),
                )
            )

        def some_text() -> str:
            return draw(st.sampled_from(world.texts[whose]))

        def some_word() -> str:
            return draw(st.sampled_from(world.words[whose]))

        def maybe(name: str, value: Callable[[], Any]) -> dict[str, Any]:
            return {name: value()} if draw(st.booleans()) else {}

        category = st.sampled_from(CATEGORIES)
        p: dict[str, Any]
        if method == "cstp.getDecision":
            p = {"id": some_id()}
        elif method == "cstp.reviewDecision":
            p = {"id": some_id(), "outcome": draw(st.sampled_from(OUTCOMES))}
            p |= maybe("lessons", some_text)
        elif method == "cstp.listDecisions":
            p = {"limit": draw(st.sampled_from((1, 500)))}
            p |= maybe("agent", lambda: draw(st.sampled_from((*ROLE, "nobody"))))
            p |= maybe("correlationId", some_cid)
            p |= maybe("search", some_word)
            p |= maybe("category", lambda: draw(category))
            p |= maybe("status", lambda: draw(st.sampled_from(("pending", "reviewed"))))
            p |= maybe("tags", lambda: draw(st.lists(st.sampled_from(world.tags), max_size=2)))
        elif method == "cstp.queryDecisions":
            filters: dict[str, Any] = {}
            filters |= maybe("agent", lambda: draw(st.sampled_from(tuple(ROLE))))
            filters |= maybe("category", lambda: draw(category))
            filters |= maybe("hasOutcome", lambda: draw(st.booleans()))
            filters |= maybe("tags", lambda: [draw(st.sampled_from(world.tags))])
            p = {
                "query": some_text() if draw(st.booleans()) else some_word(),
                "limit": 50,
                "retrievalMode": draw(st.sampled_from(MODES)),
            }
            p |= {"filters": filters} if filters else {}
        elif method == "cstp.getCalibration":
            filters = {"minDecisions": draw(st.integers(1, 5))}
            filters |= maybe("agent", lambda: draw(st.sampled_from((*ROLE, "nobody"))))
            filters |= maybe("category", lambda: draw(category))
            p = {"filters": filters} if draw(st.booleans()) else dict(filters)  # or top level
            p |= maybe(
                "groupBy",
                lambda: draw(st.sampled_from(("agent", "category", "stakes", "confidenceBucket"))),
            )
        elif method == "cstp.listGuardrails":
            p = maybe("scope", lambda: draw(st.sampled_from(("payments", MARK[whose]))))
        elif method == "cstp.ready":
            p = maybe("agent", lambda: draw(st.sampled_from((*ROLE, "nobody"))))
            p |= maybe("limit", lambda: draw(st.integers(1, 50)))
        elif method == "cstp.getSessionContext":
            p = {"format": "json"}  # the decision ids it shows, to check
            p |= maybe("task", lambda: some_text() if draw(st.booleans()) else some_word())
            p |= maybe("maxTokens", lambda: draw(st.sampled_from((200, 1500, 8000))))
        elif method == "cstp.checkDrift":
            p = maybe("agent", lambda: draw(st.sampled_from((*ROLE, "nobody"))))
            p |= maybe("category", lambda: draw(category))
            p |= maybe("minDecisions", lambda: draw(st.integers(1, 3)))
        elif method == "rpc.discover":
            p = {}
        elif method == "cstp.checkGuardrails":
            if draw(st.booleans()):  # an action a check escalated, maybe with its approval
                _, action, approval_id = draw(st.sampled_from(world.checks[whose]))
                p = {"action": dict(action)}
                p |= maybe(
                    "approvalId", lambda: approval_id if draw(st.booleans()) else some_approval()
                )
            else:
                facts: dict[str, Any] = {"affects_production": draw(st.booleans())}
                facts |= maybe("migration", lambda: True)
                p = {
                    "action": {
                        "description": some_text(),
                        "category": draw(category),
                        "stakes": draw(st.sampled_from(STAKES)),
                        "confidence": draw(st.sampled_from((0.3, 0.9))),
                        "context": facts,
                    }
                }
                p |= maybe("approvalId", some_approval)
        elif method == "cstp.getApproval":
            p = {"id": some_approval()}
        elif method == "cstp.listApprovals":
            p = maybe("status", lambda: draw(st.sampled_from(APPROVAL_STATUSES)))
            p |= maybe("limit", lambda: draw(st.sampled_from((1, 2, 500))))
            p |= maybe("offset", lambda: draw(st.sampled_from((0, 1, 3))))
        elif method == "cstp.decideApproval":
            if draw(st.booleans()):  # pending unless decided by then; half of them its own
                approval = draw(st.sampled_from(world.waiting[draw(st.sampled_from((me, whose)))]))
            else:
                approval = some_approval()
            p = {"id": approval, "verdict": draw(st.sampled_from(("approve", "deny")))}
            p |= maybe("reason", some_text)
        elif method == "cstp.announceIntent":
            theirs = [a for a in world.announced[whose] if a[0] == agent]
            if theirs and draw(st.booleans()):
                p = dict(draw(st.sampled_from(theirs))[1])  # an announcement, verbatim
            else:
                p = {
                    "intent": some_text(),
                    "context": some_text(),
                    "category": draw(category),
                    "stakes": draw(st.sampled_from(STAKES)),
                    "confidence": draw(st.sampled_from((0.5, 0.8))),
                }
                p |= maybe("correlationId", some_cid)
                p |= maybe("metadata", lambda: {"migration": True})  # escalates
        else:
            assert method == "cstp.recordDecision"
            p = {
                "decision": some_text(),
                "confidence": draw(st.sampled_from((0.2, 0.6, 0.95))),
                "category": draw(category),
                "tags": [draw(st.sampled_from(world.tags))],
                "reasons": [{"type": "pattern", "text": some_text()}],
                "correlationId": some_cid(),
            }
        return Case(face, me, agent, method, p)

    return case()


# ---------------------------------------------------------------- running it


class Bridge:
    """Runs coroutines in the test's event loop from Hypothesis' worker thread."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(120)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError("no answer within 120 s") from None


def property_settings(examples: int) -> Any:
    return hyp_settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=examples,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    yield engine
    await engine.dispose()


async def drained(engine: AsyncEngine) -> None:
    """Wait until the outbox has nothing pending (the reviews' refreshes), so that the
    files are there and nothing changes in the background of a check."""
    for _ in range(600):
        async with engine.connect() as conn:
            pending = await conn.scalar(
                text("SELECT count(*) FROM outbox_events WHERE status <> 'done'")
            )
        if not pending:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{pending} outbox events still pending")


async def run_property(
    client: AppClient, engine: AsyncEngine, settings: Settings, examples: int
) -> Checker:
    world = await build_world(client)
    await drained(engine)
    failure: Exception | None = None
    async with AsyncExitStack() as stack:
        faces = Faces(client, stack)
        await faces.open_mcp()
        try:
            checker = await calls(faces, world, engine, settings, examples)
        except Exception as exc:
            # Raised once the sessions are closed: raised through their task groups, it
            # would come out nested in one exception group per session.
            failure = exc
    if failure is not None:
        raise failure
    return checker


async def calls(
    faces: Faces, world: World, engine: AsyncEngine, settings: Settings, examples: int
) -> Checker:
    reader = token("default", "rita")
    baseline: dict[str, Any] = {"discover": await faces.rpc.ok("rpc.discover", token=reader)}
    for params in ({}, {"scope": "payments"}, *({"scope": m} for m in MARK.values())):
        answer = await faces.rpc.ok("cstp.listGuardrails", params, token=reader)
        answer.pop("agent")
        baseline[json.dumps(params, sort_keys=True)] = answer
    checker = Checker(faces, engine, settings, baseline)

    # every method, on every face, in both directions between default and red, and from
    # blue into red (two workspaces that are not default); recordDecision first, while no
    # workspace has announced another's correlationIds of its own accord
    every = [(face, m) for face in ("cstp", "mcp") for m in METHODS if face == "cstp" or m in TOOL]
    every.sort(key=lambda pair: pair[1] != "cstp.recordDecision")
    for face, method in every:
        for me, them in (("red", "default"), ("default", "red"), ("blue", "red")):
            for agent, params in representative(world, face, method, me, them):
                await checker.check(Case(face, me, agent, method, params))

    bridge = Bridge()

    @property_settings(examples)
    @given(case=strategies(world))
    def chosen(case: Case) -> None:
        bridge.run(checker.check(case))

    await asyncio.wait_for(asyncio.to_thread(chosen), 900)
    await drained(engine)
    final = await snapshot(engine)
    await check_index(faces.client, final)
    check_files(settings, final)
    return checker


async def check_index(client: AppClient, snap: Snapshot) -> None:
    """Each workspace's vector collection holds its decisions and no other's: the search
    by meaning is filtered inside the index (SPEC.md section 7), not only afterwards."""
    index = client.app.state.services.index
    every = [r["id"] for r in snap.rows["decisions"]]
    for ws in WORKSPACES:
        own = {r["id"] for r in snap.of("decisions", ws)}
        held = set(await index.get_metadata(every, workspace=ws))
        assert held == own, (ws, "indexed here but of another workspace", held - own)
        assert await index.count(ws) == len(own), ws


def check_files(settings: Settings, snap: Snapshot) -> None:
    """Every decision's YAML file is in its workspace's folder (default's where they always
    were), and there is no other file."""
    owner = snap.workspace_of("decisions")
    files = sorted(settings.decisions_dir.rglob("*.yaml"))
    where = {}
    for path in files:
        parts = path.relative_to(settings.decisions_dir).parts
        ws = parts[0] if parts[0] in WORKSPACES else DEFAULT_WORKSPACE
        decision_id = path.stem.rsplit("-", 1)[-1]
        where[decision_id] = ws
        check_file(settings, "/".join(("decisions", *parts)), ws, decision_id)
    assert where == owner


def assert_covered(checker: Checker) -> None:
    """Every method and tool was called with another workspace's values, and every table
    was written (so the workspace of its new rows was checked)."""
    for method in METHODS:
        assert checker.crossed[(method, "cstp")] or method == "rpc.discover", method
        if method in TOOL:
            assert checker.crossed[(method, "mcp")], method
    missing = [table for table in TABLES if not checker.seen[table]]
    assert not missing, missing
    assert checker.answered["result"] and checker.answered["error"], checker.answered


async def test_nothing_crosses_a_workspace(
    client: AppClient, engine: AsyncEngine, settings: Settings
) -> None:
    """Every method and tool against another workspace's ids, correlationIds and texts:
    first the telling calls of each method, face and direction (273), then 60 calls
    chosen by Hypothesis."""
    checker = await run_property(client, engine, settings, examples=60)
    assert_covered(checker)


@pytest.mark.slow
async def test_nothing_crosses_a_workspace_at_length(
    client: AppClient, engine: AsyncEngine, settings: Settings
) -> None:
    """The same with 400 calls chosen by Hypothesis (a minute and a half)."""
    checker = await run_property(client, engine, settings, examples=400)
    assert_covered(checker)


# ---------------------------------------------------------------- rate limits


async def test_rate_limit_budgets_are_per_workspace(settings: Settings, embedder: Embedder) -> None:
    """alice of ``default`` spending her announce budget leaves alice of ``red`` hers: a
    budget is per workspace, agent and method (SPEC.md section 7), on both faces."""
    limits = parse_rate_limits("default=1000/60,cstp.announceIntent=2/600")
    app = create_app(settings.with_overrides(rate_limits=limits), embedder=embedder)
    async with serve_app(app) as client:
        for ws in ("default", "red"):
            add_token(client, token(ws, "alice"), "alice", "agent", workspace=ws)
        rpc = Rpc(client)

        def announce(n: int) -> dict[str, Any]:
            return {"intent": f"Warm the cache, step {n}", "correlationId": f"step-{n}"}

        for n in range(2):
            await rpc.ok("cstp.announceIntent", announce(n), token=token("default", "alice"))
        refused = await rpc.error(
            "cstp.announceIntent", announce(2), token=token("default", "alice")
        )
        assert refused["code"] == -32002 and refused["data"]["retryAfterMs"] > 0
        async with AsyncExitStack() as stack:
            faces = Faces(client, stack)
            for face in ("cstp", "mcp"):
                if face == "mcp":
                    await faces.open_mcp([("red", "alice")])
                answer = await faces.call(
                    face, "red", "alice", "cstp.announceIntent", announce(3 + (face == "mcp"))
                )
                assert "result" in answer, (face, answer)
            over = await faces.call("mcp", "red", "alice", "cstp.announceIntent", announce(9))
        assert over["error"]["code"] == -32002  # red's own budget, spent by its own calls
        engine = create_async_engine(settings.database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT workspace, outcome, count(*) AS n FROM intents "
                        "GROUP BY workspace, outcome ORDER BY workspace, outcome"
                    )
                )
                counted = {(r.workspace, r.outcome): r.n for r in rows}
        finally:
            await engine.dispose()
        assert counted == {
            ("default", "ok"): 2,
            ("default", "rate_limited"): 1,
            ("red", "ok"): 2,
            ("red", "rate_limited"): 1,
        }


# ---------------------------------------------------------------- defects pinned for the lead


async def test_keyword_scores_count_no_other_workspace(client: AppClient, rpc: Rpc) -> None:
    """red's answer to a query is the same whatever ``default`` holds: its scores count
    nothing of another workspace (else a score tells red which words default's decisions
    hold)."""
    red = add_token(client, token("red", "alice"), "alice", "agent", workspace="red")
    await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Cache the catalogue at the edge with Varnish",
            "confidence": 0.7,
            "category": "architecture",
        },
        token=red,
    )
    queries = [  # words of red's decision, and one only default's decisions will hold
        {"query": query, "retrievalMode": mode, "limit": 10}
        for query in ("Varnish catalogue", "Varnish nightly")
        for mode in ("keyword", "hybrid")
    ]

    async def answers() -> list[Any]:
        found = [await rpc.ok("cstp.queryDecisions", q, token=red) for q in queries]
        return [[(d["id"], d["score"]) for d in f["decisions"]] for f in found]

    alone = await answers()
    for n in range(5):  # default's own decisions, with one of the query's words
        await rpc.ok(
            "cstp.recordDecision",
            {
                "decision": f"Rebuild the catalogue nightly, run {n}",
                "confidence": 0.6,
                "category": "process",
            },
        )
    assert await answers() == alone


@pytest.mark.slow
async def test_a_busy_workspace_does_not_push_a_word_out_of_a_small_one(
    client: AppClient, rpc: Rpc
) -> None:
    """A word in more than 250 decisions is left out of keyword search (WORD_CAP): counted
    in the caller's workspace, so ``default``'s 251 decisions holding it leave red's one
    decision holding it findable by that word in red."""
    red = add_token(client, token("red", "alice"), "alice", "agent", workspace="red")
    mine = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Route zephyr traffic through the new gateway",
            "confidence": 0.7,
            "category": "architecture",
        },
        token=red,
    )
    query = {"query": "zephyr", "retrievalMode": "keyword"}
    found = await rpc.ok("cstp.queryDecisions", query, token=red)
    assert [d["id"] for d in found["decisions"]] == [mine["id"]]
    for start in range(0, 251, 50):
        batch = [
            {
                "jsonrpc": "2.0",
                "id": n,
                "method": "cstp.recordDecision",
                "params": {
                    "decision": f"Zephyr rollout wave {n}",
                    "confidence": 0.5,
                    "category": "process",
                },
            }
            for n in range(start, min(start + 50, 251))
        ]
        response = await rpc.raw(batch)
        assert all("result" in item for item in response.json())
    found = await rpc.ok("cstp.queryDecisions", query, token=red)
    assert [d["id"] for d in found["decisions"]] == [mine["id"]]


# ---------------------------------------------------------------- workspace ids


@pytest.mark.parametrize(
    "workspace",
    [
        "0",
        "a" * 63,  # the longest id
        "a--b",
        "20261",  # digits, but not a year: decisions/<YYYY>/ is default's (four digits are refused)
        "team-",  # a last "-": its collection name gets ".0"
    ],
)
async def test_every_workspace_id_the_pattern_allows_works(
    client: AppClient, rpc: Rpc, settings: Settings, workspace: str
) -> None:
    """A workspace at the edges of ``[a-z0-9][a-z0-9-]{0,62}`` records, is indexed and
    found, and exports to its own folder."""
    own = add_token(client, token(workspace, "alice"), "alice", "agent", workspace=workspace)
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {
            "decision": "Cache the catalogue at the edge",
            "confidence": 0.7,
            "category": "architecture",
        },
        token=own,
    )
    check_file(settings, recorded["path"], workspace, recorded["id"])
    for mode in MODES:
        found = await rpc.call(
            "cstp.queryDecisions", {"query": "edge cache", "retrievalMode": mode}, token=own
        )
        assert [d["id"] for d in found.get("result", {}).get("decisions", [])] == [
            recorded["id"]
        ], (mode, found)
    assert recorded["indexed"] is True
    listed = await rpc.ok("cstp.listDecisions", {}, token=own)
    assert [d["id"] for d in listed["decisions"]] == [recorded["id"]]
    assert (await rpc.ok("cstp.listDecisions", {}))["total"] == 0  # default sees none
