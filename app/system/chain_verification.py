"""The periodic verification of the whole audit chain (``CSTP_AUDIT_VERIFY_INTERVAL``), whose
result the metrics export: ``cstp_audit_chain_problems`` and
``cstp_audit_chain_verified_timestamp_seconds``.

A server process verifies at start, then once per interval, as ``cstp audit verify`` does
(app.audit.live: in a thread, on a snapshot of its own). The worker processes of one ``cstp
serve`` share the metrics directory: a lock file there lets one of them verify at a time,
and a file holds when the last verification ended, so the chain is read once per interval
whatever the number of workers, and a scrape answered by any of them shows the result (the
gauges keep the most recent value of any process). A verification that cannot run (the
database is down) is logged and tried again a minute later; the timestamp then grows old,
which is what an alert watches.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from app.audit import live
from app.config import Settings
from app.observability.metrics import Metrics
from app.observability.shared_dir import VERIFIED_FILE, VERIFY_LOCK_FILE

log = logging.getLogger("cstp.audit")

RETRY_SECONDS = 60.0  # after a verification that could not run, or ran in another process


class Schedule:
    """When the chain was last verified, and whose turn it is, for the processes that share
    ``folder`` (None: this process alone)."""

    def __init__(self, folder: Path | None) -> None:
        self._folder = folder
        self._last = 0.0
        self._held: int | None = None

    def last(self) -> float:
        """When the last verification ended (Unix time); 0: never."""
        if self._folder is None:
            return self._last
        try:
            return float((self._folder / VERIFIED_FILE).read_text(encoding="ascii"))
        except FileNotFoundError:
            return 0.0

    def done(self, at: float) -> None:
        self._last = at
        if self._folder is not None:
            # Replaced whole, so another process never reads half a number.
            part = self._folder / f"{VERIFIED_FILE}.{os.getpid()}"
            part.write_text(repr(at), encoding="ascii")
            part.replace(self._folder / VERIFIED_FILE)

    def take_turn(self) -> bool:
        """This process may verify now (no other one is verifying); ``end_turn`` after."""
        if self._folder is None:
            return True
        fd = os.open(self._folder / VERIFY_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held = fd
        return True

    def end_turn(self) -> None:
        if self._held is not None:
            fcntl.flock(self._held, fcntl.LOCK_UN)
            os.close(self._held)
            self._held = None


async def verify_periodically(
    settings: Settings, metrics: Metrics, now: Callable[[], datetime]
) -> None:
    """Verify the chain every ``settings.audit_verify_seconds`` (the first time at once),
    until cancelled."""
    interval = settings.audit_verify_seconds
    schedule = Schedule(metrics.shared_dir)
    while True:
        try:
            wait = schedule.last() + interval - now().timestamp()
            if wait <= 0 and not await verify_once(settings, metrics, schedule, now):
                wait = min(interval, RETRY_SECONDS)
        except Exception:  # the shared folder's files (verify_once logs its own failures)
            log.exception("the periodic verification of the audit chain could not be scheduled")
            wait = min(interval, RETRY_SECONDS)
        if wait > 0:
            await asyncio.sleep(wait)


async def verify_once(
    settings: Settings, metrics: Metrics, schedule: Schedule, now: Callable[[], datetime]
) -> bool:
    """Verify the chain unless another process is, or just did; False when it was not
    verified (another process is verifying, or the verification could not run)."""
    if not schedule.take_turn():
        return False
    try:
        if schedule.last() + settings.audit_verify_seconds > now().timestamp():
            return True  # another process did while this one waited for its turn
        try:
            report = await live.verify_chain(settings.database_url, settings.audit_key)
        except live.Busy:
            return False  # the console's "verify now" is running in this process
        except Exception:
            log.exception("the periodic verification of the audit chain could not run")
            return False
        at = now().timestamp()
        metrics.chain_verified(len(report.problems), at)
        schedule.done(at)
        if report.problems:
            log.warning(
                "the audit chain has %d problem(s): `cstp audit verify` names them",
                len(report.problems),
            )
        return True
    finally:
        schedule.end_turn()
