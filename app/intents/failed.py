"""The audit row of an announcement that did not succeed: refused as invalid (-32602) or rate
limited (-32002), or failed on the way (-32004, -32005, -32008, ...).

Every such call is recorded, and a rate limit does not stop an agent from sending them: it only
turns them into rate-limited rows. So what a row keeps of the caller's values is bounded, and
each value over its bound is stored as a marker that says how long it was and its SHA-256, so
that a copy kept by the agent can still be matched. At most ``MAX_STORED_BYTES`` bytes of a
failed call's own values reach the table (docs/AUDIT.md):

- ``intent`` and ``context``: a text of at most ``TEXT_BYTES`` bytes of UTF-8 is kept as it
  is; a longer one keeps its beginning and ends with ``… [truncated: N bytes, sha256 H]``,
  the whole at most ``TEXT_BYTES`` bytes, N and H being those of the text as sent (UTF-8);
- ``metadata``: an object whose stored JSON is at most ``METADATA_BYTES`` bytes is kept as
  it is; a larger one is ``{"truncated": true, "bytes": N, "sha256": H}``, N and H those of
  its compact JSON with sorted keys (``json.dumps(value, sort_keys=True, separators=(",",
  ":"), ensure_ascii=False)`` in UTF-8); anything but an object is not kept;
- ``correlation_id``, ``category``, ``stakes``: cut to 128, 64 and 16 characters (the
  columns' sizes); ``confidence`` only when it is a number.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from app.audit.chain import append
from app.db.intents import Intent
from app.errors import RATE_LIMITED, CstpError
from app.operations.context import CallContext

from . import repository

TEXT_BYTES = 1024
METADATA_BYTES = 1024
CORRELATION_CHARS = 128
CATEGORY_CHARS = 64
STAKES_CHARS = 16
#: The most a failed call's values take in its row: two texts, the metadata and the three
#: short columns at 4 bytes a character (the largest a character takes in UTF-8).
MAX_STORED_BYTES = (
    2 * TEXT_BYTES + METADATA_BYTES + 4 * (CORRELATION_CHARS + CATEGORY_CHARS + STAKES_CHARS)
)


async def record_failure(ctx: CallContext, raw: dict[str, Any], error: CstpError) -> None:
    """The audit row of an announcement that did not succeed (rate limited or failed)."""
    correlation = _storable(raw.get("correlationId") or raw.get("correlation_id"))
    intent = Intent(
        id=ctx.services.runtime.uuid(),
        correlation_id=correlation[:CORRELATION_CHARS] if isinstance(correlation, str) else "",
        agent=ctx.agent,
        workspace=ctx.workspace,
        received_at=ctx.services.runtime.now(),
        outcome="rate_limited" if error.code == RATE_LIMITED else "failed",
        error_code=error.code,
        intent=bounded_text(raw.get("intent")),
        context=bounded_text(raw.get("context")),
        category=_short(raw.get("category"), CATEGORY_CHARS),
        stakes=_short(raw.get("stakes"), STAKES_CHARS),
        confidence=_number(raw.get("confidence")),
        metadata_=bounded_metadata(raw.get("metadata")),
    )
    repository.add_refused(ctx.session, intent)
    append(ctx.session, intent)


def _marker(size: int, digest: str) -> str:
    return f"… [truncated: {size} bytes, sha256 {digest}]"


def bounded_text(value: Any) -> str | None:
    """``value`` as a failed call's row keeps it: None unless a string; see the module."""
    if not isinstance(value, str):
        return None
    stored: str = _storable(value)
    if len(stored) <= TEXT_BYTES // 4 or len(stored.encode("utf-8", "surrogatepass")) <= TEXT_BYTES:
        return stored
    sent = value.encode("utf-8", "surrogatepass")
    marker = _marker(len(sent), hashlib.sha256(sent).hexdigest())
    room = TEXT_BYTES - len(marker.encode())
    # At most ``room`` bytes of the beginning; a character cut in two (or a lone surrogate,
    # which no database stores) is left out.
    head = stored[:room].encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return head + marker


def bounded_metadata(value: Any) -> dict[str, Any] | None:
    """``value`` as a failed call's row keeps it: None unless an object; see the module."""
    if not isinstance(value, dict):
        return None
    try:
        stored: dict[str, Any] = _storable(value)
        # as the JSON column writes it (json.dumps' defaults: ASCII, so a character a byte)
        if len(json.dumps(stored)) <= METADATA_BYTES:
            return stored
        sent = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    except RecursionError:  # nested too deeply to store; the row keeps everything else
        return None
    return {"truncated": True, "bytes": len(sent), "sha256": hashlib.sha256(sent).hexdigest()}


def _short(value: Any, chars: int) -> str | None:
    if not isinstance(value, str):
        return None
    short: str = _storable(value[:chars])
    return short or None


def _number(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past any float
        return None


def _storable(value: Any) -> Any:
    """A request value as the audit row can hold it: NUL characters (which Postgres text
    cannot store, and for which the call itself was refused) become U+FFFD, and a number JSON
    cannot hold (NaN, Infinity: refused too, and read only by the MCP transport's parser) its
    name as text."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value
