"""What an outbox failure is (app.outbox.failures) and what becomes of the event: pure
functions, a fake clock, no database or server."""

from __future__ import annotations

import errno
import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from sqlalchemy import exc as sa_exc

from app.config import Settings
from app.db.decisions import Decision
from app.db.outbox import EventKind, OutboxEvent, Status
from app.decisions.export import render
from app.outbox.admin import why
from app.outbox.events import Event
from app.outbox.failures import (
    MAX_BACKOFF,
    NOT_RUN,
    ROW_GONE,
    Failure,
    FailureKind,
    after_failure,
    backoff,
    classify,
    unknown_kind,
)
from app.outbox.relay import Relay
from app.runtime import Runtime
from app.search.index import IndexUnavailable
from app.search.types import unavailable

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MIGRATION = (
    Path(__file__).resolve().parents[3]
    / "app"
    / "db"
    / "migrations"
    / "versions"
    / "2026_12_01_0007_outbox_failure_kind.py"
)


def deep(levels: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(levels):
        value = {"k": value}
    return value


def decision(**fields: object) -> Decision:
    return Decision(
        id="0a1b2c3d",
        summary="Use PostgreSQL",
        decision="Use PostgreSQL",
        category="architecture",
        confidence=0.8,
        stakes="medium",
        status="pending",
        created_at=T0,
        recorded_by="alice",
        **fields,
    )


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "exc",
    [
        IndexUnavailable("vector index unavailable"),
        unavailable(ConnectionRefusedError(111, "Connection refused")),  # Chroma down
        unavailable(TimeoutError("the Chroma server did not answer")),  # Chroma stalled
        unavailable(ValueError("Expecting value: line 1 column 1")),  # garbage while it restarts
    ],
)
def test_an_unreachable_index_is_transient(exc: BaseException) -> None:
    assert classify(exc) == Failure(FailureKind.TRANSIENT, "vector index unavailable")


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device"),
            "could not write the file: No space left on device",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied"),
            "could not write the file: Permission denied",
        ),
        (OSError("no strerror"), "could not write the file: OSError: no strerror"),
    ],
)
def test_a_file_system_error_is_transient(exc: BaseException, error: str) -> None:
    assert classify(exc) == Failure(FailureKind.TRANSIENT, error)


@pytest.mark.parametrize(
    "exc",
    [
        sa_exc.OperationalError("SELECT 1", {}, Exception("database is locked")),
        sa_exc.InterfaceError("SELECT 1", {}, Exception("connection is closed")),
        sa_exc.TimeoutError("QueuePool limit reached"),
    ],
)
def test_an_unreachable_or_busy_database_is_transient(exc: BaseException) -> None:
    failure = classify(exc)
    assert failure.kind == FailureKind.TRANSIENT and failure.error.startswith(
        "database unavailable"
    )


def test_a_database_refusal_is_not_transient() -> None:
    refused = sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    assert classify(refused).kind == FailureKind.UNKNOWN


@pytest.mark.parametrize(
    "exc",
    [
        RecursionError("maximum recursion depth exceeded"),
        yaml.representer.RepresenterError("cannot represent an object", object()),
        ValueError("bad value"),
        TypeError("bad type"),
        KeyError("missing"),
    ],
)
def test_what_building_from_the_row_raises_is_permanent(exc: BaseException) -> None:
    failure = classify(exc, building="the YAML file")
    assert failure.kind == FailureKind.PERMANENT
    assert failure.error.startswith(
        "the YAML file cannot be built from the row: " + type(exc).__name__
    )


def test_even_an_error_that_looks_transient_is_permanent_when_building() -> None:
    # Building is a pure function of the row: nothing outside it can change the outcome.
    assert classify(OSError("odd"), building="the index entry").kind == FailureKind.PERMANENT


def test_memory_is_the_process_not_the_row() -> None:
    assert classify(MemoryError(), building="the YAML file").kind == FailureKind.UNKNOWN
    assert classify(MemoryError()).kind == FailureKind.UNKNOWN


