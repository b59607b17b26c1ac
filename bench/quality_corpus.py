"""A labelled corpus for the retrieval-quality benchmark (``python -m bench.quality``).

Decisions and queries are generated together from one seeded RNG, so every query's relevant
decisions are known by construction, by the generator's own decision keys (``d00042``); the
benchmark maps them to server ids once the corpus is recorded. Nothing here talks to a server.

What the corpus is made of:

- *frame decisions*: an action frame ("migrate {c} from {o} to {t}", 30 of them, each in
  several wordings) applied to a component and technologies, with one or two context clauses
  and typed reasons. Each frame, component and context clause also has paraphrases that are
  used only in queries, never in decision texts.
- *theme decisions*: decisions about one narrow topic ("redis timeout", "kafka lag", 30
  themes). A theme is defined by stems that all appear in its decisions' texts; every other
  decision is re-drawn until it matches no theme, so "the decisions about redis timeouts"
  is exactly the theme's decisions, lexically and by construction.
- *exact tokens*: ticket ids, error codes, file names and library versions, each inserted
  into one to three decisions' texts and nowhere else (no token is a substring of another).

Query kinds (``KINDS``):

- ``paraphrase``: a reworded description (action, component, technologies, one context
  clause) of one frame decision whose (frame, component, technologies) signature is unique in
  the corpus; it shares no run of 4 words with that decision's text. Relevant: that decision.
- ``exact_token``: a token, alone or with a word or two. Relevant: the decisions holding it.
- ``short_keyword``: 2-3 words naming a theme. Relevant: the theme's decisions.
- ``filtered``: a theme keyword query or a paraphrase of a frame signature (no context)
  plus filters (category, stakes, tags, project, status, dateAfter). Relevant: the theme's
  or the signature's decisions that satisfy the filters.

Held out: the frames and themes are split in two halves by the seed, and so are the tokens;
a query is ``tuning`` or ``heldout`` by the half its frame, theme or token is in, so a weight
tuned on the tuning queries is judged on texts it never saw.

``dateAfter`` cannot be known before recording (the server stamps creation times), so the
corpus is recorded in two phases: ``early`` decisions, then ``late`` ones; a filter
``{"dateAfter": LATE}`` means "late decisions only" and the benchmark replaces ``LATE`` with
a timestamp taken between the two phases.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.seed import (
    CATEGORIES,
    FEATURES,
    KPIS,
    LESSONS,
    MENTAL_STATES,
    OUTCOME_WEIGHTS,
    OUTCOMES,
    PROJECTS,
    REASONS,
    RESULTS,
    STAKES,
    STAKES_WEIGHTS,
    TAGS,
    TECHNOLOGIES,
)

KINDS = ("paraphrase", "exact_token", "short_keyword", "filtered")
SPLITS = ("tuning", "heldout")
#: Placeholder of a ``dateAfter`` filter: "recorded in the late phase".
LATE = "@late"
LATE_SHARE = 0.4  # the last 40 % of the decisions are recorded in the late phase
REVIEW_SHARE = 0.3
TOKEN_SHARE = 0.3  # share of decisions that carry an exact token
THEME_SHARE = 0.15
MIN_DECISIONS = 200
QUERY_SHARES = {"paraphrase": 0.30, "exact_token": 0.25, "short_keyword": 0.20, "filtered": 0.25}
NGRAM = 4  # a paraphrase shares no run of this many words with its decision


# ---------------------------------------------------------------- vocabulary


@dataclass(frozen=True)
class Frame:
    """An action; ``{c}`` component, ``{t}`` technology, ``{o}`` the one it replaces. Every
    wording and paraphrase of a frame uses the same placeholders."""

    key: str
    category: str
    wordings: tuple[str, ...]
    paraphrases: tuple[str, ...]
    techs: tuple[str, ...] = ()  # what ``{t}`` and ``{o}`` are drawn from

    @property
    def uses_tech(self) -> bool:
        return "{t}" in self.wordings[0]

    @property
    def uses_old(self) -> bool:
        return "{o}" in self.wordings[0]


# Technology pools, so that a frame names technologies that fit it ("cache ... in Redis",
# not "cache ... in Terraform"); from bench/seed.py's TECHNOLOGIES plus a few of our own.
STORES = (
    "PostgreSQL",
    "MySQL",
    "MongoDB",
    "DynamoDB",
    "SQLite",
    "ClickHouse",
    "Elasticsearch",
    "S3",
)
QUEUES = ("Kafka", "RabbitMQ", "NATS", "Celery", "Temporal", "gRPC")
CACHES = ("Redis", "Memcached", "DynamoDB Accelerator", "Varnish")
BUILD_TOOLS = ("Bazel", "Poetry", "uv", "Gradle", "Nix", "Pants")
DEV_TOOLS = ("Docker Compose", "Kubernetes", "Tilt", "Nix", "devcontainers", "uv")
SECRET_STORES = ("Vault", "AWS Secrets Manager", "SOPS", "1Password Connect", "Doppler")

FRAMES: tuple[Frame, ...] = (
    Frame(
        "migrate",
        "architecture",
        (
            "Migrate {c} from {o} to {t}",
            "Move {c} from {o} over to {t}",
            "Replace {o} with {t} as the backing store of {c}",
        ),
        (
            "switch {c} away from {o}, adopting {t} instead",
            "port {c} onto {t}, retiring {o}",
            "leave {o} behind and run {c} on {t}",
        ),
        STORES,
    ),
    Frame(
        "cache",
        "architecture",
        (
            "Add a read-through cache backed by {t} in front of {c}",
            "Cache the hot reads of {c} in {t}",
            "Put {t} in front of {c} as a cache",
        ),
        (
            "keep frequently requested data of {c} in {t} so lookups skip the slow path",
            "serve repeated lookups of {c} out of {t} memory",
            "memoize what {c} reads most often, stored in {t}",
        ),
        CACHES,
    ),
    Frame(
        "split",
        "architecture",
        (
            "Split {c} into two independently deployed services",
            "Break {c} apart into smaller services",
            "Carve {c} out of the monolith into its own service",
        ),
        (
            "decompose {c} so each half ships on its own",
            "divide {c} into separate deployables",
            "turn {c} into a couple of standalone microservices",
        ),
    ),
    Frame(
        "shard",
        "architecture",
        (
            "Shard the database behind {c} by tenant",
            "Partition the data of {c} per customer",
            "Give every tenant of {c} its own database shard",
        ),
        (
            "spread the storage of {c} across per-customer partitions",
            "horizontally divide the tables {c} uses by client",
            "store each customer's records for {c} in a separate shard",
        ),
    ),
    Frame(
        "transport",
        "architecture",
        (
            "Adopt {t} as the message transport for {c}",
            "Send the events of {c} through {t}",
            "Use {t} as the message bus between {c} and its consumers",
        ),
        (
            "route messages emitted by {c} over {t}",
            "let {t} carry the event traffic of {c}",
            "publish what {c} produces onto {t} queues",
        ),
        QUEUES,
    ),
    Frame(
        "stateless",
        "architecture",
        (
            "Make {c} stateless so it can scale horizontally",
            "Move the in-memory state of {c} out of the process",
            "Remove local session state from {c}",
        ),
        (
            "strip process-local state from {c} to allow adding more replicas",
            "get {c} to keep nothing in memory between requests so we can run more copies",
            "let {c} scale out by holding no state inside instances",
        ),
    ),
    Frame(
        "webhooks",
        "integration",
        (
            "Replace polling with webhooks in {c}",
            "Switch {c} from polling to push notifications via webhooks",
            "Stop polling the partner API from {c} and accept callbacks instead",
        ),
        (
            "have partners push events to {c} rather than it asking repeatedly",
            "let {c} receive callbacks instead of checking on a timer",
            "drop the periodic pull loop in {c} for inbound HTTP callbacks",
        ),
    ),
    Frame(
        "retries",
        "integration",
        (
            "Add retries with exponential backoff to calls from {c}",
            "Retry failed outbound requests of {c} with jittered backoff",
            "Wrap the outbound HTTP calls of {c} in a retry policy",
        ),
        (
            "make {c} try again after failures, waiting longer each attempt",
            "re-send calls {c} makes when they fail, with growing delays",
            "give {c} automatic re-attempts that back off over time",
        ),
    ),
    Frame(
        "payments-v2",
        "integration",
        (
            "Switch {c} to the v2 API of the payment provider",
            "Upgrade {c} to the payment provider's second API version",
            "Move {c} onto the new payments API before v1 is retired",
        ),
        (
            "point {c} at the newer version of the card processor's interface",
            "have {c} talk to the updated PSP endpoints",
            "adopt the latest payment gateway interface in {c}",
        ),
    ),
    Frame(
        "breaker",
        "integration",
        (
            "Introduce a circuit breaker between {c} and {t}",
            "Add a circuit breaker around the calls from {c} to {t}",
            "Trip a breaker in {c} when {t} keeps failing",
        ),
        (
            "stop {c} from hammering {t} when it is unhealthy by failing fast",
            "let {c} short-circuit requests to {t} during outages",
            "guard {c} against a struggling {t} with a fail-fast switch",
        ),
        STORES + QUEUES + CACHES + ("Vault", "S3", "Envoy"),
    ),
    Frame(
        "versioning",
        "integration",
        (
            "Version the public contract of {c}",
            "Introduce explicit API versions for {c}",
            "Put a version number on every public endpoint of {c}",
        ),
        (
            "give the external interface of {c} numbered releases so clients can pin one",
            "let consumers of {c} choose which interface revision they call",
            "tag the published schema of {c} with revisions",
        ),
    ),
    Frame(
        "deprecate-rest",
        "integration",
        (
            "Deprecate the legacy REST endpoints of {c}",
            "Retire the old REST API of {c}",
            "Announce the end of life of the v1 REST routes in {c}",
        ),
        (
            "phase out the outdated HTTP routes {c} still exposes",
            "sunset the original JSON interface of {c}",
            "stop supporting the first-generation endpoints of {c}",
        ),
    ),
    Frame(
        "dark-launch",
        "process",
        (
            "Deploy {c} to production behind a feature flag",
            "Ship {c} to production with the new path behind a toggle",
            "Release the rewrite of {c} dark, behind a flag",
        ),
        (
            "put {c} live but keep it switched off for users until we flip it",
            "launch {c} in prod gated by a toggle",
            "roll {c} out to the live environment hidden behind a switch",
        ),
    ),
    Frame(
        "rollback",
        "process",
        (
            "Roll back the latest release of {c}",
            "Revert {c} to the previous release",
            "Undo yesterday's deployment of {c}",
        ),
        (
            "return {c} to the build that ran before the last deploy",
            "go back to the prior version of {c}",
            "put the earlier build of {c} back into production",
        ),
    ),
    Frame(
        "approvals",
        "process",
        (
            "Require two approvals for changes to {c}",
            "Make every change to {c} need a second reviewer",
            "Add a mandatory second code review for {c}",
        ),
        (
            "demand sign-off from two people before anything merges into {c}",
            "enforce dual review on pull requests touching {c}",
            "no merge to {c} without a pair of approving reviewers",
        ),
    ),
    Frame(
        "release-train",
        "process",
        (
            "Move {c} to weekly release trains",
            "Ship {c} on a fixed weekly release schedule",
            "Bundle the changes of {c} into one release per week",
        ),
        (
            "release {c} once every seven days on a train",
            "put {c} on a seven-day shipping cadence",
            "batch the deploys of {c} into a single drop each week",
        ),
    ),
    Frame(
        "schema-freeze",
        "process",
        (
            "Freeze schema changes in {c} until the audit ends",
            "Allow no database migrations in {c} during the audit",
            "Stop altering the tables of {c} while auditors review them",
        ),
        (
            "block any table structure edits to {c} while the auditors are here",
            "pause DDL work on {c} for the duration of the compliance review",
            "hold off on modifying the data model of {c} until the inspection is over",
        ),
    ),
    Frame(
        "canary",
        "process",
        (
            "Run a canary for {c} before the full rollout",
            "Send a small slice of traffic to the new build of {c} first",
            "Canary the next release of {c} on five percent of traffic",
        ),
        (
            "try the new version of {c} on a few users before everyone gets it",
            "expose a fraction of requests to the updated {c} ahead of the general launch",
            "gradually ramp {c} starting with a tiny share of users",
        ),
    ),
    Frame(
        "pin-deps",
        "tooling",
        (
            "Pin every dependency version used by {c}",
            "Lock the dependency versions of {c}",
            "Stop floating versions in the requirements of {c}",
        ),
        (
            "fix exact package versions for {c} so builds repeat",
            "freeze the third-party library releases {c} relies on",
            "make {c} build against precisely specified package releases",
        ),
    ),
    Frame(
        "build-tool",
        "tooling",
        (
            "Replace the hand-written build of {c} with {t}",
            "Build {c} with {t} instead of the old shell scripts",
            "Move the build of {c} to {t}",
        ),
        (
            "drop the homemade build scripts of {c} in favour of {t}",
            "let {t} compile and package {c}",
            "adopt {t} to produce the artifacts of {c}",
        ),
        BUILD_TOOLS,
    ),
    Frame(
        "structured-logs",
        "tooling",
        (
            "Add structured logging and trace ids to {c}",
            "Emit JSON logs with trace ids from {c}",
            "Make {c} log in a structured format with correlation ids",
        ),
        (
            "give {c} machine-readable output that carries a request id",
            "make what {c} prints parseable and traceable across services",
            "attach tracing identifiers to every line {c} writes",
        ),
    ),
    Frame(
        "client-codegen",
        "tooling",
        (
            "Generate the client library for {c} from its schema",
            "Stop hand-writing the SDK of {c} and generate it",
            "Produce the client code of {c} from the OpenAPI spec",
        ),
        (
            "derive the SDK of {c} automatically from the interface definition",
            "let codegen build the callers' library for {c}",
            "create the consumer package of {c} with a generator rather than by hand",
        ),
    ),
    Frame(
        "parallel-tests",
        "tooling",
        (
            "Run the integration tests of {c} in parallel in CI",
            "Split the integration suite of {c} across several CI workers",
            "Parallelise the slow end-to-end tests of {c}",
        ),
        (
            "shard the test pipeline of {c} so suites execute concurrently",
            "speed up the pipeline of {c} by running test groups at the same time",
            "fan out the system tests of {c} over multiple build agents",
        ),
    ),
    Frame(
        "local-dev",
        "tooling",
        (
            "Adopt {t} for the local development setup of {c}",
            "Use {t} to run {c} on developer laptops",
            "Standardise the dev environment of {c} on {t}",
        ),
        (
            "let engineers spin up {c} on their machines through {t}",
            "make {t} the way people run {c} locally",
            "base the workstation setup for {c} on {t}",
        ),
        DEV_TOOLS,
    ),
    Frame(
        "rotate-credentials",
        "security",
        (
            "Rotate the credentials used by {c}",
            "Issue new keys for {c} and revoke the old ones",
            "Replace every password and API key of {c}",
        ),
        (
            "cycle the secrets {c} authenticates with",
            "renew the access keys belonging to {c} and invalidate the previous set",
            "swap out the login material {c} depends on",
        ),
    ),
    Frame(
        "mtls",
        "security",
        (
            "Enforce mutual TLS between {c} and its callers",
            "Require client certificates for every call to {c}",
            "Turn on mTLS for all traffic into {c}",
        ),
        (
            "make callers of {c} prove their identity with certs on both sides",
            "have {c} and its clients authenticate each other over encrypted links",
            "lock down {c} with two-way TLS",
        ),
    ),
    Frame(
        "secret-store",
        "security",
        (
            "Move the secrets of {c} into {t}",
            "Store the credentials of {c} in {t} instead of environment variables",
            "Keep the API keys of {c} in {t}",
        ),
        (
            "stop keeping the passwords of {c} in env files and load them from {t}",
            "have {c} fetch its sensitive config from {t}",
            "let {t} hold the keys {c} needs",
        ),
        SECRET_STORES,
    ),
    Frame(
        "tenant-rate-limit",
        "security",
        (
            "Add rate limiting per tenant to {c}",
            "Throttle each customer's requests to {c}",
            "Cap the request rate of every tenant hitting {c}",
        ),
        (
            "limit how many calls each client can make to {c}",
            "put per-customer quotas on the traffic into {c}",
            "stop a single tenant from flooding {c}",
        ),
    ),
    Frame(
        "pii-logs",
        "security",
        (
            "Drop personally identifiable data from the logs of {c}",
            "Scrub user emails and names out of the logs of {c}",
            "Mask personal data before {c} writes it to logs",
        ),
        (
            "stop {c} from recording customer personal details in its output",
            "redact private user information in what {c} prints",
            "keep PII out of the diagnostic files of {c}",
        ),
    ),
    Frame(
        "read-only-account",
        "security",
        (
            "Scope the service account of {c} to read-only access",
            "Reduce the permissions of the service account of {c} to reads",
            "Take write access away from the service account of {c}",
        ),
        (
            "give the machine identity of {c} only the right to read",
            "restrict the robot user behind {c} so it cannot modify anything",
            "least-privilege the identity {c} runs as, no writes",
        ),
    ),
)


@dataclass(frozen=True)
class Component:
    name: str  # as decisions say it
    paraphrases: tuple[str, ...]  # as queries say it

    @property
    def keyword(self) -> str:
        return self.name.removeprefix("the ").split()[0]


COMPONENTS: tuple[Component, ...] = tuple(
    Component(n, p)
    for n, p in (
        ("the authentication service", ("the login backend", "our sign-in system")),
        ("the billing pipeline", ("the invoicing flow", "the charging jobs")),
        ("the search indexer", ("the job that builds search indexes", "the indexing worker")),
        ("the notification worker", ("the alerts sender", "the push and email dispatcher")),
        ("the user profile API", ("the account details endpoint", "the service holding profiles")),
        ("the order management service", ("the orders backend", "the system tracking purchases")),
        (
            "the inventory sync job",
            ("the stock synchronisation task", "the warehouse stock updater"),
        ),
        ("the reporting warehouse", ("the analytics data store", "the BI warehouse")),
        ("the mobile backend", ("the server side of our phone apps", "the API the iOS app calls")),
        ("the admin dashboard", ("the internal back-office UI", "the operator console")),
        ("the recommendation engine", ("the suggestions model service", "the product recommender")),
        (
            "the audit log writer",
            ("the component that records audit trails", "the compliance event recorder"),
        ),
        ("the image resizing service", ("the thumbnail generator", "the picture scaling service")),
        (
            "the webhook dispatcher",
            ("the outbound callback sender", "the component delivering HTTP callbacks"),
        ),
        ("the feature flag service", ("the toggle management system", "the toggles backend")),
        ("the session store", ("where login sessions are kept", "the user sessions cache")),
        ("the email gateway", ("the outbound mail relay", "the SMTP sender")),
        ("the checkout flow", ("the purchase funnel", "the cart payment steps")),
        ("the pricing engine", ("the price calculation service", "the component computing prices")),
        ("the data export tool", ("the CSV export feature", "the bulk download tool")),
        ("the onboarding wizard", ("the new user setup flow", "the signup walkthrough")),
        ("the metrics collector", ("the telemetry agent", "the stats scraper")),
        ("the document renderer", ("the PDF generator", "the service turning templates into PDFs")),
        ("the scheduler", ("the cron runner", "the job timing service")),
        ("the shipping rates API", ("the delivery cost endpoint", "the freight quote service")),
        ("the chat service", ("the messaging backend", "the live chat system")),
        ("the fraud scoring model", ("the risk model for payments", "the fraud detector")),
        ("the CDN configuration", ("the edge caching settings", "the content delivery setup")),
        (
            "the tenant provisioning job",
            ("the customer account creation task", "the workspace setup job"),
        ),
        ("the GraphQL gateway", ("the GraphQL edge API", "the unified query gateway")),
        ("the backup job", ("the nightly snapshot task", "the database dump job")),
        ("the identity provider bridge", ("the SSO connector", "the IdP integration")),
        ("the invoice generator", ("the service that produces bills", "the invoicing PDF job")),
        ("the geo lookup service", ("the IP location resolver", "the geolocation API")),
        ("the A/B testing service", ("the experimentation platform", "the split testing backend")),
        ("the customer support portal", ("the helpdesk site", "the support agents' tool")),
        (
            "the event ingestion API",
            ("the intake endpoint for events", "the tracking events collector"),
        ),
        ("the rate card importer", ("the tariff loader", "the job that loads price sheets")),
        ("the translation pipeline", ("the localisation workflow", "the i18n string pipeline")),
        (
            "the vector search service",
            ("the embeddings lookup service", "the semantic similarity backend"),
        ),
    )
)


@dataclass(frozen=True)
class Clause:
    """A context clause as decisions say it, and as queries say it; ``{n}`` a number."""

    text: str
    paraphrases: tuple[str, ...]


CONTEXTS: tuple[Clause, ...] = tuple(
    Clause(t, p)
    for t, p in (
        (
            "after two incidents last month",
            ("following a pair of outages a few weeks ago", "we were paged twice for it recently"),
        ),
        (
            "because p99 latency doubled since the last release",
            (
                "tail response times got twice as slow after the previous deploy",
                "the slowest requests take 2x longer once the newest version shipped",
            ),
        ),
        (
            "to unblock the Q3 roadmap",
            (
                "third-quarter plans depend on it",
                "it is blocking work planned for the summer quarter",
            ),
        ),
        (
            "PR #{n} approved, all tests passing, CI green",
            (
                "pull request {n} got sign-off and the pipeline passes",
                "code review is done for change {n} and builds succeed",
            ),
        ),
        (
            "the on-call team asked for it after a noisy week",
            (
                "the people carrying the pager wanted this after many alerts",
                "responders requested it following a week full of pages",
            ),
        ),
        (
            "customers reported timeouts at peak",
            (
                "users saw requests hanging during busy hours",
                "clients complained about slow calls at rush time",
            ),
        ),
        (
            "the vendor ends support for the old version in {n} days",
            (
                "the supplier stops maintaining the current release within {n} days",
                "our provider drops the legacy edition {n} days from now",
            ),
        ),
        (
            "cost of the current setup grew {n}% this quarter",
            (
                "spend on it went up {n} percent over the last three months",
                "the bill rose by {n} percent recently",
            ),
        ),
        (
            "needed for the SOC 2 audit",
            ("the compliance auditors require this", "a certification review demands it"),
        ),
        (
            "load tests show saturation at {n} requests per second",
            (
                "benchmarks max out around {n} calls a second",
                "under synthetic traffic it tops out near {n} rps",
            ),
        ),
        (
            "a spike proved it works",
            (
                "a short prototype showed the idea is feasible",
                "an experiment confirmed the approach",
            ),
        ),
        (
            "the team has little experience with the new stack",
            (
                "engineers are unfamiliar with the technology we are adopting",
                "nobody here has run these tools before",
            ),
        ),
        (
            "agreed in the architecture review",
            ("the design board signed off on it", "approved at the system design meeting"),
        ),
        (
            "the security scan flagged it",
            (
                "a vulnerability scanner raised an alert about it",
                "automated security checks reported a finding",
            ),
        ),
        (
            "migration must finish before the holiday freeze",
            (
                "this has to land before the end-of-year change embargo",
                "the work needs to be complete ahead of the December code lockdown",
            ),
        ),
        (
            "error rate rose to {n} per thousand requests",
            ("failures climbed to {n} in every 1000 calls", "{n} of each thousand calls now fail"),
        ),
        (
            "three teams depend on this interface",
            ("several groups consume this contract", "other squads rely on this API"),
        ),
        (
            "the rollback plan was rehearsed in staging",
            (
                "we practised reverting it in the pre-production environment",
                "undoing it was tested ahead of time on the test cluster",
            ),
        ),
        (
            "no owner for the old code any more",
            ("the legacy implementation is orphaned", "nobody maintains the previous codebase now"),
        ),
        (
            "requested by the largest customer",
            ("our biggest client asked for it", "the top account demanded this"),
        ),
        (
            "keeps the data residency promise for EU tenants",
            (
                "European customers' data must stay in the region",
                "it honours the commitment to keep EU records local",
            ),
        ),
        (
            "cuts deploy time from {n} minutes to a few",
            (
                "shipping takes a couple of minutes instead of {n}",
                "releases get much faster, down from {n} minutes",
            ),
        ),
        (
            "the old library has a known CVE",
            (
                "the previous dependency has a published vulnerability",
                "a security advisory exists for the package we use",
            ),
        ),
        (
            "benchmarks on production traffic look good",
            (
                "measurements with real user load are promising",
                "replayed live traffic shows solid numbers",
            ),
        ),
        (
            "staging has been stable for {n} days",
            (
                "the pre-prod environment ran without problems for {n} days",
                "no issues in the test environment over the past {n} days",
            ),
        ),
        (
            "we lost data once in a similar change",
            (
                "a comparable change previously caused data loss",
                "records went missing the last time we tried it",
            ),
        ),
        (
            "alternative options were evaluated and rejected",
            (
                "other approaches were considered and turned down",
                "we looked at the alternatives and ruled them out",
            ),
        ),
        ("the change is easy to revert", ("undoing it is simple", "it can be backed out quickly")),
        (
            "budget approved by engineering leadership",
            ("the engineering directors funded it", "management signed off on the spend"),
        ),
        (
            "the current design blocks multi-region deployment",
            (
                "today's architecture prevents running in several regions",
                "we cannot go multi-region with the present setup",
            ),
        ),
    )
)


@dataclass(frozen=True)
class Theme:
    """A narrow topic: every group of ``stems`` has one alternative in the text (lowercase
    substrings) of each of its decisions, and of no other decision."""

    key: str
    category: str
    stems: tuple[tuple[str, ...], ...]
    wordings: tuple[str, ...]  # ``{c}`` component
    queries: tuple[str, ...]  # 2-3 words each

    def matches(self, lowered: str) -> bool:
        return all(any(s in lowered for s in group) for group in self.stems)


THEMES: tuple[Theme, ...] = (
    Theme(
        "redis-timeout",
        "integration",
        (("redis",), ("timeout", "timed out", "time out")),
        (
            "Raise the Redis client timeout in {c} from 200 ms to 1 s",
            "Fall back to the database when Redis calls from {c} time out",
            "Cap every Redis command issued by {c} with a 250 ms timeout",
            "Stop {c} from retrying forever after Redis reads time out",
        ),
        ("redis timeout", "redis timeouts", "redis timing out"),
    ),
    Theme(
        "kafka-lag",
        "architecture",
        (("kafka",), ("lag",)),
        (
            "Add consumers to the Kafka group of {c} to work off the lag",
            "Alert when the Kafka consumer lag of {c} passes ten minutes",
            "Increase the partition count so {c} stops lagging behind on Kafka",
            "Move the slow handler out of {c} because its Kafka lag keeps growing",
        ),
        ("kafka consumer lag", "kafka lag", "kafka lag alert"),
    ),
    Theme(
        "postgres-vacuum",
        "tooling",
        (("postgres",), ("vacuum", "bloat")),
        (
            "Tune autovacuum on the Postgres tables of {c}",
            "Schedule a manual VACUUM for the largest Postgres table of {c}",
            "Rebuild the bloated Postgres indexes behind {c}",
            "Lower the Postgres autovacuum scale factor for {c} to fight table bloat",
        ),
        ("postgres vacuum", "postgres table bloat", "autovacuum tuning"),
    ),
    Theme(
        "certificate-expiry",
        "security",
        (("certificate",), ("expir",)),
        (
            "Automate renewal of the TLS certificate of {c} before it expires",
            "Alert 30 days before any certificate used by {c} expires",
            "Replace the expired certificate that broke {c}",
            "Track certificate expiry dates for {c} in monitoring",
        ),
        ("certificate expiry", "expired tls certificate", "cert expiration"),
    ),
    Theme(
        "flaky-tests",
        "tooling",
        (("flaky",),),
        (
            "Quarantine the flaky tests of {c}",
            "Retry flaky end-to-end tests of {c} once before failing the build",
            "Fix the flaky integration suite of {c} instead of rerunning it",
            "Track flaky tests of {c} on a dashboard and assign owners",
        ),
        ("flaky tests", "flaky ci tests", "quarantine flaky tests"),
    ),
    Theme(
        "image-size",
        "tooling",
        (("docker image", "container image"), ("size", "smaller", "slim")),
        (
            "Cut the Docker image size of {c} with a multi-stage build",
            "Base the container image of {c} on a slim distro",
            "Make the Docker image of {c} smaller by dropping build tools",
            "Set a size budget for the container image of {c}",
        ),
        ("docker image size", "smaller container images", "slim docker image"),
    ),
    Theme(
        "oauth-refresh",
        "security",
        (("oauth",), ("refresh",)),
        (
            "Refresh OAuth tokens of {c} in the background before they lapse",
            "Store the OAuth refresh tokens of {c} encrypted",
            "Shorten the OAuth refresh token lifetime for {c}",
            "Handle revoked OAuth refresh tokens gracefully in {c}",
        ),
        ("oauth token refresh", "oauth refresh tokens", "refresh token rotation"),
    ),
    Theme(
        "bucket-permissions",
        "security",
        (("bucket",), ("public", "permission", "policy", "acl")),
        (
            "Block public access on the S3 buckets of {c}",
            "Tighten the bucket policy used by {c} to named roles",
            "Audit the bucket permissions that {c} relies on",
            "Remove the public-read ACL from the export bucket of {c}",
        ),
        ("s3 bucket permissions", "public bucket", "bucket policy"),
    ),
    Theme(
        "flag-cleanup",
        "process",
        (("flag",), ("stale", "cleanup", "clean up", "remove old")),
        (
            "Clean up stale feature flags in {c}",
            "Remove old flags from {c} once they are fully rolled out",
            "Add a monthly flag cleanup for {c}",
            "Fail the build of {c} when a flag is stale for 90 days",
        ),
        ("feature flag cleanup", "stale feature flags", "remove old flags"),
    ),
    Theme(
        "on-call-rotation",
        "process",
        (("on-call",), ("rotation",)),
        (
            "Add {c} to the platform on-call rotation",
            "Give {c} its own on-call rotation",
            "Shorten the on-call rotation for {c} to one week",
            "Pair new engineers in the on-call rotation of {c}",
        ),
        ("on-call rotation", "oncall rotation", "pager rotation"),
    ),
    Theme(
        "dns",
        "integration",
        (("dns",),),
        (
            "Lower the DNS TTL for {c} to 60 seconds before the cutover",
            "Cache DNS lookups inside {c}",
            "Move {c} to the internal DNS resolver",
            "Fix intermittent DNS resolution failures in {c}",
        ),
        ("dns ttl", "dns resolution failures", "dns lookups"),
    ),
    Theme(
        "memory-leak",
        "architecture",
        (("memory leak", "leaks memory", "leaking memory"),),
        (
            "Restart {c} nightly until the memory leak is fixed",
            "Profile {c} to find the memory leak in the request handler",
            "Roll back the release of {c} that leaks memory",
            "Add heap alerts to {c} after it kept leaking memory",
        ),
        ("memory leak", "memory leak restart", "leaking memory"),
    ),
    Theme(
        "connection-pool",
        "architecture",
        (("connection pool",), ("exhaust", "maxed out", "saturat")),
        (
            "Raise the database connection pool of {c} after it was exhausted at peak",
            "Put PgBouncer in front of {c} because its connection pool kept getting exhausted",
            "Alert when the connection pool of {c} is saturated",
            "Release connections early in {c} so the connection pool is not maxed out",
        ),
        ("connection pool exhausted", "db pool exhaustion", "connection pool saturation"),
    ),
    Theme(
        "log-retention",
        "security",
        (("log",), ("retention",)),
        (
            "Cut log retention for {c} to 30 days",
            "Set a retention policy on the access logs of {c}",
            "Extend audit log retention of {c} to seven years",
            "Archive logs of {c} to cold storage after the retention window",
        ),
        ("log retention", "log retention policy", "log expiry days"),
    ),
    Theme(
        "backup-restore",
        "process",
        (("backup",), ("restor",)),
        (
            "Test restoring the backup of {c} every month",
            "Automate restore drills for the backups of {c}",
            "Keep a second backup copy of {c} in another region and test the restore",
            "Document the restore steps for the backup of {c}",
        ),
        ("backup restore", "restore drill", "backup restore test"),
    ),
    Theme(
        "gdpr-erasure",
        "security",
        (("gdpr", "erasure", "right to be forgotten"),),
        (
            "Handle GDPR deletion requests in {c} within 30 days",
            "Propagate erasure requests from {c} to downstream stores",
            "Add a right to be forgotten endpoint to {c}",
            "Record every GDPR erasure performed by {c}",
        ),
        ("gdpr deletion", "data erasure requests", "forget user data"),
    ),
    Theme(
        "tls-versions",
        "security",
        (("tls 1.",),),
        (
            "Disable TLS 1.0 and 1.1 on {c}",
            "Require TLS 1.2 or newer for clients of {c}",
            "Turn on TLS 1.3 for {c}",
            "Drop support for TLS 1.1 in {c}",
        ),
        ("tls versions", "disable old tls", "tls 1.3"),
    ),
    Theme(
        "password-hashing",
        "security",
        (("bcrypt", "argon2", "password hash"),),
        (
            "Switch password hashing in {c} from SHA-256 to bcrypt",
            "Move the stored password hashes of {c} to argon2",
            "Raise the bcrypt cost factor in {c}",
            "Rehash passwords in {c} with argon2 at next login",
        ),
        ("password hashing", "bcrypt argon2", "password hash algorithm"),
    ),
    Theme(
        "dead-letter",
        "integration",
        (("dead letter", "dead-letter"),),
        (
            "Send failed messages of {c} to a dead letter queue",
            "Replay the dead letter queue of {c} after the fix",
            "Alert when the dead-letter queue of {c} grows",
            "Add a dead letter topic for poison messages in {c}",
        ),
        ("dead letter queue", "dlq replay", "poison messages"),
    ),
    Theme(
        "disk-space",
        "tooling",
        (("disk",), ("full", "space", "usage")),
        (
            "Alert when disk usage on the hosts of {c} passes 80 percent",
            "Rotate local files on {c} because the disk ran full",
            "Move the temp files of {c} to a separate disk with more space",
            "Clean old artifacts off the build disk of {c} when it is nearly full",
        ),
        ("disk full", "disk space alerts", "disk usage"),
    ),
    Theme(
        "timezones",
        "architecture",
        (("timezone", "time zone", "daylight saving"),),
        (
            "Store all timestamps of {c} in UTC to avoid timezone bugs",
            "Fix the daylight saving bug in the reports of {c}",
            "Show dates in the user's time zone in {c}",
            "Pass the timezone explicitly to every query of {c}",
        ),
        ("timezone bug", "daylight saving time", "utc timestamps"),
    ),
    Theme(
        "cache-invalidation",
        "architecture",
        (("cache",), ("invalidat", "stale entr", "evict")),
        (
            "Invalidate the cache of {c} on every write",
            "Evict cache entries of {c} after five minutes",
            "Publish cache invalidation events from {c}",
            "Fix stale entries in the cache of {c} after price changes",
        ),
        ("cache invalidation", "stale cache entries", "cache eviction"),
    ),
    Theme(
        "codeowners",
        "process",
        (("codeowners", "code owner"),),
        (
            "Add a CODEOWNERS file for {c}",
            "Make the platform team code owners of {c}",
            "Require code owner approval for {c}",
            "Split the code owners of {c} by directory",
        ),
        ("codeowners file", "code owners", "code owner approval"),
    ),
    Theme(
        "dependency-bots",
        "tooling",
        (("dependabot", "renovate"),),
        (
            "Turn on Dependabot for {c}",
            "Group Renovate updates for {c} into one weekly PR",
            "Auto-merge Dependabot patch updates in {c}",
            "Replace Dependabot with Renovate in {c}",
        ),
        ("dependabot updates", "renovate bot", "automated dependency updates"),
    ),
    Theme(
        "cold-start",
        "architecture",
        (("cold start",),),
        (
            "Keep one warm instance of {c} to avoid cold starts",
            "Reduce the cold start time of {c} by lazy-loading modules",
            "Measure cold start latency of {c} after each deploy",
            "Move {c} off serverless because of cold start delays",
        ),
        ("cold start", "cold start latency", "warm instances"),
    ),
    Theme(
        "webhook-signatures",
        "security",
        (("webhook",), ("signature", "signing", "hmac")),
        (
            "Verify HMAC signatures on webhooks received by {c}",
            "Sign outgoing webhooks of {c} and publish the signing key",
            "Reject webhooks to {c} with an invalid signature",
            "Rotate the webhook signing secret of {c}",
        ),
        ("webhook signature", "hmac webhooks", "webhook signing"),
    ),
    Theme(
        "n-plus-one",
        "tooling",
        (("n+1",),),
        (
            "Fix the N+1 queries in the list endpoint of {c}",
            "Add an N+1 query detector to the tests of {c}",
            "Batch the lookups of {c} to remove an N+1 pattern",
            "Eager-load relations in {c} to stop N+1 selects",
        ),
        ("n+1 queries", "n+1 query", "orm n+1"),
    ),
    Theme(
        "app-store",
        "process",
        (("app store", "play store"),),
        (
            "Plan around App Store review delays for {c}",
            "Use phased Play Store rollouts for app changes touching {c}",
            "Keep a hotfix build for {c} ready for App Store review",
            "Release the mobile client of {c} to the Play Store first",
        ),
        ("app store review", "play store rollout", "app store release"),
    ),
    Theme(
        "saml",
        "security",
        (("saml",),),
        (
            "Support SAML single sign-on in {c}",
            "Move {c} from SAML to OIDC",
            "Validate SAML assertions in {c} with the new signing key",
            "Add SAML metadata reloading to {c}",
        ),
        ("saml sso", "saml login", "saml assertions"),
    ),
    Theme(
        "secret-scanning",
        "security",
        (("secret scanning", "leaked secret", "committed secret", "secrets scanning"),),
        (
            "Turn on secret scanning for the repository of {c}",
            "Rotate the leaked secret found in the history of {c}",
            "Block pushes to {c} with committed secrets",
            "Run secrets scanning in the CI of {c}",
        ),
        ("secret scanning", "leaked credentials", "secrets in git"),
    ),
)

# ---------------------------------------------------------------- exact tokens

TOKEN_TYPES = ("ticket", "error", "file", "version")
TICKET_PREFIXES = (
    "OPS",
    "PAY",
    "SEC",
    "INFRA",
    "PLAT",
    "DATA",
    "MOB",
    "WEB",
    "API",
    "BILL",
    "AUTH",
    "SRCH",
)
ERROR_NAMES = (
    "ERR_CONN_RESET",
    "ERR_TLS_HANDSHAKE",
    "ERR_QUOTA_EXCEEDED",
    "ERR_SCHEMA_MISMATCH",
    "ERR_UPSTREAM_GONE",
    "ERR_BAD_GATEWAY",
    "ERR_DISK_QUOTA",
    "ERR_RATE_LIMITED",
    "ERR_STALE_HANDLE",
    "ERR_INVALID_STATE",
    "ERR_NO_LEADER",
    "ERR_REPLICA_BEHIND",
    "ERR_PAYLOAD_TOO_LARGE",
    "ERR_DUPLICATE_KEY",
    "ECONNREFUSED",
    "ETIMEDOUT",
    "EPIPE",
    "ENOSPC",
    "SQLSTATE 40001",
    "SQLSTATE 53300",
    "ORA-00060",
)
HTTP_STATUSES = (
    "HTTP 401",
    "HTTP 403",
    "HTTP 409",
    "HTTP 413",
    "HTTP 429",
    "HTTP 500",
    "HTTP 502",
    "HTTP 503",
    "HTTP 504",
)
FILE_DIRS = (
    "billing",
    "auth",
    "search",
    "notify",
    "orders",
    "inventory",
    "reports",
    "config",
    "deploy",
    "infra",
    "api",
    "workers",
    "scripts",
    "payments",
    "mobile",
    "exports",
)
FILE_STEMS = (
    "invoice_worker",
    "retry_policy",
    "session_store",
    "rate_limiter",
    "webhook_client",
    "settings",
    "pool",
    "handlers",
    "consumer",
    "producer",
    "tasks",
    "models",
    "views",
    "redis",
    "kafka",
    "main",
    "values",
    "client",
    "schema_v2",
    "middleware",
    "routes",
    "jobs",
    "ledger",
    "sync",
    "exporter",
)
FILE_EXTS = (".py", ".py", ".py", ".yaml", ".go", ".ts", ".tf", ".sql", ".toml")
# (library, number of version parts, lowest and highest major version)
LIBRARIES = (
    ("psycopg", 3, 3, 3),
    ("redis-py", 3, 4, 5),
    ("Kubernetes", 2, 1, 1),
    ("SQLAlchemy", 3, 1, 2),
    ("urllib3", 3, 1, 2),
    ("OpenSSL", 3, 1, 3),
    ("Node.js", 3, 16, 22),
    ("Django", 3, 3, 5),
    ("grpcio", 3, 1, 1),
    ("boto3", 3, 1, 1),
    ("Terraform", 3, 1, 1),
    ("Python", 3, 3, 3),
    ("nginx", 3, 1, 1),
    ("Envoy", 3, 1, 1),
    ("Celery", 3, 4, 5),
    ("Spring Boot", 3, 2, 3),
    ("React", 3, 16, 19),
    ("httpx", 3, 0, 0),
    ("numpy", 3, 1, 2),
    ("PgBouncer", 3, 1, 1),
)
TOKEN_CLAUSES = {
    "ticket": (
        "tracked in {x}",
        "follow-up to {x}",
        "{x} has the details",
        "see {x} for the incident timeline",
    ),
    "error": (
        "the logs show {x} under load",
        "clients hit {x} on about {n}% of calls",
        "{x} keeps showing up on the error dashboard",
        "callers get {x} during deploys",
    ),
    "file": (
        "the change is mostly in {x}",
        "touches {x}",
        "{x} has to be rewritten for this",
        "the settings live in {x}",
    ),
    "version": (
        "requires {x} or newer",
        "pinned to {x} for now",
        "the fix ships in {x}",
        "tested with {x}",
    ),
}
TOKEN_QUERY_WORDS = ("fix", "issue", "decision", "incident", "change", "why")


def _version(rng: random.Random, lib: str, parts: int, low: int, high: int) -> str:
    numbers = [rng.randint(low, high), rng.randint(0, 40), rng.randint(0, 30)][:parts]
    return f"{lib} {'.'.join(str(n) for n in numbers)}"


def _new_token(rng: random.Random, kind: str) -> str:
    if kind == "ticket":
        return f"{rng.choice(TICKET_PREFIXES)}-{rng.randint(10, 9999)}"
    if kind == "error":
        roll = rng.random()
        if roll < 0.4:
            return f"E{rng.randint(1000, 9999)}"
        if roll < 0.55:
            return rng.choice(HTTP_STATUSES)
        return rng.choice(ERROR_NAMES)
    if kind == "file":
        return f"{rng.choice(FILE_DIRS)}/{rng.choice(FILE_STEMS)}{rng.choice(FILE_EXTS)}"
    return _version(rng, *rng.choice(LIBRARIES))


# ---------------------------------------------------------------- corpus types


@dataclass
class CorpusDecision:
    key: str
    params: dict[str, Any]  # cstp.recordDecision params
    phase: str  # "early" or "late"
    review: dict[str, Any] | None  # cstp.reviewDecision params without ``id``
    source: str  # "frame" or "theme"
    family: str  # frame key or theme key
    signature: tuple[str, ...]  # (frame, component, tech, old tech) of a frame decision
    tokens: tuple[str, ...] = ()
    contexts: tuple[tuple[int, int], ...] = ()  # (index into CONTEXTS, its {n})

    @property
    def text(self) -> str:
        """The decision's text, context and reasons: what the keyword index holds (the
        embedding sees the first two)."""
        return index_text_of(self.params)

    @property
    def status(self) -> str:
        return "reviewed" if self.review is not None else "pending"

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "phase": self.phase,
            "source": self.source,
            "family": self.family,
            "signature": list(self.signature),
            "tokens": list(self.tokens),
            "status": self.status,
            "params": self.params,
            "review": self.review,
        }


@dataclass
class LabelledQuery:
    id: str
    kind: str
    subkind: str
    split: str
    family: str
    text: str
    relevant: tuple[str, ...]  # decision keys
    filters: dict[str, Any] | None = None  # queryDecisions filters; ``LATE`` as dateAfter
    category: str | None = None  # paraphrase: the target's category (for announceIntent)
    token: str | None = None  # exact_token: the token

    def as_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "kind": self.kind,
            "subkind": self.subkind,
            "split": self.split,
            "family": self.family,
            "text": self.text,
            "relevant": list(self.relevant),
        }
        for name in ("filters", "category", "token"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass
class Corpus:
    seed: int
    decisions: list[CorpusDecision]
    queries: list[LabelledQuery]
    notes: list[str] = field(default_factory=list)

    def by_key(self) -> dict[str, CorpusDecision]:
        return {d.key: d for d in self.decisions}

    def fingerprint(self) -> str:
        """A short hash of every text, label and param: equal fingerprints, equal corpora."""
        payload = json.dumps(
            [[d.as_json() for d in self.decisions], [q.as_json() for q in self.queries]],
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        kinds = Counter((q.kind, q.split) for q in self.queries)
        return {
            "seed": self.seed,
            "fingerprint": self.fingerprint(),
            "decisions": len(self.decisions),
            "bySource": dict(Counter(d.source for d in self.decisions)),
            "byPhase": dict(Counter(d.phase for d in self.decisions)),
            "reviewed": sum(1 for d in self.decisions if d.review is not None),
            "withToken": sum(1 for d in self.decisions if d.tokens),
            "queries": len(self.queries),
            "queriesByKind": {k: {s: kinds[(k, s)] for s in SPLITS} for k in KINDS},
            "meanRelevant": {
                k: round(
                    sum(len(q.relevant) for q in self.queries if q.kind == k)
                    / max(1, sum(1 for q in self.queries if q.kind == k)),
                    2,
                )
                for k in KINDS
            },
            "notes": self.notes,
        }


# ---------------------------------------------------------------- text helpers


def index_text_of(params: dict[str, Any]) -> str:
    """The stripped decision, the context and the reason texts, one per line: the words the
    server indexes for a decision (its embedding sees the decision and the context only,
    app.records.entries.index_text). Themes and paraphrases are checked against all of
    it."""
    parts = [params["decision"].strip()]
    if params.get("context"):
        parts.append(params["context"])
    parts.extend(r["text"] for r in params.get("reasons", []))
    return "\n".join(parts)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def themes_in(text: str) -> set[str]:
    lowered = text.lower()
    return {t.key for t in THEMES if t.matches(lowered)}


def satisfies(d: CorpusDecision, filters: dict[str, Any] | None) -> bool:
    """Whether decision ``d`` satisfies queryDecisions ``filters`` (with ``LATE``)."""
    for name, value in (filters or {}).items():
        p = d.params
        if name == "category" and p["category"] != value:
            return False
        if name == "project" and p.get("project") != value:
            return False
        if name == "stakes" and p.get("stakes", "medium") not in (
            [value] if isinstance(value, str) else value
        ):
            return False
        if name == "tags" and not set(value) <= set(p.get("tags", ())):
            return False
        if name == "status" and d.status != value:
            return False
        if name == "dateAfter":
            if value != LATE:
                raise ValueError(f"unresolved dateAfter {value!r}")
            if d.phase != "late":
                return False
        if name not in ("category", "project", "stakes", "tags", "status", "dateAfter"):
            raise ValueError(f"unknown filter {name!r}")
    return True


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------- the generator


class _Builder:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)

    # ---- tokens

    def tokens(self, slots: int) -> list[tuple[str, str]]:
        """(token, type) for ``slots`` carriers: each token 1-3 times, no token a substring
        of another (case-insensitive)."""
        r = self.rng
        out: list[tuple[str, str]] = []
        seen: list[str] = []
        i = 0
        attempts = 0
        while len(out) < slots:
            attempts += 1
            if attempts > slots * 200:
                raise RuntimeError("could not draw enough distinct exact tokens")
            kind = TOKEN_TYPES[i % len(TOKEN_TYPES)]
            token = _new_token(r, kind)
            low = token.lower()
            if any(low in s or s in low for s in seen):
                continue
            seen.append(low)
            i += 1
            copies = r.choices((1, 2, 3), (0.6, 0.25, 0.15))[0]
            out.extend([(token, kind)] * min(copies, slots - len(out)))
        return out

    # ---- decisions

    def _clause(self, index: int, n: int) -> str:
        return CONTEXTS[index].text.format(n=n)

    def _reasons(self, component: str, tech: str) -> list[dict[str, Any]]:
        r = self.rng
        reasons = []
        for rtype in r.sample(sorted(REASONS), r.randint(1, 3)):
            text = r.choice(REASONS[rtype]).format(c=component, t=tech, n=r.randint(20, 900))
            reasons.append({"type": rtype, "text": text, "strength": round(r.uniform(0.4, 1.0), 2)})
        return reasons

    def _common(self, category: str) -> dict[str, Any]:
        r = self.rng
        params: dict[str, Any] = {
            "confidence": round(min(0.99, max(0.05, r.gauss(0.72, 0.15))), 2),
            "category": category,
            "stakes": r.choices(STAKES, STAKES_WEIGHTS)[0],
            "tags": r.sample(TAGS, r.randint(1, 4)),
            "mentalState": r.choice(MENTAL_STATES),
            "project": r.choice(PROJECTS),
            "feature": r.choice(FEATURES),
        }
        if r.random() < 0.5:
            params["reviewIn"] = r.choice(("3d", "1w", "2w", "1m", "3m"))
        if r.random() < 0.4:
            params["kpiIndicators"] = r.sample(KPIS, r.randint(1, 2))
        if r.random() < 0.5:
            params["pr"] = r.randint(1, 5000)
        return params

    def _insert_token(
        self, params: dict[str, Any], contexts: list[str], token: str, kind: str
    ) -> None:
        r = self.rng
        clause = r.choice(TOKEN_CLAUSES[kind]).format(x=token, n=r.randint(2, 40))
        where = r.random()
        if kind == "ticket" and where < 0.2:
            params["decision"] = f"{token}: {params['decision']}"
        elif where < 0.7 or not params["reasons"]:
            contexts.insert(r.randint(0, len(contexts)), clause)
        else:
            reason = r.choice(params["reasons"])
            reason["text"] = f"{reason['text']}; {clause}"

    def decision(
        self, key: str, slot: str, token: tuple[str, str] | None, phase: str
    ) -> CorpusDecision:
        """One decision for ``slot`` ("frame" or a theme key), re-drawn until its text
        matches exactly the themes it should (none, or its own)."""
        r = self.rng
        theme = next((t for t in THEMES if t.key == slot), None)
        signature: tuple[str, ...]
        for _ in range(500):
            component = r.choice(COMPONENTS)
            tech, old = r.sample(TECHNOLOGIES, 2)
            if theme is None:
                frame = r.choice(FRAMES)
                if frame.techs:
                    tech, old = r.sample(frame.techs, 2)
                natural, family = frame.category, frame.key
                wording = r.choice(frame.wordings).format(c=component.name, t=tech, o=old)
                signature = (
                    frame.key,
                    component.name,
                    tech if frame.uses_tech else "",
                    old if frame.uses_old else "",
                )
                n_ctx = r.choice((1, 1, 2))
            else:
                natural, family = theme.category, theme.key
                wording = r.choice(theme.wordings).format(c=component.name)
                signature = (theme.key,)
                n_ctx = r.choice((0, 1, 1))
            prefix = r.choice(("", "", "", "", "We will ", "Going to "))
            decision = prefix + (wording[0].lower() + wording[1:] if prefix else wording)
            category = natural if r.random() < 0.8 else r.choice(CATEGORIES)
            params = {"decision": decision, **self._common(category)}
            picked = tuple((i, r.randint(2, 400)) for i in r.sample(range(len(CONTEXTS)), n_ctx))
            contexts = [self._clause(i, n) for i, n in picked]
            params["reasons"] = self._reasons(component.name, tech)
            if token is not None:
                self._insert_token(params, contexts, *token)
            if contexts:
                joined = "; ".join(contexts)
                params["context"] = _cap(joined)
            # the key order of recordDecision params is irrelevant; keep it stable for hashing
            params = dict(sorted(params.items()))
            expected = set() if theme is None else {theme.key}
            if themes_in(index_text_of(params)) != expected:
                continue
            review = self.review() if r.random() < REVIEW_SHARE else None
            return CorpusDecision(
                key,
                params,
                phase,
                review,
                "frame" if theme is None else "theme",
                family,
                signature,
                (token[0],) if token else (),
                picked,
            )
        raise RuntimeError(f"could not draw a decision for {slot!r} matching its themes")

    def review(self) -> dict[str, Any]:
        r = self.rng
        review: dict[str, Any] = {
            "outcome": r.choices(OUTCOMES, OUTCOME_WEIGHTS)[0],
            "actualResult": r.choice(RESULTS),
        }
        if r.random() < 0.7:
            review["lessons"] = r.choice(LESSONS)
        return review

    # ---- queries

    def paraphrase(
        self, d: CorpusDecision, targets: Sequence[CorpusDecision], *, with_context: bool
    ) -> str | None:
        """A rewording of ``d``'s action (and one of its context clauses) sharing no run of
        ``NGRAM`` words with any of ``targets``' texts; None when none was found."""
        r = self.rng
        frame = next(f for f in FRAMES if f.key == d.signature[0])
        component = next(c for c in COMPONENTS if c.name == d.signature[1])
        banned: set[tuple[str, ...]] = set()
        for t in targets:
            banned |= ngrams(t.text)
        for _ in range(40):
            vp = r.choice(frame.paraphrases).format(
                c=r.choice(component.paraphrases), t=d.signature[2], o=d.signature[3]
            )
            if with_context and d.contexts:
                index, n = r.choice(d.contexts)
                ctx = r.choice(CONTEXTS[index].paraphrases).format(n=n)
                form = r.choice(
                    (
                        "{vp} — {ctx}",
                        "{Ctx}; the call was to {vp}",
                        "Decision to {vp}: {ctx}",
                        "We chose to {vp} ({ctx})",
                    )
                )
                text = form.format(vp=vp, ctx=ctx, Ctx=_cap(ctx))
            else:
                text = r.choice(("{vp}", "decision to {vp}", "we chose to {vp}")).format(vp=vp)
            text = _cap(text)
            if not ngrams(text) & banned:
                return text
        return None

    def filters_for(self, d: CorpusDecision) -> dict[str, Any]:
        """One or two filters that ``d`` satisfies."""
        r = self.rng
        p = d.params
        options: dict[str, Any] = {
            "category": p["category"],
            "project": p["project"],
            "stakes": (
                ["high", "critical"] if p["stakes"] in ("high", "critical") else p["stakes"]
            ),
            "tags": [r.choice(p["tags"])],
        }
        if d.phase == "late":
            options["dateAfter"] = LATE
        if d.review is not None:
            options["status"] = "reviewed"
        names = r.sample(sorted(options), 1 if r.random() < 0.6 else 2)
        return {name: options[name] for name in sorted(names)}


