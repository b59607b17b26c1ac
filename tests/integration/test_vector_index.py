"""VectorIndex against real Chroma (embedded and a real ``chroma run`` server) and the real
model."""

from __future__ import annotations

import asyncio
import http.server
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.search.embedder import Embedder
from app.search.index import IndexEntry, IndexUnavailable, VectorIndex
from support.processes import ChromaServer
from support.waiting import poll_until

DEPLOY = "Deploy auth service to production"
UNRELATED = [
    "Chose PostgreSQL for memory storage",
    "Adopt weekly retrospective meetings for the team",
    "Use ruff as the Python linter",
    "Rotate third-party API keys every 90 days",
]


@pytest.fixture
async def index(tmp_path: Path, embedder: Embedder) -> AsyncIterator[VectorIndex]:
    idx = VectorIndex.embedded(tmp_path / "chroma", embedder)
    yield idx
    await idx.aclose()


def entry(i: str, text: str, **metadata: object) -> IndexEntry:
    return IndexEntry(id=i, document=text, metadata={"title": text, **metadata})


async def test_paraphrase_ranks_the_deploy_decision_first(index: VectorIndex) -> None:
    texts = [DEPLOY, *UNRELATED]
    await index.upsert([entry(f"d{n}", t) for n, t in enumerate(texts)])
    hits = await index.query(
        "roll out the login service", where=None, limit=10, workspace="default"
    )
    assert hits[0].id == "d0"
    assert 0.0 < hits[0].distance < 1.0
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert hits[0].metadata["title"] == DEPLOY


async def test_upsert_is_idempotent_and_new_metadata_replaces_old(index: VectorIndex) -> None:
    await index.upsert([entry("a", DEPLOY, status="pending", tags=["x", "y"], pr=7)])
    await index.upsert([entry("a", DEPLOY, status="reviewed", tags=[], pr=None, outcome="ok")])
    assert await index.count() == 1
    meta = await index.get_metadata(["a", "missing"], workspace="default")
    assert meta == {"a": {"title": DEPLOY, "status": "reviewed", "outcome": "ok"}}
    # the dropped keys are really gone from the filterable metadata, not just hidden
    assert (
        await index.query(DEPLOY, where={"tags": {"$contains": "x"}}, limit=5, workspace="default")
        == []
    )
    assert await index.query(DEPLOY, where={"pr": {"$eq": 7}}, limit=5, workspace="default") == []


async def test_concurrent_upserts_are_coalesced(index: VectorIndex) -> None:
    texts = [f"Decision number {n} about {UNRELATED[n % 4]}" for n in range(50)]
    await asyncio.gather(*(index.upsert([entry(f"c{n}", t, n=n)]) for n, t in enumerate(texts)))
    assert await index.count() == 50
    assert index.stats.upsert_calls == 50
    assert index.stats.flushes < 50
    assert index.stats.entries_written == 50


async def test_duplicate_ids_in_one_flush_last_wins(index: VectorIndex) -> None:
    await asyncio.gather(
        index.upsert([entry("dup", "first version", v=1), entry("dup", "second", v=2)]),
        index.upsert([entry("dup", DEPLOY, v=3)]),
    )
    assert index.stats.flushes == 1
    assert await index.count() == 1
    assert (await index.get_metadata(["dup"], workspace="default"))["dup"]["v"] == 3


async def test_queries_run_while_writes_are_flushing(index: VectorIndex) -> None:
    await index.upsert([entry("d0", DEPLOY)])
    writes = [index.upsert([entry(f"w{n}", f"{UNRELATED[n % 4]} v{n}")]) for n in range(20)]
    reads = [
        index.query("roll out the login service", where=None, limit=3, workspace="default")
        for _ in range(10)
    ]
    results = await asyncio.gather(*writes, *reads)
    for hits in results[20:]:
        assert hits and hits[0].id == "d0"
    assert await index.count() == 21


async def test_where_matching_nothing_and_empty_collection(index: VectorIndex) -> None:
    assert await index.query(DEPLOY, where=None, limit=5, workspace="default") == []
    await index.upsert([entry("a", DEPLOY, category="architecture")])
    assert (
        await index.query(
            DEPLOY, where={"category": {"$eq": "process"}}, limit=5, workspace="default"
        )
        == []
    )
    assert [
        h.id
        for h in await index.query(
            DEPLOY, where={"category": "architecture"}, limit=5, workspace="default"
        )
    ] == ["a"]


