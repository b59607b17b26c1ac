"""The instruments the server updates as it works: calls, their durations, rate-limit
refusals, guardrail verdicts, and the result of the periodic chain verification.

One ``Metrics`` per app. Where its values live depends on how the process was started:

- ``cstp serve`` gives its processes a directory of their own (``PROMETHEUS_MULTIPROC_DIR``,
  app.observability.shared_dir) before any of them imports the library, which then keeps
  every value in a file per process; a scrape, answered by any one worker, reads and adds
  up the files of all of them (the library's multiprocess mode). The values outlive the
  worker that wrote them, so a counter never goes back when uvicorn replaces a worker.
- Anything else (the tests, an app built in-process) has a registry of its own per app, so
  two apps in one process never see each other's counts.

The call path costs a dictionary look-up and one or two increments per call: the labelled
children are made once and kept (``_counts``, ``_observe``), and nothing here does I/O but
the library's write of a value into its memory-mapped file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from .shared_dir import MULTIPROC_ENV

# Calls take from under a millisecond (a read) to a second or two (a search while the index
# is slow): buckets from a millisecond to two seconds, each about twice the last.
DURATION_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

RATE_LIMITED = "-32002"  # app.errors.RATE_LIMITED, as the ``code`` label writes it


class RuleOutcome(Protocol):
    """What the verdict counter reads of one rule's result in an evaluation
    (app.guardrails.evaluate.RuleCheck)."""

    @property
    def guardrail_id(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def fired(self) -> bool: ...
    @property
    def would(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


def multiprocess() -> bool:
    """The library keeps its values in per-process files: it was imported with
    ``PROMETHEUS_MULTIPROC_DIR`` set (it chooses once, at import)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


class Metrics:
    """The app's instruments (the call path's and the chain verification's)."""

    def __init__(self, methods: Iterable[str] = ()) -> None:
        self.shared_dir: Path | None = None
        self.registry: CollectorRegistry | None = None
        if multiprocess():
            self.shared_dir = Path(os.environ[MULTIPROC_ENV])
            registry = None  # the values are in the files; a scrape reads them all
        else:
            registry = self.registry = CollectorRegistry(auto_describe=True)
        self._registry = registry
        self._calls = Counter(
            "cstp_calls",
            "Calls run, by method, face (jsonrpc, mcp, console) and result code (ok, or the "
            "JSON-RPC error number)",
            ["method", "face", "code"],
            registry=registry,
        )
        self._durations = Histogram(
            "cstp_call_duration_seconds",
            "How long calls took, by method, from params to result or error",
            ["method"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._refusals = Counter(
            "cstp_rate_limit_refusals",
            "Calls refused by the rate limit (-32002), by method",
            ["method"],
            registry=registry,
        )
        self._verdicts = Counter(
            "cstp_guardrail_verdicts",
            "Rules that fired in a guardrail evaluation, by rule, mode (enforce, shadow) and "
            "verdict (block, warn, escalate); a shadow rule's is what it would have done",
            ["rule", "mode", "verdict"],
            registry=registry,
        )
        self._counts: dict[tuple[str, str, str], Callable[[], None]] = {}
        self._observe: dict[str, Callable[[float], None]] = {}
        self._fired: dict[tuple[str, str, str], Callable[[], None]] = {}
        for method in methods:  # every method's histogram from the start, at zero
            self._observe[method] = self._durations.labels(method).observe
        self._chain: tuple[Gauge, Gauge] | None = None

    def call(self, method: str, face: str, code: str, started: float) -> None:
        """A call of ``method`` ended with ``code`` (``ok`` or an error number); it began at
        ``started`` (``time.perf_counter()``)."""
        seconds = time.perf_counter() - started
        count = self._counts.get((method, face, code))
        if count is None:
            count = self._counts[method, face, code] = self._calls.labels(method, face, code).inc
        count()
        observe = self._observe.get(method)
        if observe is None:
            observe = self._observe[method] = self._durations.labels(method).observe
        observe(seconds)
        if code == RATE_LIMITED:
            self._refusals.labels(method).inc()

    def verdicts(self, results: Iterable[RuleOutcome]) -> None:
        """Count the rules of one evaluation that fired: an enforced rule that fired or
        could not be evaluated (it fails closed, counted as its action), a shadow rule that
        would have."""
        for check in results:
            if check.fired or check.would or check.error is not None:
                key = (check.guardrail_id, check.mode, check.severity)
                count = self._fired.get(key)
                if count is None:
                    count = self._fired[key] = self._verdicts.labels(*key).inc
                count()

    def chain_verified(self, problems: int, at: float) -> None:
        """A verification of the whole chain ended at ``at`` (Unix time) with ``problems``.
        The two gauges exist from the first one on: before it they are not exported at all,
        so an alert can tell "never verified" from "no problem"."""
        if self._chain is None:
            # With several processes, the most recent value of any of them is the answer.
            self._chain = (
                Gauge(
                    "cstp_audit_chain_problems",
                    "Problems the last verification of the whole audit chain found",
                    registry=self._registry,
                    multiprocess_mode="mostrecent",
                ),
                Gauge(
                    "cstp_audit_chain_verified_timestamp_seconds",
                    "When the last verification of the whole audit chain ended (Unix time)",
                    registry=self._registry,
                    multiprocess_mode="mostrecent",
                ),
            )
        self._chain[0].set(problems)
        self._chain[1].set(at)

    def collectors(self) -> Iterator[Collector]:
        """Where a scrape reads the instruments' values: every process's files, or this
        app's registry."""
        if self.shared_dir is not None:
            # The library leaves these two functions unannotated.
            yield MultiProcessCollector(None, str(self.shared_dir))  # type: ignore[no-untyped-call]
        else:
            assert self.registry is not None
            yield self.registry

    def process_ended(self) -> None:
        """This server process is stopping: the library's bookkeeping for a dead process
        (it drops the files of the gauges that count live processes only)."""
        if self.shared_dir is not None:
            mark_process_dead(os.getpid(), str(self.shared_dir))  # type: ignore[no-untyped-call]


class Families(Collector):
    """Metric families computed for one scrape, as a collector of the library's."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


class Scrape(Collector):
    """Everything one scrape exports: the instruments' values and the families computed for
    it (read from the database at scrape time)."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self._sources = list(sources)

    def collect(self) -> Iterable[Metric]:
        for source in self._sources:
            yield from source.collect()
