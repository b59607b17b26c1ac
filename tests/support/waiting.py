"""Waiting for the condition a test needs, never for a while: poll it with a deadline.

A check returns ``(reached, detail)``; the detail is what the wait returns once the condition
holds, and what the failure shows (the last one seen) when the deadline passes first. The
pause between two checks is only the polling interval: the wait ends at the first check that
sees the condition, however soon that is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

Check = Callable[[], tuple[bool, Any]]
AsyncCheck = Callable[[], Awaitable[tuple[bool, Any]]]


async def poll_until(
    check: AsyncCheck,
    timeout: float,  # noqa: ASYNC109 - a deadline the failure reports, with the last state seen
    what: str,
    *,
    interval: float = 0.05,
    not_yet: tuple[type[BaseException], ...] = (),
) -> Any:
    """Await ``check()`` until it reports the condition reached; return its detail.

    AssertionError naming ``what`` and the last detail after ``timeout`` seconds. An
    exception of a type in ``not_yet`` (a component still coming back) counts as "not yet";
    any other fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reached, detail = await check()
        except not_yet as exc:
            reached, detail = False, exc
        if reached:
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s (last: {detail!r})")
        await asyncio.sleep(interval)  # the polling interval, not a wait for the condition


def wait_until(
    check: Check,
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    not_yet: tuple[type[BaseException], ...] = (),
) -> Any:
    """``poll_until`` for a test (or a fixture) that is not a coroutine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reached, detail = check()
        except not_yet as exc:
            reached, detail = False, exc
        if reached:
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s (last: {detail!r})")
        time.sleep(interval)  # the polling interval, not a wait for the condition
