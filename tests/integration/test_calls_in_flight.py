"""The runner counts the calls in flight (``services.calls``), which the embedder reads to
choose its threads: every call counts while it runs, however it ends."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from app.errors import CstpError
from app.operations.context import CallContext
from app.operations.registry import Operation
from app.operations.runner import Runner
from app.scopes import READ, Principal


class NoParams(msgspec.Struct):
    pass


def operation(name: str, handler: Any) -> Operation:
    return Operation(name, NoParams, dict, handler, summary=name, scopes=(READ,), writes=False)


async def test_calls_count_while_they_run_and_no_longer_once_ended(services: Any) -> None:
    runner = Runner(services)
    calls = services.calls
    release = asyncio.Event()
    inside: asyncio.Queue[int] = asyncio.Queue()

    async def wait(ctx: CallContext, params: NoParams) -> dict[str, Any]:
        inside.put_nowait(ctx.services.calls.running)
        await release.wait()
        return {}

    async def fail(ctx: CallContext, params: NoParams) -> dict[str, Any]:
        raise CstpError(-32001, "Not found")

    async def crash(ctx: CallContext, params: NoParams) -> dict[str, Any]:
        raise RuntimeError("a bug")

    assert calls.running == 0 and not calls.crowded()
    first = asyncio.create_task(runner.run(operation("test.wait", wait), {}, Principal("agent-a")))
    assert await inside.get() == 1 and not calls.crowded()  # one call alone has the cores

    second = asyncio.create_task(runner.run(operation("test.wait", wait), {}, Principal("agent-b")))
    assert await inside.get() == 2 and calls.crowded()

    release.set()
    assert await asyncio.gather(first, second) == [{}, {}]
    assert calls.running == 0 and not calls.crowded()

    for handler, code in ((fail, -32001), (crash, -32603)):
        with pytest.raises(CstpError) as raised:
            await runner.run(operation("test.fail", handler), {}, Principal("agent-a"))
        assert raised.value.code == code
        assert calls.running == 0
    with pytest.raises(CstpError):
        await runner.run(
            operation("test.wait", wait), [1, 2], Principal("agent-a")
        )  # params not an object
    assert calls.running == 0
