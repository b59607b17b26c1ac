"""Typed settings read from ``CSTP_*`` environment variables.

Settings are read when the app is built (``Settings.from_env()``), never at import time, so
tests can build several apps with different settings in one process.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_CATEGORIES = ("architecture", "process", "integration", "tooling", "security")
DEFAULT_RATE_LIMITS = "default=600/60,cstp.announceIntent=120/60"
DEFAULT_AGENT_NAME = "cognition-engines"
DEFAULT_PORT = 9991
RETRIEVAL_MODES = ("hybrid", "semantic", "keyword")


class ConfigError(Exception):
    """A setting is invalid; the message names the variable and says what is expected."""


@dataclass(frozen=True)
class RateLimit:
    count: int
    seconds: float


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path("./data")
    database_url: str = ""
    decisions_dir: Path = Path("./decisions")
    chroma_url: str | None = None
    redis_url: str | None = None
    auth_tokens: Mapping[str, str] = field(default_factory=dict)  # token -> agent id
    tokens_file: Path | None = None
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)
    guardrails_dir: Path | None = None
    agent_name: str = DEFAULT_AGENT_NAME
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    max_body_bytes: int = 1_048_576
    max_batch: int = 50
    # Failures of an unknown kind before an outbox event is dead; an unreachable dependency
    # never counts and an undeliverable decision is dead at once (app.outbox.failures).
    outbox_max_attempts: int = 8
    outbox_poll_seconds: float = 2.0
    relay_enabled: bool = True
    log_level: str = "INFO"
    # How ``cstp serve`` writes its log lines: one of LOG_FORMATS ("json": one JSON object per
    # line, app/observability/logs.py).
    log_format: str = "text"
    # How queryDecisions searches when a call does not say, and how announceIntent does
    # (app.search.service): one of RETRIEVAL_MODES.
    retrieval_mode: str = "hybrid"
    # Host header values /mcp accepts (DNS-rebinding protection of the MCP SDK); empty: this
    # machine's loopback names and CSTP_HOST, with any port. ("*",): any host.
    mcp_allowed_hosts: tuple[str, ...] = ()
    # The audit chain's HMAC key (CSTP_AUDIT_KEY or CSTP_AUDIT_KEY_FILE); None: a plain
    # SHA-256 chain. Never stored in the database, never shown (docs/AUDIT.md).
    audit_key: bytes | None = field(default=None, repr=False)
    # The key that seals webhook signing secrets in the database (CSTP_WEBHOOK_KEY, 32 bytes
    # given as base64); None: the key file in the data directory, made on first use
    # (app/webhooks/secrets.py). Never stored in the database, never shown.
    webhook_key: bytes | None = field(default=None, repr=False)
    # How often a server process verifies the whole audit chain for the metrics
    # (``cstp_audit_chain_problems``; app.system.chain_verification), in seconds; 0: never. Each
    # verification reads every entry and audited row, on a thread of its own.
    audit_verify_seconds: int = 0
    # Whether trace spans carry the callers' texts (an intent, a query, a decision): off,
    # a span names rows and verdicts only (CSTP_TRACE_CONTENT; app/observability/tracing.py).
    trace_content: bool = False

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        data_dir = Path(env.get("CSTP_DATA_DIR") or "./data")
        database_url = env.get("CSTP_DATABASE_URL") or ""
        if not database_url:
            database_url = f"sqlite+aiosqlite:///{(data_dir / 'cstp.db').absolute()}"
        elif not (
            database_url.startswith("sqlite+aiosqlite://")
            or database_url.startswith("postgresql+asyncpg://")
        ):
            raise ConfigError(
                "CSTP_DATABASE_URL must start with sqlite+aiosqlite:// or postgresql+asyncpg://"
            )
        tokens_file = env.get("CSTP_TOKENS_FILE")
        return cls(
            data_dir=data_dir,
            database_url=database_url,
            decisions_dir=Path(env.get("CSTP_DECISIONS_DIR") or "./decisions"),
            chroma_url=env.get("CSTP_CHROMA_URL") or None,
            redis_url=env.get("CSTP_REDIS_URL") or None,
            auth_tokens=parse_tokens(env.get("CSTP_AUTH_TOKENS"), "CSTP_AUTH_TOKENS"),
            tokens_file=Path(tokens_file) if tokens_file else None,
            rate_limits=parse_rate_limits(env.get("CSTP_RATE_LIMITS") or DEFAULT_RATE_LIMITS),
            guardrails_dir=_opt_path(env.get("CSTP_GUARDRAILS_DIR")),
            agent_name=env.get("CSTP_AGENT_NAME") or DEFAULT_AGENT_NAME,
            host=env.get("CSTP_HOST") or "127.0.0.1",
            port=_int(env, "CSTP_PORT", DEFAULT_PORT, 1, 65535),
            categories=_categories(env.get("CSTP_CATEGORIES")),
            max_body_bytes=_int(env, "CSTP_MAX_BODY_BYTES", 1_048_576, 1024, 1 << 30),
            max_batch=_int(env, "CSTP_MAX_BATCH", 50, 1, 10_000),
            outbox_max_attempts=_int(env, "CSTP_OUTBOX_MAX_ATTEMPTS", 8, 1, 1000),
            log_level=_log_level(env.get("CSTP_LOG_LEVEL")),
            log_format=_log_format(env.get("CSTP_LOG_FORMAT")),
            retrieval_mode=_retrieval_mode(env.get("CSTP_RETRIEVAL_MODE")),
            mcp_allowed_hosts=_hosts(env.get("CSTP_MCP_ALLOWED_HOSTS")),
            audit_key=audit_key_from_env(env),
            webhook_key=webhook_key_from_env(env),
            audit_verify_seconds=_interval(env, "CSTP_AUDIT_VERIFY_INTERVAL", MIN_VERIFY_SECONDS),
            trace_content=_bool(env, "CSTP_TRACE_CONTENT", False),
        )


MIN_AUDIT_KEY_BYTES = 16


def audit_key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The audit key: ``CSTP_AUDIT_KEY``'s text, or the content of the file
    ``CSTP_AUDIT_KEY_FILE`` names, as UTF-8 bytes with surrounding whitespace removed (so a
    file written by ``openssl rand -hex 32 > key`` works). None when neither is set. Read by
    the server and the ``cstp audit`` commands, and by the migration that builds the chain."""
    env = os.environ if env is None else env
    text, file = env.get("CSTP_AUDIT_KEY") or "", env.get("CSTP_AUDIT_KEY_FILE") or ""
    if text and file:
        raise ConfigError("set CSTP_AUDIT_KEY or CSTP_AUDIT_KEY_FILE, not both")
    source = "CSTP_AUDIT_KEY"
    if file:
        source = f"CSTP_AUDIT_KEY_FILE ({file})"
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "unreadable"
            raise ConfigError(f"{source}: cannot read the audit key: {reason}") from None
    if not text and not file:
        return None
    key = text.strip().encode("utf-8")
    if len(key) < MIN_AUDIT_KEY_BYTES:
        raise ConfigError(
            f"{source}: the audit key must be at least {MIN_AUDIT_KEY_BYTES} bytes "
            "(e.g. `openssl rand -hex 32`)"
        )
    return key


