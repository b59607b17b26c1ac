"""Per-agent, per-method rate limits: a token bucket per (workspace, agent, method).

An agent's budget is its own in its workspace: an agent of the same name in another
workspace has a budget of its own. A budget ``count/seconds`` lets an agent make ``count``
calls at once and then one more each ``seconds / count``. The in-memory limiter serves one
process; the Redis limiter runs the same arithmetic inside one Lua script, so several server
processes share one budget atomically.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from app.config import RateLimit
from app.errors import rate_limited, unavailable

log = logging.getLogger("cstp.ratelimit")
# How long a client is told to wait when the shared store is unreachable or refuses writes:
# about as long as a Redis restart or failover takes, and the connect timeout below.
OUTAGE_RETRY_MS = 2000


class RateLimiter(Protocol):
    async def check(self, workspace: str, agent: str, method: str) -> None:
        """Take one token or raise RateLimited (-32002) with ``retryAfterMs``."""

    async def close(self) -> None: ...


def _budget(limits: Mapping[str, RateLimit], method: str) -> RateLimit:
    return limits.get(method) or limits["default"]


class MemoryRateLimiter:
    def __init__(
        self, limits: Mapping[str, RateLimit], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._buckets: dict[tuple[str, str, str], tuple[float, float]] = {}

    async def check(self, workspace: str, agent: str, method: str) -> None:
        budget = _budget(self.limits, method)
        rate = budget.count / budget.seconds
        now = self.clock()
        key = (method, workspace, agent)
        tokens, stamp = self._buckets.get(key, (float(budget.count), now))
        tokens = min(float(budget.count), tokens + (now - stamp) * rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            raise rate_limited(max(1, math.ceil((1.0 - tokens) / rate * 1000)))
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > 100_000:
            self._forget_full_buckets(now)

    def _forget_full_buckets(self, now: float) -> None:
        """Drop buckets that have refilled completely; they hold no information."""
        for key, (tokens, stamp) in list(self._buckets.items()):
            budget = _budget(self.limits, key[0])
            if tokens + (now - stamp) * budget.count / budget.seconds >= budget.count:
                del self._buckets[key]

    async def close(self) -> None:
        return None


# KEYS[1] = bucket key; ARGV = capacity, refill per ms, ttl ms. Returns 0 when allowed, else
# the number of ms until one token is back. Time comes from Redis so processes agree.
_LUA = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(state[1])
local stamp = tonumber(state[2])
if tokens == nil then tokens = capacity; stamp = now end
tokens = math.min(capacity, tokens + (now - stamp) * rate)
local wait = 0
if tokens < 1 then
  wait = math.ceil((1 - tokens) / rate)
  if wait < 1 then wait = 1 end
else
  tokens = tokens - 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], ttl)
return wait
"""


# What /ready says of the store (``checks.rateLimits``) when a call cannot use it.
UNREACHABLE = "unreachable"
REFUSES_WRITES = "refuses writes"
ANSWERS_WITH_ERRORS = "answers with errors"
# The budget /ready's probe runs the script with: its key expires two seconds after a probe.
_PROBE_BUDGET = RateLimit(1, 1.0)


def _phrase(problem: str) -> str:
    """The problem as a refused call's message and the log say it."""
    return "is unreachable" if problem == UNREACHABLE else problem


class RedisRateLimiter:
    def __init__(self, url: str, limits: Mapping[str, RateLimit], prefix: str = "cstp:rl") -> None:
        # Imported here, not at the top: redis.asyncio costs ~0.1 s at every start of the
        # server and of the commands, and only a deployment with CSTP_REDIS_URL uses it.
        import redis.asyncio as redis  # noqa: PLC0415 - imported lazily, see above

        self.limits = limits
        self.prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # A store that answers but will not write: a read-only replica (READONLY), maxmemory
        # reached under noeviction (OOM), failed snapshots that stop writes (MISCONF).
        self._refusals: tuple[type[BaseException], ...] = (
            redis.ReadOnlyError,
            redis.OutOfMemoryError,
        )
        self._response_error: type[BaseException] = redis.ResponseError
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._script = self._redis.register_script(_LUA)
        self._down: str | None = None  # the problem of an outage, logged when it starts and ends

    def _problem(self, exc: BaseException) -> str:
        """What a failed call to the store says about it, in the words of /ready."""
        if isinstance(exc, self._refusals):
            return REFUSES_WRITES
        if isinstance(exc, self._response_error):
            return REFUSES_WRITES if str(exc).startswith("MISCONF") else ANSWERS_WITH_ERRORS
        return UNREACHABLE  # refused or dropped connections, timeouts, a store still loading

    async def _take(self, key: str, budget: RateLimit) -> int:
        """Run the budget script on ``key``: 0 when a token was taken, else the ms to wait."""
        rate_per_ms = budget.count / (budget.seconds * 1000)
        ttl_ms = int(budget.seconds * 1000) + 1000
        return int(await self._script(keys=[key], args=[budget.count, rate_per_ms, ttl_ms]))

    async def check(self, workspace: str, agent: str, method: str) -> None:
        # a workspace id holds no ":", so the key names one (workspace, agent) whatever the
        # agent's name holds
        key = f"{self.prefix}:{method}:{workspace}:{agent}"
        try:
            wait = await self._take(key, _budget(self.limits, method))
        except self._errors as exc:
            problem = self._problem(exc)
            if self._down != problem:  # an outage starts, or what is wrong changes
                self._down = problem
                log.error(
                    "the rate-limit store (Redis) %s: %s; calls are refused with -32006 "
                    "until it takes budget updates again",
                    _phrase(problem),
                    type(exc).__name__,
                )
            raise unavailable("the rate-limit store", OUTAGE_RETRY_MS, _phrase(problem)) from None
        if self._down is not None:
            self._down = None
            log.warning("the rate-limit store (Redis) answers again")
        if wait > 0:
            raise rate_limited(wait)

    async def readiness(self) -> str:
        """``"ok"`` when the store takes what every call needs of it (the budget script,
        which writes, run on a probe key of its own that expires seconds later), else the
        problem: unreachable, refuses writes, or answers with errors. A PING is not enough:
        a read-only replica, or a store full under noeviction, answers it while every call
        is refused."""
        try:
            await self._take(f"{self.prefix}:ready-probe", _PROBE_BUDGET)
        except self._errors as exc:
            return self._problem(exc)
        return "ok"

    async def close(self) -> None:
        await self._redis.aclose()
