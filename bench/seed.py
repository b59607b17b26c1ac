"""Realistic, varied decision texts and the calls that put them into the server.

The corpus is generated from templates (actions x components x technologies x contexts) with a
seeded RNG, so two runs with the same ``--seed`` send the same texts. Texts have to be varied:
a corpus of near-duplicates would make the vector index and the filters look faster than they
are on a real decision journal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("architecture", "process", "integration", "tooling", "security")
STAKES = ("low", "medium", "high", "critical")
STAKES_WEIGHTS = (0.30, 0.45, 0.20, 0.05)
MENTAL_STATES = ("deliberate", "reactive", "exploratory", "habitual", "pressured")
OUTCOMES = ("success", "partial", "failure", "abandoned")
OUTCOME_WEIGHTS = (0.60, 0.20, 0.15, 0.05)

# (template, natural category); {c} component, {t} technology, {o} the technology it replaces.
ACTIONS: tuple[tuple[str, str], ...] = (
    ("Migrate {c} from {o} to {t}", "architecture"),
    ("Add a read-through cache in front of {c}", "architecture"),
    ("Split {c} into two independently deployed services", "architecture"),
    ("Shard the database behind {c} by tenant", "architecture"),
    ("Adopt {t} as the message transport for {c}", "architecture"),
    ("Make {c} stateless so it can scale horizontally", "architecture"),
    ("Replace polling with webhooks in {c}", "integration"),
    ("Add retries with exponential backoff to calls from {c}", "integration"),
    ("Switch {c} to the v2 API of the payment provider", "integration"),
    ("Introduce a circuit breaker between {c} and {t}", "integration"),
    ("Version the public contract of {c}", "integration"),
    ("Deprecate the legacy REST endpoints of {c}", "integration"),
    ("Deploy {c} to production behind a feature flag", "process"),
    ("Roll back the latest release of {c}", "process"),
    ("Require two approvals for changes to {c}", "process"),
    ("Move {c} to weekly release trains", "process"),
    ("Freeze schema changes in {c} until the audit ends", "process"),
    ("Run a canary for {c} before the full rollout", "process"),
    ("Pin every dependency version used by {c}", "tooling"),
    ("Replace the hand-written build of {c} with {t}", "tooling"),
    ("Add structured logging and trace ids to {c}", "tooling"),
    ("Generate the client library for {c} from its schema", "tooling"),
    ("Run the integration tests of {c} in parallel in CI", "tooling"),
    ("Adopt {t} for the local development setup of {c}", "tooling"),
    ("Rotate the credentials used by {c}", "security"),
    ("Enforce mutual TLS between {c} and its callers", "security"),
    ("Move the secrets of {c} into {t}", "security"),
    ("Add rate limiting per tenant to {c}", "security"),
    ("Drop personally identifiable data from the logs of {c}", "security"),
    ("Scope the service account of {c} to read-only access", "security"),
)

COMPONENTS = (
    "the authentication service",
    "the billing pipeline",
    "the search indexer",
    "the notification worker",
    "the user profile API",
    "the order management service",
    "the inventory sync job",
    "the reporting warehouse",
    "the mobile backend",
    "the admin dashboard",
    "the recommendation engine",
    "the audit log writer",
    "the image resizing service",
    "the webhook dispatcher",
    "the feature flag service",
    "the session store",
    "the email gateway",
    "the checkout flow",
    "the pricing engine",
    "the data export tool",
    "the onboarding wizard",
    "the metrics collector",
    "the document renderer",
    "the scheduler",
    "the shipping rates API",
    "the chat service",
    "the fraud scoring model",
    "the CDN configuration",
    "the tenant provisioning job",
    "the GraphQL gateway",
    "the backup job",
    "the identity provider bridge",
    "the invoice generator",
    "the geo lookup service",
    "the A/B testing service",
    "the customer support portal",
    "the event ingestion API",
    "the rate card importer",
    "the translation pipeline",
    "the vector search service",
)

TECHNOLOGIES = (
    "PostgreSQL",
    "Redis",
    "Kafka",
    "RabbitMQ",
    "gRPC",
    "SQLite",
    "Kubernetes",
    "Terraform",
    "Bazel",
    "Docker Compose",
    "Vault",
    "DynamoDB",
    "Elasticsearch",
    "NATS",
    "ClickHouse",
    "S3",
    "Celery",
    "Temporal",
    "Envoy",
    "OpenTelemetry",
    "Poetry",
    "uv",
    "MySQL",
    "MongoDB",
    "Memcached",
)

CONTEXTS = (
    "after two incidents last month",
    "because p99 latency doubled since the last release",
    "to unblock the Q3 roadmap",
    "PR #{n} approved, all tests passing, CI green",
    "the on-call team asked for it after a noisy week",
    "customers reported timeouts at peak",
    "the vendor ends support for the old version in {n} days",
    "cost of the current setup grew {n}% this quarter",
    "needed for the SOC 2 audit",
    "load tests show saturation at {n} requests per second",
    "a spike proved it works",
    "the team has little experience with the new stack",
    "agreed in the architecture review",
    "the security scan flagged it",
    "migration must finish before the holiday freeze",
    "error rate rose to {n} per thousand requests",
    "three teams depend on this interface",
    "the rollback plan was rehearsed in staging",
    "no owner for the old code any more",
    "requested by the largest customer",
    "keeps the data residency promise for EU tenants",
    "cuts deploy time from {n} minutes to a few",
    "the old library has a known CVE",
    "benchmarks on production traffic look good",
    "staging has been stable for {n} days",
    "we lost data once in a similar change",
    "alternative options were evaluated and rejected",
    "the change is easy to revert",
    "budget approved by engineering leadership",
    "the current design blocks multi-region deployment",
)

REASONS = {
    "analysis": (
        "Profiling shows {c} spends most of its time waiting on {t}",
        "A cost model favours this option over two years",
    ),
    "empirical": (
        "The prototype handled {n} requests per second without errors",
        "Two weeks of shadow traffic showed identical results",
    ),
    "pattern": (
        "The same change worked well for {c} last year",
        "This is the standard pattern for services of this size",
    ),
    "authority": (
        "The platform team recommends {t} for new work",
        "The vendor documentation recommends this setup",
    ),
    "analogy": (
        "Similar to how we moved {c} last quarter",
        "Other teams solved the same problem this way",
    ),
    "constraint": (
        "The current contract with the vendor ends soon",
        "Compliance requires it before the next audit",
    ),
    "elimination": (
        "The other two options need a rewrite of {c}",
        "Doing nothing keeps the incident rate where it is",
    ),
    "intuition": (
        "It feels like the simplest thing that could work",
        "The team is confident after the design review",
    ),
}

PROJECTS = ("atlas", "beacon", "comet", "delta", "ember", "falcon", "garnet", "harbor")
FEATURES = ("login", "payments", "search", "exports", "onboarding", "alerts", "billing", "sync")
TAGS = (
    "performance",
    "reliability",
    "cost",
    "security",
    "compliance",
    "developer-experience",
    "latency",
    "scalability",
    "migration",
    "tech-debt",
    "incident-follow-up",
    "database",
    "ci",
    "observability",
    "api",
    "frontend",
    "backend",
    "data",
    "infra",
    "customer-request",
    "experiment",
    "rollback",
    "release",
    "dependencies",
    "auth",
    "privacy",
    "caching",
    "queues",
    "testing",
    "docs",
)
KPIS = ("p99 latency", "error rate", "deploy frequency", "monthly cost", "MTTR", "throughput")
LESSONS = (
    "Rehearse the rollback before the change, not after",
    "The cache hid a data-consistency bug for a week",
    "Canary traffic was too small to surface the memory leak",
    "Communicating the freeze early avoided conflicts",
    "The new client library needed a connection pool limit",
    "Pinning versions made the build reproducible",
    "Load tests did not cover the batch jobs at midnight",
    "Two approvals slowed urgent fixes more than expected",
)
RESULTS = (
    "Latency dropped by a third",
    "Rolled back after an hour because of errors",
    "Works, but cost more than planned",
    "Finished on time with no incidents",
    "Partly done; the remaining services move next quarter",
    "Abandoned after the spike",
)


@dataclass
class Generator:
    """Deterministic stream of realistic params for every benchmarked method."""

    seed: int = 42
    rng: random.Random = field(init=False)
    _counter: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _fill(self, template: str) -> str:
        r = self.rng
        old, new = r.sample(TECHNOLOGIES, 2)
        return template.format(c=r.choice(COMPONENTS), t=new, o=old, n=r.randint(2, 400))

    def _action(self) -> tuple[str, str]:
        template, natural = self.rng.choice(ACTIONS)
        category = natural if self.rng.random() < 0.8 else self.rng.choice(CATEGORIES)
        return self._fill(template), category

    def _context(self) -> str:
        parts = self.rng.sample(CONTEXTS, self.rng.choice((1, 1, 2)))
        text = "; ".join(self._fill(p) for p in parts)
        return text[0].upper() + text[1:]

    def _stakes(self) -> str:
        return self.rng.choices(STAKES, STAKES_WEIGHTS)[0]

    def _confidence(self) -> float:
        return round(min(0.99, max(0.05, self.rng.gauss(0.72, 0.15))), 2)

    def _facts(self) -> dict[str, Any]:
        """Facts the shipped guardrail rules read; mostly compliant, some blocked or warned."""
        r = self.rng
        facts: dict[str, Any] = {"affects_production": r.random() < 0.4}
        facts["code_review"] = r.random() < 0.85
        if r.random() < 0.5:
            facts["staged_rollout"] = r.random() < 0.7
        if r.random() < 0.3:
            facts["security_review"] = r.random() < 0.6
        return facts

    def intent_sentence(self) -> str:
        """A typical one-sentence intent (what the floor's embedding is timed on)."""
        return self._action()[0]

    def record_params(self) -> dict[str, Any]:
        r = self.rng
        decision, category = self._action()
        reasons = []
        for rtype in r.sample(sorted(REASONS), r.randint(1, 3)):
            reasons.append(
                {
                    "type": rtype,
                    "text": self._fill(r.choice(REASONS[rtype])),
                    "strength": round(r.uniform(0.4, 1.0), 2),
                }
            )
        self._counter += 1
        params: dict[str, Any] = {
            "decision": decision,
            "confidence": self._confidence(),
            "category": category,
            "stakes": self._stakes(),
            "context": self._context(),
            "reasons": reasons,
            "tags": r.sample(TAGS, r.randint(1, 4)),
            "mentalState": r.choice(MENTAL_STATES),
            "project": r.choice(PROJECTS),
            "feature": r.choice(FEATURES),
        }
        if r.random() < 0.6:
            params["reviewIn"] = r.choice(("3d", "1w", "2w", "1m", "3m"))
        if r.random() < 0.4:
            params["kpiIndicators"] = r.sample(KPIS, r.randint(1, 2))
        if r.random() < 0.5:
            params["pr"] = r.randint(1, 5000)
        return params

    @staticmethod
    def document_of(params: dict[str, Any]) -> str:
        """The text the server indexes for a decision (decision, context, reason texts)."""
        parts = [params["decision"]]
        if params.get("context"):
            parts.append(params["context"])
        parts.extend(reason["text"] for reason in params.get("reasons", []))
        return "\n".join(parts)

    def review_params(self, decision_id: str) -> dict[str, Any]:
        r = self.rng
        params: dict[str, Any] = {
            "id": decision_id,
            "outcome": r.choices(OUTCOMES, OUTCOME_WEIGHTS)[0],
            "actualResult": r.choice(RESULTS),
        }
        if r.random() < 0.7:
            params["lessons"] = r.choice(LESSONS)
        if r.random() < 0.3:
            params["notes"] = self._context()
        return params

    def intent_params(self) -> dict[str, Any]:
        intent, category = self._action()
        return {
            "intent": intent,
            "context": self._context(),
            "category": category,
            "stakes": self._stakes(),
            "confidence": self._confidence(),
            "agent": {"id": "bench"},
            "metadata": self._facts(),
        }

    def query_params(self) -> dict[str, Any]:
        return {"query": self._action()[0], "limit": 5}

    def guardrail_params(self) -> dict[str, Any]:
        description, category = self._action()
        return {
            "action": {
                "description": description,
                "category": category,
                "stakes": self._stakes(),
                "confidence": self._confidence(),
                "context": self._facts(),
            }
        }


@dataclass
class SeedStats:
    """What seeding cost and how it went; errors are kept, never dropped."""

    requested: int = 0
    recorded: int = 0
    reviewed: int = 0
    record_errors: dict[str, int] = field(default_factory=dict)
    review_errors: dict[str, int] = field(default_factory=dict)
    not_indexed: int = 0
    record_seconds: float = 0.0
    review_seconds: float = 0.0
    settle_seconds: float = 0.0
    outbox_after: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "recorded": self.recorded,
            "reviewed": self.reviewed,
            "recordErrors": self.record_errors,
            "reviewErrors": self.review_errors,
            "notIndexedOnReturn": self.not_indexed,
            "recordSeconds": round(self.record_seconds, 2),
            "recordRatePerS": round(self.recorded / self.record_seconds, 1)
            if self.record_seconds
            else None,
            "reviewSeconds": round(self.review_seconds, 2),
            "outboxSettleSeconds": round(self.settle_seconds, 2),
            "outboxAfter": self.outbox_after,
        }


class Progress:
    """A throttled progress line on stderr (rewritten in place on a terminal)."""

    def __init__(self, label: str, total: int, write: Callable[[str, bool], None]) -> None:
        self.label, self.total, self._write = label, total, write
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, done: int, errors: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < 1.0:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        self._write(
            f"[{self.label}] {done}/{self.total} ({done / elapsed:.0f}/s, {errors} errors, "
            f"{elapsed:.0f} s)",
            final,
        )
