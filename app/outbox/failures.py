"""Why an outbox event failed and what becomes of it: the one place that decides.

Every failure is one of three kinds:

- ``transient``: a dependency could not be reached. The vector index (``IndexUnavailable``:
  Chroma down, stalled, restarting, closed), the file system (``OSError``: disk full, a
  read-only or unwritable directory), the database (connection lost, busy). Retried until it
  works, however long that takes; it never counts toward giving up and never makes an event
  dead. Nothing the event holds is wrong: the world around it is.
- ``permanent``: the event can never succeed as it is. Its document cannot be built from its
  decision row (``render`` of the YAML or the index entry raised: RecursionError for a value
  nested too deeply, a YAML error, ValueError, ...), the row is gone, or the kind is unknown.
  Building is a pure function of the row, so no retry can help until the row changes: the
  event is ``dead`` at once, with the reason in ``last_error``.
- ``unknown``: anything else (a bug, an error never seen before, MemoryError). Retried like
  a transient one, but these count: after ``CSTP_OUTBOX_MAX_ATTEMPTS`` of them the event is
  ``dead``, so an event that keeps failing in a way nobody foresaw is brought to an operator.

Retries back off exponentially, 1 s, 2 s, 4 s ... capped at ``MAX_BACKOFF`` (30 s), so a
dependency that comes back is used again within 30 s at worst; the relay also notices the
first success after a failure and takes the waiting events at once (``Relay._note``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import exc as sa_exc

from app.db.outbox import Status
from app.search.types import IndexUnavailable


class FailureKind(StrEnum):
    """The three kinds above; the value is what ``outbox_events.failure_kind`` holds."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"


MAX_BACKOFF = timedelta(seconds=30)
_DETAIL = 200  # characters of an exception's message kept in last_error


@dataclass(frozen=True)
class Failure:
    """The outcome of one failed attempt: its kind and the text for ``last_error``."""

    kind: FailureKind
    error: str


ROW_GONE = Failure(FailureKind.PERMANENT, "decision not found")
NOT_RUN = Failure(FailureKind.UNKNOWN, "not run")


def unknown_kind(kind: str) -> Failure:
    return Failure(FailureKind.PERMANENT, f"unknown event kind {kind!r}")


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:_DETAIL]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _database_unreachable(exc: BaseException) -> bool:
    """The database could not be used just now (connection refused or lost, locked, pool
    exhausted), as opposed to refusing what was asked of it."""
    if isinstance(
        exc,
        (
            sa_exc.OperationalError,
            sa_exc.InterfaceError,
            sa_exc.DisconnectionError,
            sa_exc.TimeoutError,
        ),
    ):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


def classify(exc: BaseException, *, building: str | None = None) -> Failure:
    """The kind of failure ``exc`` is.

    ``building`` names the document that was being built from the decision row when ``exc``
    was raised (``"the YAML file"``, ``"the index entry"``); left out, ``exc`` was raised
    while delivering it (writing the file, upserting the entry) or reading the row."""
    if isinstance(exc, MemoryError):  # the process, not the row: may well pass next time
        return Failure(FailureKind.UNKNOWN, _describe(exc))
    if building is not None:
        return Failure(
            FailureKind.PERMANENT, f"{building} cannot be built from the row: {_describe(exc)}"
        )
    if isinstance(exc, IndexUnavailable):
        return Failure(FailureKind.TRANSIENT, "vector index unavailable")
    if isinstance(exc, OSError):
        return Failure(
            FailureKind.TRANSIENT, f"could not write the file: {exc.strerror or _describe(exc)}"
        )
    if _database_unreachable(exc):
        return Failure(FailureKind.TRANSIENT, f"database unavailable: {type(exc).__name__}")
    return Failure(FailureKind.UNKNOWN, _describe(exc))


def backoff(attempts: int) -> timedelta:
    """The wait before the next try after ``attempts`` tries: 1 s, 2 s, 4 s ... MAX_BACKOFF."""
    if attempts >= 6:  # 2**5 s already exceeds the cap; no huge powers for long outages
        return MAX_BACKOFF
    return min(MAX_BACKOFF, timedelta(seconds=2 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class Next:
    """What an event becomes after a failed attempt."""

    status: Status  # PENDING (due again at ``available_at``) or DEAD
    attempts: int  # every try, whatever its outcome (the backoff grows with it)
    unknown_failures: int  # the tries that failed in an unknown way
    available_at: datetime


def after_failure(
    failure: Failure, attempts: int, unknown_failures: int, max_attempts: int, now: datetime
) -> Next:
    """The event's next state after ``failure``, given its counters before this try."""
    tries = attempts + 1
    unknown = unknown_failures + (failure.kind == FailureKind.UNKNOWN)
    dead = failure.kind == FailureKind.PERMANENT or (
        failure.kind == FailureKind.UNKNOWN and unknown >= max_attempts
    )
    return Next(Status.DEAD if dead else Status.PENDING, tries, unknown, now + backoff(tries))