async def test_index_persists_every_hundred_writes_even_for_an_older_collection(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Chroma's default (persist every 1000 writes) makes each upsert slower the more writes
    wait; the index uses SYNC_THRESHOLD, also on a collection made before it was set."""
    import chromadb
    from chromadb.config import Settings

    from app.search.chroma_client import SYNC_THRESHOLD

    def client_of(path: Path) -> chromadb.ClientAPI:  # the server's settings, one per path
        return chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False)
        )

    path = tmp_path / "chroma"
    client = client_of(path)
    old = client.create_collection(
        "decisions", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    assert old.configuration["hnsw"]["sync_threshold"] == 1000
    idx = VectorIndex.embedded(path, embedder)
    fresh = VectorIndex.embedded(tmp_path / "fresh", embedder)
    try:
        await idx.upsert([entry("a", DEPLOY)])
        assert await idx.count() == 1
        hnsw = client.get_collection("decisions").configuration["hnsw"]
        assert hnsw["sync_threshold"] == SYNC_THRESHOLD == 100
        assert hnsw["space"] == "cosine"
        await fresh.upsert([entry("b", DEPLOY)])
        made = client_of(tmp_path / "fresh").get_collection("decisions")
        assert made.configuration["hnsw"]["sync_threshold"] == SYNC_THRESHOLD
    finally:
        await idx.aclose()
        await fresh.aclose()


async def test_delete_and_closed_index(tmp_path: Path, embedder: Embedder) -> None:
    idx = VectorIndex.embedded(tmp_path / "c", embedder)
    await idx.upsert([entry("a", DEPLOY), entry("b", UNRELATED[0])])
    await idx.delete(["a", "unknown"], workspace="default")
    await idx.delete([], workspace="default")
    assert await idx.count() == 1
    await idx.ping()
    idx.close()
    with pytest.raises(IndexUnavailable):
        await idx.ping()


# ---- a real Chroma server: outage at start-up, outage mid-life, lazy reconnect ----


async def assert_unavailable_fast(call: Callable[[], Awaitable[object]]) -> None:
    """The call fails with the generic error, and within a caller's patience (5 s: a server
    that is down fails at once, a hung one within the 2 s request timeout); waiting longer
    fails the test with TimeoutError."""
    with pytest.raises(IndexUnavailable) as info:
        await asyncio.wait_for(call(), timeout=5)
    assert str(info.value) == "vector index unavailable"  # generic: no host, port or path
    assert info.value.__cause__ is not None


@pytest.mark.slow  # fault injection on a `chroma run` process (killed, restarted, stopped)
async def test_http_index_survives_server_outages(
    chroma_server: ChromaServer, embedder: Embedder
) -> None:
    index = VectorIndex.http(
        f"http://127.0.0.1:{chroma_server.port}", embedder, request_timeout=2.0
    )
    try:
        # the server is down at start-up: creating the index is fine, using it fails fast
        await assert_unavailable_fast(index.ping)
        chroma_server.start()
        await index.ping()
        await index.upsert(
            [entry("d0", DEPLOY), *(entry(f"u{n}", t) for n, t in enumerate(UNRELATED))]
        )
        hits = await index.query(
            "roll out the login service", where=None, limit=3, workspace="default"
        )
        assert hits[0].id == "d0" and 0.0 < hits[0].distance < 1.0

        chroma_server.stop()
        await assert_unavailable_fast(lambda: index.upsert([entry("d1", "Use Redis for caching")]))
        await assert_unavailable_fast(
            lambda: index.query(DEPLOY, where=None, limit=3, workspace="default")
        )
        await assert_unavailable_fast(index.ping)
        await assert_unavailable_fast(index.count)

        chroma_server.start()  # same data directory, same port, same VectorIndex object
        await index.ping()
        await index.upsert([entry("d1", "Use Redis for caching")])
        assert await index.count() == 6
        hits = await index.query(
            "roll out the login service", where=None, limit=3, workspace="default"
        )
        assert hits[0].id == "d0"
        assert index.stats.failures >= 5

        # a hung server (accepts connections, never answers) fails within the request timeout
        assert chroma_server.proc is not None
        chroma_server.proc.send_signal(signal.SIGSTOP)
        try:
            await assert_unavailable_fast(index.ping)
        finally:
            chroma_server.proc.send_signal(signal.SIGCONT)
        await index.ping()
    finally:
        await index.aclose()


class _StallingChroma:
    """A loopback HTTP server that answers Chroma's heartbeat and then leaves every other
    request without an answer until ``release`` is set: a Chroma server that hangs right
    after it looked healthy."""

    def __init__(self, *, heartbeat: bool = True) -> None:
        self.release = threading.Event()
        self.heartbeats = 0  # one per connection attempt (chromadb's client asks first)
        self.stalled = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server looks for
                if self.path == "/api/v2/heartbeat":
                    outer.heartbeats += 1
                if self.path == "/api/v2/heartbeat" and heartbeat:
                    body = b'{"nanosecond heartbeat": 1}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                outer.stalled += 1
                outer.release.wait(30)
                self.close_connection = True  # then hang up without an answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# Slow, as the next one: fault injection (a server that hangs), waited out through timeouts.
@pytest.mark.slow
async def test_a_server_that_stalls_after_its_heartbeat_fails_the_calls_in_bounded_time(
    embedder: Embedder,
) -> None:
    """chromadb's client constructor sends requests with no timeout; a server that answers
    the heartbeat and then hangs must not hang every index call (they wait behind the
    connection lock) for good."""
    fake = _StallingChroma()
    # a loopback heartbeat takes milliseconds; 1.5 s leaves room for a loaded machine
    index = VectorIndex.http(
        f"http://127.0.0.1:{fake.port}", embedder, connect_timeout=1.5, request_timeout=1.0
    )
    try:
        # every call fails within 5 s (a hang fails the test with TimeoutError)
        results = await asyncio.wait_for(
            asyncio.gather(
                index.ping(),
                index.query(DEPLOY, where=None, limit=3, workspace="default"),
                index.count(),
                return_exceptions=True,
            ),
            timeout=5,
        )
        assert all(isinstance(r, IndexUnavailable) for r in results), results
        assert fake.stalled == 1  # one constructor attempt; the others failed at once
        await assert_unavailable_fast(index.ping)  # its thread still waits: no second one
        assert fake.stalled == 1
        fake.release.set()  # the server hangs up; the abandoned constructor ends

        async def constructor_ended() -> tuple[bool, Any]:
            names = [t.name for t in threading.enumerate()]
            return "chroma-connect" not in names, names

        await poll_until(constructor_ended, 5, "the abandoned constructor's thread ended")
        assert fake.heartbeats == 1
        await assert_unavailable_fast(index.ping)  # a new attempt (the server hangs up now)
        # A new connection attempt began with a heartbeat. (Whether it got as far as the
        # stalled request depends on the machine: on a loaded one the heartbeat itself can
        # outlast the short connect timeout; either way the call failed fast.)
        assert fake.heartbeats == 2
    finally:
        await index.aclose()
        fake.close()


@pytest.mark.slow
async def test_calls_that_waited_for_a_failed_connection_attempt_fail_with_it(
    embedder: Embedder,
) -> None:
    """A server that accepts connections and answers nothing (not even the heartbeat): the
    calls waiting behind one connection attempt must not each try again in turn, which
    would cost every call the connect timeout of all the calls before it."""
    fake = _StallingChroma(heartbeat=False)
    index = VectorIndex.http(
        f"http://127.0.0.1:{fake.port}", embedder, connect_timeout=1.0, request_timeout=1.0
    )
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(index.count() for _ in range(5)), return_exceptions=True), timeout=30
        )
        assert all(isinstance(r, IndexUnavailable) for r in results), results
        # one connect timeout, not five: the server was asked for one heartbeat, not five
        # in a row (what the time taken, ~1 s against ~5 s, told before)
        assert fake.stalled == 1, fake.stalled
        await assert_unavailable_fast(index.count)  # a later call tries again
        assert fake.stalled == 2
    finally:
        await index.aclose()
        fake.close()


async def test_a_text_prepared_as_the_workers_finish_is_still_embedded(
    tmp_path: Path, embedder: Embedder
) -> None:
    """A text handed to ``prepare`` in the same turn of the event loop in which both
    embedding workers finish (their last texts done, nothing else queued) must start a
    worker: a finished worker is no longer one that will pick it up. This is the order of
    events under load, when a blocking call held the loop while both workers finished."""
    gate = threading.Event()
    workers: set[int] = set()  # the threads the workers embed in

    class Gated:
        model_id = "gated"

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            workers.add(threading.get_ident())
            gate.wait(10)
            return embedder.embed(texts)

    # A worker thread hands its result to the loop with call_soon_threadsafe: count those.
    loop = asyncio.get_running_loop()
    handed, hand = threading.Semaphore(0), loop.call_soon_threadsafe

    def counted_hand(callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        handle = hand(callback, *args, context=context)
        if threading.get_ident() in workers:
            handed.release()
        return handle

    idx = VectorIndex.embedded(tmp_path / "chroma", Gated())  # type: ignore[arg-type]  # a stub embedder
    loop.call_soon_threadsafe = counted_hand  # type: ignore[method-assign]  # observed
    try:
        first = asyncio.ensure_future(idx.prepare(["first text"]))
        second = asyncio.ensure_future(idx.prepare(["second text"]))

        async def both_waiting() -> tuple[bool, Any]:
            return len(workers) == 2, len(workers)

        await poll_until(both_waiting, 10, "both workers waiting in their threads")
        gate.set()
        # On purpose the loop is held (a blocking wait, no await) until both workers'
        # threads have finished and handed their results to it, as a blocking call (a
        # Chroma upsert) holds it in the server: both results arrive in one turn.
        for _ in range(2):
            assert handed.acquire(timeout=10), "a worker's result never reached the loop"
        late: list[asyncio.Future[None]] = []
        # Runs in the turn that delivers both threads' results, after them: the workers end
        # in the next turn, and this prepare() looks for a worker in that same turn, just
        # after they have ended (and before their done-callbacks have run).
        asyncio.get_running_loop().call_soon(
            lambda: late.append(asyncio.ensure_future(idx.prepare(["late text"])))
        )
        await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
        await asyncio.wait_for(late[0], timeout=10)
    finally:
        del loop.call_soon_threadsafe  # the loop's own method again
        gate.set()
        await idx.aclose()


async def test_prepare_returns_even_when_the_embedder_answers_wrongly(tmp_path: Path) -> None:
    """``prepare`` never leaves a caller waiting: an embedder that returns the wrong number of
    vectors (here none) fails the preparation, which the later upsert then does itself."""

    class NoVectors:
        model_id = "no-vectors"

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            return []

    idx = VectorIndex.embedded(tmp_path / "chroma", NoVectors())  # type: ignore[arg-type]  # a stub embedder
    try:
        await asyncio.wait_for(idx.prepare(["a text"]), timeout=10)
        await asyncio.wait_for(idx.prepare(["another text"]), timeout=10)
    finally:
        await idx.aclose()


async def test_index_searches_with_ef_search_even_for_an_older_collection(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Chroma's default ef_search (100) missed up to 3 of the exact top 10 on the quality
    benchmark; the index searches with EF_SEARCH, also on a collection made before it was
    set (Chroma reads it when it opens the index, so it is set before the first search)."""
    import chromadb
    from chromadb.config import Settings

    from app.search.chroma_client import EF_SEARCH

    def client_of(path: Path) -> chromadb.ClientAPI:  # the server's settings, one per path
        return chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False)
        )

    path = tmp_path / "chroma"
    client = client_of(path)
    client.create_collection(
        "decisions", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    assert client.get_collection("decisions").configuration["hnsw"]["ef_search"] == 100
    idx = VectorIndex.embedded(path, embedder)
    fresh = VectorIndex.embedded(tmp_path / "fresh", embedder)
    try:
        await idx.upsert([entry("a", DEPLOY)])
        assert [h.id for h in await idx.query(DEPLOY, limit=1, workspace="default")] == ["a"]
        hnsw = client.get_collection("decisions").configuration["hnsw"]
        assert hnsw["ef_search"] == EF_SEARCH == 400
        await fresh.upsert([entry("b", DEPLOY)])
        made = client_of(tmp_path / "fresh").get_collection("decisions")
        assert made.configuration["hnsw"]["ef_search"] == EF_SEARCH
        assert made.configuration["hnsw"]["sync_threshold"] == 100  # the other setting kept
    finally:
        await idx.aclose()
        await fresh.aclose()


async def test_distances_are_the_cosine_distances_of_stored_vectors(
    tmp_path: Path, embedder: Embedder
) -> None:
    """``distances`` (a hybrid result the vector side did not find) gives what a query
    would: the cosine distance to the stored vector; an id the index does not hold is left
    out."""
    idx = VectorIndex.embedded(tmp_path / "chroma", embedder)
    try:
        await idx.upsert([entry("a", DEPLOY), entry("b", "Bake bread for the team party")])
        vector = await idx.embed_query("roll out the login service")
        hits = {
            h.id: h.distance for h in await idx.query_vector(vector, limit=2, workspace="default")
        }
        got = await idx.distances(vector, ["a", "b", "missing"], workspace="default")
        assert set(got) == {"a", "b"}
        for key, distance in got.items():
            assert abs(distance - hits[key]) < 1e-5, (key, distance, hits[key])
        assert await idx.distances(vector, [], workspace="default") == {}
    finally:
        await idx.aclose()
