"""Building a Chroma client: embedded (``PersistentClient``) or a ``chroma run`` server, and
the collection settings we need (app.search.chroma connects lazily through these).

- Chroma's HTTP client has no timeout (``httpx.Client(timeout=None)``) and its constructor makes
  three requests: a short heartbeat probe goes first, the constructor runs in a thread of its
  own that is waited for a bounded time, then the session gets finite timeouts.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.api.client import Client
from chromadb.api.collection_configuration import UpdateHNSWConfiguration
from chromadb.api.models.Collection import Collection
from chromadb.config import Settings

# Our collections have no embedding function (the vectors are ours), which Chroma stores as its
# "legacy" kind and warns about whenever a collection's configuration is read (``_tuned``). Set
# once here: catch_warnings() around the read would not be thread-safe (it runs in workers).
warnings.filterwarnings(
    "ignore", "legacy embedding function config", DeprecationWarning, r"chromadb\."
)

# httpx logs each of Chroma's HTTP requests at INFO (several per call): requests, not events.
logging.getLogger("httpx").setLevel(logging.WARNING)

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
# How many writes Chroma keeps in its index before it persists it. Every single upsert costs
# more the more writes are waiting, while a persist costs little once: a low threshold keeps
# each upsert near its cost right after a persist (docs/performance-history.md).
SYNC_THRESHOLD = 100
# How many candidates the HNSW graph search keeps (hnswlib's ef at query time). Chroma's
# default of 100 lost a share of the exact top 10 at 10,000 decisions on the quality
# benchmark; 400 keeps nearly all of it for a little more query time, and a denser graph
# made every upsert slower instead (docs/QUALITY.md has the recall figures). Chroma reads it
# when it opens the index, so a collection made before this was set gets it at the next
# start (see ``_tuned``).
EF_SEARCH = 400


def _settings() -> Settings:
    # A fresh object each time: chromadb.HttpClient mutates the Settings it is given.
    return Settings(anonymized_telemetry=False)


def _built(client: ClientAPI) -> Client:
    """What chromadb's factories build: they are annotated with the abstract ClientAPI, but
    make a Client, which (unlike ClientAPI) has ``close``."""
    return cast(Client, client)


def embedded_connector(path: Path) -> Callable[[], Client]:
    """Builds an in-process client persisted under ``path`` (the directory is made on use)."""
    target = Path(path)

    def connect() -> Client:
        target.mkdir(parents=True, exist_ok=True)
        return _built(chromadb.PersistentClient(path=str(target), settings=_settings()))

    return connect


def http_connector(
    url: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    request_timeout: float = REQUEST_TIMEOUT_S,
) -> Callable[[], Client]:
    """Builds a client of the server at ``url``: heartbeat first, then finite timeouts.

    chromadb's constructor sends its requests with no timeout, so it runs in a daemon thread
    that is waited for ``connect_timeout + request_timeout``: a server that answers the
    heartbeat and then stalls costs the caller that long, not forever. The abandoned thread
    ends when the server answers or closes; until then further attempts fail at once instead
    of starting another, and a client it builds late is closed."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    ssl = parts.scheme == "https"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if ssl else 8000)
    base = f"{parts.scheme}://{parts.netloc}"
    in_flight: list[threading.Thread] = []  # the constructor thread of the last attempt

    def connect() -> Client:
        if in_flight and in_flight[0].is_alive():
            raise TimeoutError("an earlier attempt to connect to the Chroma server still waits")
        httpx.get(f"{base}/api/v2/heartbeat", timeout=connect_timeout).raise_for_status()
        outcome: list[Client | BaseException] = []
        guard = threading.Lock()
        abandoned = False

        def build() -> None:
            try:
                client = _built(
                    chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=_settings())
                )
            except BaseException as exc:  # handed to the waiting caller
                outcome.append(exc)
                return
            with guard:
                if not abandoned:
                    outcome.append(client)
                    return
            client.close()  # nobody waits for it any more

        thread = threading.Thread(target=build, name="chroma-connect", daemon=True)
        in_flight[:] = [thread]
        thread.start()
        thread.join(connect_timeout + request_timeout)
        with guard:
            if not outcome:
                abandoned = True
                raise TimeoutError("the Chroma server did not answer the client's set-up in time")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        session = getattr(getattr(result, "_server", None), "_session", None)
        if isinstance(session, httpx.Client):
            session.timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
        return result

    return connect


def tuned(client: ClientAPI, collection: Collection) -> Collection:
    """A collection made before SYNC_THRESHOLD or EF_SEARCH was set gets them now. Chroma
    reads both when it first opens the index, which has not happened yet in this process
    (a change made after that takes effect at the next start)."""
    configuration: Mapping[str, Any] | None = collection.configuration  # none on old ones
    hnsw = (configuration or {}).get("hnsw") or {}
    changes: UpdateHNSWConfiguration = {}
    if hnsw.get("sync_threshold", SYNC_THRESHOLD) > SYNC_THRESHOLD:
        changes["sync_threshold"] = SYNC_THRESHOLD
    if hnsw.get("ef_search", EF_SEARCH) < EF_SEARCH:
        changes["ef_search"] = EF_SEARCH
    if not changes:
        return collection
    collection.modify(configuration={"hnsw": changes})
    return client.get_collection(collection.name)
