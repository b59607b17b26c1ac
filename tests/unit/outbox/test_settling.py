"""What a relay's pass makes of its events (app.outbox.events.settle) and how far imported
events got (app.outbox.admin.progress): pure functions on a fake clock, no database or
server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from app.db.outbox import EventKind, Status
from app.outbox.admin import Progress, progress
from app.outbox.events import Event, Failed, RelayStats, Results, settle
from app.outbox.failures import (
    MAX_BACKOFF,
    NOT_RUN,
    ROW_GONE,
    Failure,
    FailureKind,
    Next,
    backoff,
    unknown_kind,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DOWN = Failure(FailureKind.TRANSIENT, "vector index unavailable")
BUG = Failure(FailureKind.UNKNOWN, "RuntimeError: a bug")


def ev(
    event_id: int,
    kind: EventKind = EventKind.INDEX,
    *,
    attempts: int = 0,
    unknown_failures: int = 0,
) -> Event:
    return Event(event_id, kind, f"{event_id:08x}", attempts, unknown_failures)


# ---------------------------------------------------------------- the stored values


def test_the_enums_hold_exactly_the_strings_the_columns_hold() -> None:
    """No migration: rows, SQL and the JSON of /ready keep the same strings."""
    assert [k.value for k in EventKind] == ["export", "index"]
    assert [s.value for s in Status] == ["pending", "done", "dead"]
    assert [f.value for f in FailureKind] == ["transient", "permanent", "unknown"]
    # A value read back from a row is a plain str: it equals, and hashes as, its member.
    assert EventKind.INDEX == "index" and "index" in {EventKind.INDEX}
    assert {"dead": 1}.get(Status.DEAD) == 1
    assert f"{Status.DEAD:<7}|" == "dead   |" and str(FailureKind.TRANSIENT) == "transient"


def test_an_event_from_its_columns() -> None:
    event = Event.of(7, "export", "0a1b2c3d", 2, None)
    assert event == (7, EventKind.EXPORT, "0a1b2c3d", 2, 0)
    assert event.kind is EventKind.EXPORT
    # A kind this server does not know stays as stored; the handlers make it dead at once.
    assert Event.of(8, "mail", "0a1b2c3d", 0, 0).kind == "mail"


# ---------------------------------------------------------------- one pass


def test_what_worked_is_done_in_the_order_given() -> None:
    events = [ev(3), ev(1, EventKind.EXPORT), ev(2)]
    settled = settle(events, {3: None, 1: None, 2: None}, now=T0, max_attempts=8)
    assert settled.done == [3, 1, 2] and settled.failed == []
    assert settled.stats() == RelayStats(done=3, failed=0, dead=0, done_ids=[3, 1, 2])


def test_each_failure_becomes_pending_at_its_backoff_or_dead() -> None:
    events = [
        ev(1),  # worked
        ev(2, attempts=4),  # the index is down: pending, backoff after its 5th try
        ev(3, EventKind.EXPORT),  # its row is gone: dead at once
        ev(4, attempts=6, unknown_failures=2),  # a bug, its 3rd: dead with max_attempts 3
        ev(5, attempts=1, unknown_failures=1),  # a bug, its 2nd: pending
        ev(6, EventKind.EXPORT),  # no result: not run, an unknown failure
        ev(7),  # a kind the handlers did not know
    ]
    results: Results = {1: None, 2: DOWN, 3: ROW_GONE, 4: BUG, 5: BUG, 7: unknown_kind("mail")}
    settled = settle(events, results, now=T0, max_attempts=3)
    assert settled.done == [1]
    assert settled.failed == [
        Failed(events[1], DOWN, Next(Status.PENDING, 5, 0, T0 + timedelta(seconds=16))),
        Failed(events[2], ROW_GONE, Next(Status.DEAD, 1, 0, T0 + timedelta(seconds=1))),
        Failed(events[3], BUG, Next(Status.DEAD, 7, 3, T0 + MAX_BACKOFF)),
        Failed(events[4], BUG, Next(Status.PENDING, 2, 2, T0 + timedelta(seconds=2))),
        Failed(events[5], NOT_RUN, Next(Status.PENDING, 1, 1, T0 + timedelta(seconds=1))),
        Failed(events[6], unknown_kind("mail"), Next(Status.DEAD, 1, 0, T0 + timedelta(seconds=1))),
    ]
    assert settled.stats() == RelayStats(done=1, failed=6, dead=3, done_ids=[1])


def test_the_time_moves_when_an_event_is_due_never_what_it_becomes() -> None:
    """The inline pass counts its outcome at once and records it later (or a pass records
    it after a slow transaction): the statuses and counts cannot differ, only the times."""
    events = [ev(1), ev(2, attempts=3), ev(3, unknown_failures=7), ev(4)]
    results: Results = {1: None, 2: DOWN, 3: BUG, 4: ROW_GONE}
    early = settle(events, results, now=T0, max_attempts=8)
    late = settle(events, results, now=T0 + timedelta(minutes=5), max_attempts=8)
    assert early.stats() == late.stats() == RelayStats(1, 3, 2, [1])
    for a, b in zip(early.failed, late.failed, strict=True):
        assert a.after.status == b.after.status
        assert b.after.available_at - a.after.available_at == timedelta(minutes=5)


def test_an_empty_pass_settles_nothing() -> None:
    settled = settle([], {}, now=T0, max_attempts=8)
    assert (settled.done, settled.failed, settled.stats()) == ([], [], RelayStats())


# ---------------------------------------------------------------- pass after pass


def run_passes(
    event: Event, outcomes: list[Failure | None], *, max_attempts: int
) -> list[tuple[datetime, Status]]:
    """A relay that takes ``event`` whenever it is due: the fake clock jumps to its
    ``available_at``, the pass gets the next outcome, ``settle`` says what it becomes."""
    clock, seen = T0, []
    for outcome in outcomes:
        settled = settle([event], {event.id: outcome}, now=clock, max_attempts=max_attempts)
        if outcome is None:
            assert settled.done == [event.id]
            seen.append((clock, Status.DONE))
            break
        [failed] = settled.failed
        after = failed.after
        seen.append((clock, after.status))
        if after.status == Status.DEAD:
            break
        event = event._replace(attempts=after.attempts, unknown_failures=after.unknown_failures)
        clock = after.available_at
    return seen


def test_a_long_outage_backs_off_to_30_seconds_and_the_event_is_done_once_it_ends() -> None:
    seen = run_passes(ev(1), [DOWN] * 12 + [None], max_attempts=3)
    tries = [when for when, _ in seen]
    waits = [(b - a).total_seconds() for a, b in pairwise(tries)]
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30]
    assert [status for _, status in seen] == [Status.PENDING] * 12 + [Status.DONE]


def test_unknown_failures_bury_the_event_after_max_attempts_of_them() -> None:
    seen = run_passes(ev(1), [DOWN, BUG, DOWN, DOWN, BUG, BUG, None], max_attempts=3)
    assert [status for _, status in seen] == [Status.PENDING] * 5 + [Status.DEAD]
    assert seen[-1][0] == T0 + timedelta(seconds=1 + 2 + 4 + 8 + 16)


@pytest.mark.parametrize("attempts", [0, 5, 10**6])
def test_a_permanent_failure_is_dead_at_the_first_pass_whatever_came_before(
    attempts: int,
) -> None:
    [(when, status)] = run_passes(ev(1, attempts=attempts), [ROW_GONE], max_attempts=1000)
    assert (when, status) == (T0, Status.DEAD)


def test_backoff_is_what_settle_schedules() -> None:
    for attempts in range(12):
        [failed] = settle([ev(1, attempts=attempts)], {1: DOWN}, now=T0, max_attempts=1).failed
        assert failed.after.available_at == T0 + backoff(attempts + 1)


# ---------------------------------------------------------------- how far an import got


def test_progress_tells_done_from_worked_on_from_left() -> None:
    rows = [
        (Status.DONE, 1, T0 - timedelta(hours=1)),
        ("done", 0, T0),  # as read back from a row: a plain str
        ("pending", 0, T0 + timedelta(seconds=20)),  # under a relay's lease: worked on
        ("pending", 0, T0),  # due now, no one holds it: left
        ("pending", 1, T0 + timedelta(seconds=2)),  # failed once, backing off: left
        ("dead", 1, T0 + timedelta(seconds=1)),  # left (to an operator)
    ]
    assert progress(rows, T0) == Progress(done=2, working=1, left=3)
    # The same rows half a minute later: the lease has run out, it is left to a retry.
    assert progress(rows, T0 + timedelta(seconds=30)) == Progress(done=2, working=0, left=4)
    assert progress([], T0) == (0, 0, 0)