WEBHOOK_KEY_BYTES = 32


def webhook_key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """``CSTP_WEBHOOK_KEY``: 32 random bytes written in base64 (``openssl rand -base64 32``;
    the URL-safe alphabet works too). The AES-256-GCM key that seals webhook signing secrets
    in the database; None when unset (app/webhooks/secrets.py then uses a key file)."""
    env = os.environ if env is None else env
    text = (env.get("CSTP_WEBHOOK_KEY") or "").strip()
    if not text:
        return None
    key = decode_webhook_key(text)
    if key is None:
        raise ConfigError(
            f"CSTP_WEBHOOK_KEY must be {WEBHOOK_KEY_BYTES} bytes written in base64 "
            "(e.g. `openssl rand -base64 32`)"
        )
    return key


def decode_webhook_key(text: str) -> bytes | None:
    """The key ``text`` (base64, standard or URL-safe alphabet) holds, or None when it is not
    base64 of exactly WEBHOOK_KEY_BYTES bytes."""
    text = text.strip()
    try:
        key = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except ValueError:
        return None
    return key if len(key) == WEBHOOK_KEY_BYTES else None


MIN_VERIFY_SECONDS = 60
MAX_INTERVAL_SECONDS = 366 * 86400
_INTERVAL = re.compile(r"^(\d+)([smhd]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _interval(env: Mapping[str, str], name: str, low: int) -> int:
    """A period written as a whole number with a unit (``90s``, ``15m``, ``6h``, ``1d``; no
    unit: seconds), in seconds; unset or ``0``: 0 (off). Below ``low`` seconds, or above a
    year, is refused."""
    raw = (env.get(name) or "").strip().lower()
    match = _INTERVAL.match(raw)
    if raw and match is None:
        raise ConfigError(f"{name} must be a period such as 6h, 30m or 1d (0: off), got {raw!r}")
    seconds = int(match.group(1)) * _SECONDS[match.group(2)] if match else 0
    if 0 < seconds < low or seconds > MAX_INTERVAL_SECONDS:
        raise ConfigError(
            f"{name} must be 0 (off) or between {low} seconds and 366 days, got {raw!r}"
        )
    return seconds


def _retrieval_mode(value: str | None) -> str:
    mode = (value or "hybrid").strip().lower()
    if mode not in RETRIEVAL_MODES:
        raise ConfigError(f"CSTP_RETRIEVAL_MODE must be one of {', '.join(RETRIEVAL_MODES)}")
    return mode


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: str | None) -> str:
    level = (value or "INFO").strip().upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"CSTP_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}")
    return level