def test_anything_else_is_unknown_and_its_message_is_kept_short() -> None:
    failure = classify(RuntimeError("a bug\n" + "x" * 5000))
    assert failure.kind == FailureKind.UNKNOWN
    assert failure.error.startswith("RuntimeError: a bug x") and len(failure.error) < 250


def test_fixed_failures() -> None:
    assert Failure(FailureKind.PERMANENT, "decision not found") == ROW_GONE
    assert unknown_kind("mail") == Failure(FailureKind.PERMANENT, "unknown event kind 'mail'")
    assert NOT_RUN.kind == FailureKind.UNKNOWN


def test_a_decision_nested_400_levels_cannot_be_rendered_and_that_is_permanent() -> None:
    with pytest.raises(RecursionError) as caught:
        render(decision(affected_kpis=deep(400)))
    failure = classify(caught.value, building="the YAML file")
    assert failure.kind == FailureKind.PERMANENT and "RecursionError" in failure.error
    assert render(decision(affected_kpis=deep(8)))  # what the API accepts renders


# ---------------------------------------------------------------- backoff and next state


def test_backoff_doubles_from_one_second_and_is_capped_at_30_seconds() -> None:
    assert timedelta(seconds=30) == MAX_BACKOFF
    waits = [backoff(n).total_seconds() for n in range(1, 9)]
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff(0) == timedelta(seconds=1)
    assert backoff(10**9) == MAX_BACKOFF  # however long the outage, no overflow


def test_a_transient_failure_never_counts_and_never_kills() -> None:
    attempts = unknown = 0
    for _ in range(10_000):
        after = after_failure(
            Failure(FailureKind.TRANSIENT, "vector index unavailable"),
            attempts,
            unknown,
            max_attempts=1,
            now=T0,
        )
        assert after.status == Status.PENDING and after.unknown_failures == 0
        attempts = after.attempts
    assert attempts == 10_000
    assert after.available_at == T0 + MAX_BACKOFF


def test_a_permanent_failure_is_dead_at_once() -> None:
    after = after_failure(ROW_GONE, 0, 0, max_attempts=1000, now=T0)
    assert (after.status, after.attempts, after.unknown_failures) == (Status.DEAD, 1, 0)


def test_unknown_failures_are_dead_after_max_attempts_of_them_only() -> None:
    bug = Failure(FailureKind.UNKNOWN, "RuntimeError: a bug")
    outage = Failure(FailureKind.TRANSIENT, "vector index unavailable")
    attempts, unknown = 50, 0  # a long outage first: it does not count
    statuses = []
    for failure in (bug, outage, bug, outage, outage, bug):
        after = after_failure(failure, attempts, unknown, max_attempts=3, now=T0)
        attempts, unknown = after.attempts, after.unknown_failures
        statuses.append(after.status)
    assert statuses == [Status.PENDING] * 5 + [Status.DEAD]
    assert (attempts, unknown) == (56, 3)


def test_an_outage_longer_than_the_old_give_up_time_on_a_fake_clock() -> None:
    """An index event fails while the index is down (10 minutes), with max attempts 3: the
    old rule buried it after 1 + 2 s; now it waits, and its next try after the index is
    back comes within the 30 s cap."""
    down_until = T0 + timedelta(minutes=10)
    clock, attempts, unknown = T0, 0, 0
    while clock < down_until:
        after = after_failure(
            Failure(FailureKind.TRANSIENT, "vector index unavailable"),
            attempts,
            unknown,
            max_attempts=3,
            now=clock,
        )
        assert after.status == Status.PENDING
        attempts, unknown, clock = after.attempts, after.unknown_failures, after.available_at
    assert attempts > 3  # where the old rule had given up
    assert clock - down_until <= MAX_BACKOFF


# ---------------------------------------------------------------- noticing a recovery


def relay() -> Relay:
    return Relay(None, None, Settings(), Runtime(now=lambda: T0), exports=None)  # type: ignore[arg-type]  # no db, no index, no exports


