"""Events as a relay holds them, and what a pass makes of them: pure, no I/O.

A pass runs its events (app.outbox.handlers) and gets ``Results``: for each event, None when
it worked, else its ``Failure``. ``settle`` decides, from those results and the time, which
events become ``done``, which are ``pending`` again (and from when) and which are ``dead``;
the relay writes that (``Relay._record_results``) and counts it (``RelayStats``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from app.db.outbox import EventKind, Status

from .failures import NOT_RUN, Failure, Next, after_failure

_KINDS: dict[str, EventKind] = {kind.value: kind for kind in EventKind}


class Event(NamedTuple):
    """An event as a relay holds it while working on it."""

    id: int
    # An EventKind, or the stored text of a kind this server does not know (the handlers
    # make such an event dead at once: failures.unknown_kind).
    kind: EventKind | str
    decision_id: str
    attempts: int  # every try so far
    unknown_failures: int  # the tries so far that failed in an unknown way

    @classmethod
    def of(
        cls,
        event_id: int,
        kind: str,
        decision_id: str,
        attempts: int,
        unknown_failures: int | None,
    ) -> Event:
        """An event from its stored columns (a row read back, or one just added)."""
        return cls(event_id, _KINDS.get(kind, kind), decision_id, attempts, unknown_failures or 0)


Results = dict[int, Failure | None]  # event id -> None for success, else the failure


@dataclass
class RelayStats:
    """What a pass did: events done, failed (pending again or dead) and, of those, dead."""

    done: int = 0
    failed: int = 0
    dead: int = 0
    done_ids: list[int] = field(default_factory=list)


class Failed(NamedTuple):
    """An event that failed in a pass, why, and what it becomes."""

    event: Event
    failure: Failure
    after: Next


@dataclass(frozen=True)
class Settlement:
    """What a pass's results make of its events."""

    done: list[int]  # the ids of the events that worked, in the order given
    failed: list[Failed]  # the others: pending again at ``after.available_at``, or dead

    def stats(self) -> RelayStats:
        dead = sum(f.after.status == Status.DEAD for f in self.failed)
        return RelayStats(len(self.done), len(self.failed), dead, list(self.done))


def settle(
    events: Iterable[Event], results: Results, *, now: datetime, max_attempts: int
) -> Settlement:
    """Done for each event whose result is None; for every other one (an event without a
    result was not run: ``NOT_RUN``, an unknown failure) its next state after that failure
    at ``now`` (app.outbox.failures.after_failure: backoff, dead at once, or dead after
    ``max_attempts`` unknown failures)."""
    done: list[int] = []
    failed: list[Failed] = []
    for event in events:
        failure = results.get(event.id, NOT_RUN)
        if failure is None:
            done.append(event.id)
        else:
            after = after_failure(
                failure, event.attempts, event.unknown_failures, max_attempts, now
            )
            failed.append(Failed(event, failure, after))
    return Settlement(done, failed)