LOG_FORMATS = ("text", "json")


def _log_format(value: str | None) -> str:
    log_format = (value or "").strip().lower() or "text"
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"CSTP_LOG_FORMAT must be text or json, got {value!r}")
    return log_format


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in TRUE + FALSE:
        raise ConfigError(f"{name} must be true or false, got {env[name]!r}")
    return raw in TRUE


def _opt_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _hosts(raw: str | None) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in (raw or "").split(",") if h.strip())
    bad = [h for h in hosts if any(c.isspace() or c in "/@" for c in h)]
    if bad:
        raise ConfigError(
            f"CSTP_MCP_ALLOWED_HOSTS: {bad[0]!r} is not a host (write cstp.example.com, "
            f"cstp.example.com:443, 10.0.0.5:* or *)"
        )
    return hosts


def _categories(raw: str | None) -> tuple[str, ...]:
    extra = [c.strip() for c in (raw or "").split(",") if c.strip()]
    return DEFAULT_CATEGORIES + tuple(c for c in extra if c not in DEFAULT_CATEGORIES)


def parse_tokens(raw: str | None, source: str) -> dict[str, str]:
    """Parse ``agent:token`` pairs (comma- or newline-separated) into token -> agent.

    A line that starts with ``#`` is a comment as a whole, commas included, so a revoked
    ``# mallory:abc, eve:def`` stays revoked. An empty token or agent is refused (a server
    must never accept an empty bearer token), and so is a token with a character outside
    printable ASCII, which no client could send in an Authorization header that matches.
    """
    tokens: dict[str, str] = {}
    if raw is None:
        return tokens
    items = [
        item
        for line in raw.splitlines()
        if not line.strip().startswith("#")
        for item in line.split(",")
    ]
    for index, item in enumerate(items, start=1):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        agent, sep, token = item.partition(":")
        agent, token = agent.strip(), token.strip()
        if not sep or not agent or not token:
            raise ConfigError(
                f"{source}: entry {index} must be 'agent:token' with a non-empty agent and token"
            )
        if not all(" " <= char <= "~" for char in token):
            raise ConfigError(
                f"{source}: the token of agent {agent!r} must be printable ASCII characters"
            )
        add_token(tokens, token, agent, source)
    if raw.strip() and not tokens:
        raise ConfigError(f"{source} is set but holds no 'agent:token' pair")
    return tokens


def add_token(tokens: dict[str, str], token: str, agent: str, source: str) -> None:
    """Add ``token`` -> ``agent``; a token already given to another agent stops start-up."""
    if token in tokens and tokens[token] != agent:
        raise ConfigError(f"{source}: the same token is given to two agents")
    tokens[token] = agent


_RATE = re.compile(r"^\s*([\w.*-]+)\s*=\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*$")


def parse_rate_limits(raw: str) -> dict[str, RateLimit]:
    """Parse ``default=600/60,cstp.announceIntent=120/60`` (count per seconds)."""
    limits: dict[str, RateLimit] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        match = _RATE.match(item)
        if not match:
            raise ConfigError(
                f"CSTP_RATE_LIMITS: {item.strip()!r} must look like 'method=count/seconds'"
            )
        name, count, seconds = match.group(1), int(match.group(2)), float(match.group(3))
        if count < 1 or seconds <= 0:
            raise ConfigError(f"CSTP_RATE_LIMITS: {name} needs a count >= 1 and seconds > 0")
        limits[name] = RateLimit(count, seconds)
    limits.setdefault("default", RateLimit(600, 60.0))
    return limits