def work(event_id: int, kind: EventKind) -> Event:
    return Event(event_id, kind, "0a1b2c3d", 0, 0)


def test_the_first_success_after_a_transient_failure_makes_the_waiting_events_due() -> None:
    r = relay()
    assert r._down == set(EventKind)  # at start: events of an earlier process may be waiting
    r._note([work(1, EventKind.EXPORT), work(2, EventKind.INDEX)], {1: None, 2: None})
    assert r._back == set(EventKind) and r.wakeup.is_set()
    r._back.clear()
    r.wakeup.clear()

    down = Failure(FailureKind.TRANSIENT, "vector index unavailable")
    r._note([work(3, EventKind.EXPORT), work(4, EventKind.INDEX)], {3: None, 4: down})
    assert r._down == {EventKind.INDEX} and r._back == set() and not r.wakeup.is_set()
    r._note([work(5, EventKind.INDEX)], {5: Failure(FailureKind.UNKNOWN, "RuntimeError: x")})
    assert r._down == {EventKind.INDEX} and r._back == set()  # not a success
    r._note([work(6, EventKind.INDEX), work(7, EventKind.INDEX)], {6: None, 7: None})
    assert r._back == {EventKind.INDEX} and r._down == set() and r.wakeup.is_set()
    r._back.clear()
    r.wakeup.clear()
    r._note([work(8, EventKind.INDEX)], {8: None})  # it never went away: nothing to revive
    assert r._back == set() and not r.wakeup.is_set()


def test_a_kind_that_fails_and_works_in_one_pass_is_still_down() -> None:
    r = relay()
    r._down = set()
    down = Failure(FailureKind.TRANSIENT, "could not write the file: No space left on device")
    r._note([work(1, EventKind.EXPORT), work(2, EventKind.EXPORT)], {1: None, 2: down})
    assert r._down == {EventKind.EXPORT} and r._back == set()


# ---------------------------------------------------------------- what an operator reads


def event(**fields: object) -> OutboxEvent:
    defaults: dict[str, object] = {
        "id": 7,
        "kind": "export",
        "decision_id": "0a1b2c3d",
        "status": "pending",
        "attempts": 1,
        "unknown_failures": 0,
        "created_at": T0,
        "available_at": T0,
    }
    return OutboxEvent(**{**defaults, **fields})


def test_cstp_outbox_says_why_an_event_is_dead_or_waiting() -> None:
    permanent = event(
        status=Status.DEAD,
        failure_kind=FailureKind.PERMANENT,
        last_error="the YAML file cannot be built from the row: RecursionError",
    )
    assert why(permanent) == (
        "dead: can never succeed as it is: the YAML file cannot be "
        "built from the row: RecursionError"
    )
    gave_up = event(
        status=Status.DEAD,
        failure_kind=FailureKind.UNKNOWN,
        unknown_failures=8,
        last_error="RuntimeError: a bug",
    )
    assert why(gave_up).startswith("dead: failed 8 time(s) in an unforeseen way")
    waiting = event(failure_kind=FailureKind.TRANSIENT, last_error="vector index unavailable")
    assert why(waiting) == (
        "waiting for a dependency, retried until it works: vector index unavailable"
    )
    assert why(event(attempts=0)) == ""


# ---------------------------------------------------------------- migration 0007's rule


def migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("migration_0007", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("last_error", "permanent"),
    [
        ("decision not found", True),
        ("unknown event kind 'mail'", True),
        ("export failed: RecursionError", True),
        ("export failed: RepresenterError", True),
        ("export failed: ValueError", True),
        ("vector index unavailable", False),
        ("export failed: No space left on device", False),
        ("export failed: Read-only file system", False),
        ("export failed: PermissionError", False),
        ("export failed: OSError", False),
        ("export failed: MemoryError", False),
        ("index failed: ValueError", False),
        ("not run", False),
        (None, False),
    ],
)
def test_migration_0007_revives_every_dead_event_but_the_permanent_ones(
    last_error: str | None, permanent: bool
) -> None:
    assert migration().permanent(last_error) is permanent