def _allocate(n_queries: int) -> dict[str, int]:
    counts = {k: int(n_queries * share) for k, share in QUERY_SHARES.items()}
    for k in KINDS[: n_queries - sum(counts.values())]:
        counts[k] += 1
    return counts


def generate(seed: int = 42, n_decisions: int = 2000, n_queries: int = 320) -> Corpus:
    """The corpus of ``n_decisions`` decisions and at least ``n_queries`` labelled queries."""
    if n_decisions < MIN_DECISIONS:
        raise ValueError(f"at least {MIN_DECISIONS} decisions are needed")
    if n_queries < len(KINDS):
        raise ValueError(f"at least {len(KINDS)} queries are needed")
    b = _Builder(seed)
    r = b.rng
    notes: list[str] = []

    # ---- decisions: theme slots and frame slots, shuffled; tokens on a share of them
    per_theme = max(2, round(THEME_SHARE * n_decisions / len(THEMES)))
    slots = [t.key for t in THEMES for _ in range(per_theme)]
    slots += ["frame"] * (n_decisions - len(slots))
    r.shuffle(slots)
    carried = b.tokens(round(TOKEN_SHARE * n_decisions))
    carriers = r.sample(range(n_decisions), len(carried))
    token_of = dict(zip(carriers, carried, strict=True))
    late_from = n_decisions - round(LATE_SHARE * n_decisions)
    decisions = [
        b.decision(f"d{i:05d}", slot, token_of.get(i), "late" if i >= late_from else "early")
        for i, slot in enumerate(slots)
    ]

    # ---- the tuning / held-out halves of frames, themes and tokens
    tuning_families: set[str] = set()
    for group in ([f.key for f in FRAMES], [t.key for t in THEMES]):
        r.shuffle(group)
        tuning_families.update(group[: len(group) // 2])
    tokens = sorted({tok for tok, _ in carried})
    r.shuffle(tokens)

    def split_of(family: str) -> str:
        return "tuning" if family in tuning_families else "heldout"

    frames = [d for d in decisions if d.source == "frame"]
    by_signature: dict[tuple[str, ...], list[CorpusDecision]] = defaultdict(list)
    for d in frames:
        by_signature[d.signature].append(d)
    members: dict[str, list[CorpusDecision]] = defaultdict(list)
    for d in decisions:
        if d.source == "theme":
            members[d.family].append(d)

    want = _allocate(n_queries)
    queries: list[LabelledQuery] = []

    def add(
        kind: str,
        subkind: str,
        family: str,
        split: str,
        text: str,
        relevant: Iterable[CorpusDecision],
        **extra: Any,
    ) -> None:
        queries.append(
            LabelledQuery(
                f"q{len(queries) + 1:04d}",
                kind,
                subkind,
                split,
                family,
                text,
                tuple(sorted(d.key for d in relevant)),
                **extra,
            )
        )

    # ---- paraphrase: decisions whose signature is unique, one query each
    unique = [d for d in frames if len(by_signature[d.signature]) == 1]
    r.shuffle(unique)
    made = 0
    for d in unique:
        if made == want["paraphrase"]:
            break
        text = b.paraphrase(d, [d], with_context=True)
        if text is None:
            continue
        add(
            "paraphrase",
            "frame+context",
            d.family,
            split_of(d.family),
            text,
            [d],
            category=d.params["category"],
        )
        made += 1
    short = want["paraphrase"] - made

    # ---- exact_token: balanced over the token types
    holders: dict[str, list[CorpusDecision]] = defaultdict(list)
    for d in decisions:
        for tok in d.tokens:
            holders[tok].append(d)
    kind_of = dict(carried)
    by_type = {k: [t for t in tokens if kind_of[t] == k] for k in TOKEN_TYPES}
    # every other token of each type is held out
    tuning_tokens = {t for group in by_type.values() for t in group[::2]}
    ordered = [t for group in zip(*by_type.values(), strict=False) for t in group]
    ordered += [t for t in tokens if t not in set(ordered)]
    n_exact = min(len(ordered), want["exact_token"] + max(0, short))
    for tok in ordered[:n_exact]:
        holder = holders[tok]
        roll = r.random()
        if roll < 0.5:
            text = tok
        elif roll < 0.75:
            text = f"{tok} {COMPONENTS_BY_NAME[_component_of(holder[0])].keyword}"
        else:
            word = r.choice(TOKEN_QUERY_WORDS)
            text = f"why {tok}" if word == "why" else f"{tok} {word}"
        add(
            "exact_token",
            kind_of[tok],
            tok,
            "tuning" if tok in tuning_tokens else "heldout",
            text,
            holder,
            token=tok,
        )
    short = want["paraphrase"] + want["exact_token"] - made - n_exact

    # ---- short_keyword: every (theme, phrasing) pair once, in a seeded order
    pairs = [(t, q) for t in THEMES for q in t.queries]
    r.shuffle(pairs)
    n_kw = min(len(pairs), want["short_keyword"])
    for theme, text in pairs[:n_kw]:
        add("short_keyword", "theme", theme.key, split_of(theme.key), text, members[theme.key])
    short += want["short_keyword"] - n_kw

    # ---- filtered: half keyword + filters, half paraphrase of a signature + filters
    n_filtered = want["filtered"] + max(0, short)
    attempts = 0
    while sum(1 for q in queries if q.kind == "filtered") < n_filtered:
        attempts += 1
        if attempts > n_filtered * 50:
            raise RuntimeError("could not draw enough filtered queries")
        if r.random() < 0.5:
            theme = r.choice(THEMES)
            anchor = r.choice(members[theme.key])
            filters = b.filters_for(anchor)
            relevant = [d for d in members[theme.key] if satisfies(d, filters)]
            add(
                "filtered",
                "keyword+filters",
                theme.key,
                split_of(theme.key),
                r.choice(theme.queries),
                relevant,
                filters=filters,
            )
        else:
            anchor = r.choice(frames)
            filters = b.filters_for(anchor)
            relevant = [d for d in by_signature[anchor.signature] if satisfies(d, filters)]
            text = b.paraphrase(anchor, relevant, with_context=False)
            if text is None:
                continue
            add(
                "filtered",
                "paraphrase+filters",
                anchor.family,
                split_of(anchor.family),
                text,
                relevant,
                filters=filters,
            )
    if short > 0:
        notes.append(f"{short} queries moved to other kinds (not enough distinct candidates)")
    return Corpus(seed, decisions, queries, notes)


COMPONENTS_BY_NAME = {c.name: c for c in COMPONENTS}


def _component_of(d: CorpusDecision) -> str:
    """The component a decision is about (frames carry it in the signature; theme decisions
    name one of them in the text)."""
    if d.source == "frame":
        return d.signature[1]
    text = d.params["decision"]
    return next((c.name for c in COMPONENTS if c.name in text), COMPONENTS[0].name)
