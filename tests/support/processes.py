"""Child processes of a test (a Chroma server, ``cstp serve``): started, waited for, killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

from .waiting import wait_until


def wait_until_up(
    proc: subprocess.Popen[bytes], url: str, timeout: float, log: Callable[[], str] = lambda: ""
) -> None:
    """Poll ``url`` until it answers 200. RuntimeError (with the tail of ``log()``) when
    ``proc`` exits first or ``timeout`` runs out; the caller stops ``proc``."""

    def up() -> tuple[bool, Any]:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}\n{log()}")
        status = httpx.get(url, timeout=1.0).status_code
        return status == 200, status

    try:
        wait_until(up, timeout, url, interval=0.1, not_yet=(httpx.HTTPError,))
    except AssertionError:
        raise RuntimeError(f"{url} did not answer within {timeout:g} s\n{log()}") from None


class ChromaServer:
    """A ``chroma run`` child process on a loopback port, that tests kill (SIGKILL) and start
    again on the same path and port."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("chroma")),
                "run",
                "--path",
                str(self.path),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until_up(self.proc, f"{self.url}/api/v2/heartbeat", timeout)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGKILL to the server and its children (its own session)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


CSTP = Path(sys.executable).with_name("cstp")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def cstp_servers(
    folder: Path, settings: Sequence[Mapping[str, str]], args: Sequence[str] = ()
) -> Iterator[list[str]]:
    """One ``cstp serve`` process per item of ``settings`` (its CSTP_* variables, over this
    process's environment), each on a free loopback port with ``args`` added (``--workers``),
    logging to ``folder``/serverN.log; their base URLs once every one answers /health.
    Stopped (SIGTERM, then SIGKILL) after."""
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    try:
        for n, own in enumerate(settings):
            port = free_port()
            log = (folder / f"server{n}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [str(CSTP), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
                    env={**os.environ, **own},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            bases.append(f"http://127.0.0.1:{port}")
        for n, (proc, base) in enumerate(zip(procs, bases, strict=True)):
            wait_until_up(
                proc,
                f"{base}/health",
                120,
                lambda n=n: (folder / f"server{n}.log").read_text(errors="replace")[-3000:],
            )
        yield bases
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
