"""Checkpoints of the audit chain's head: taken (``cstp audit checkpoint``), kept outside the
database, read back and checked against the chain (``cstp audit verify --checkpoint``). A
checkpoint beyond the chain's end shows entries were cut off (``truncated``)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from .canonical import encode, iso_utc
from .problems import Problem
from .repository import entries as store

CHECKPOINT_FORMAT = "cstp-audit-checkpoint/1"
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    hash: str
    time: str
    keyed: bool
    mac: str
    source: str = ""

    def signed(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "seq": self.seq,
            "hash": self.hash,
            "time": self.time,
            "keyed": self.keyed,
        }

    def as_json(self) -> str:
        return json.dumps({**self.signed(), "mac": self.mac}, separators=(", ", ": "))


def checkpoint_mac(secret: bytes | None, body: dict[str, Any]) -> str:
    message = encode(body)
    if secret is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def take_checkpoint(conn: Connection, secret: bytes | None, now: datetime) -> Checkpoint:
    """The chain's head now (seq 0 and the genesis hash for an empty chain), with its MAC."""
    seq, hashed = store.head(conn, lock=False)
    draft = Checkpoint(seq, hashed, iso_utc(now), secret is not None, "")
    return Checkpoint(seq, hashed, draft.time, draft.keyed, checkpoint_mac(secret, draft.signed()))


def read_checkpoint(text: str, source: str) -> Checkpoint:
    """A checkpoint from its JSON text; ValueError saying why it is not one."""
    try:
        data = json.loads(text)
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a checkpoint (format {data.get('format')!r})")
        if type(data["seq"]) is not int or data["seq"] < 0:
            raise ValueError("its seq is not a whole number")
        for name in ("hash", "mac"):
            if not (isinstance(data[name], str) and _HEX64.fullmatch(data[name])):
                raise ValueError(f"its {name} is not 64 hexadecimal digits")
        point = Checkpoint(
            seq=data["seq"],
            hash=str(data["hash"]),
            time=str(data["time"]),
            keyed=bool(data["keyed"]),
            mac=str(data["mac"]),
            source=source,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: not a checkpoint ({exc})") from None
    return point


def check_point(
    conn: Connection, point: Checkpoint, secret: bytes | None, last: int
) -> list[Problem]:
    where = f"checkpoint {point.source} ({point.time})"

    def problem(why: str) -> list[Problem]:
        return [Problem("checkpoint", point.seq, None, None, f"{where}{why}")]

    if point.keyed and secret is None:
        return problem(" is keyed: set the audit key")
    if secret is not None and not point.keyed:
        # Its MAC is a plain SHA-256 anyone can compute: a file that says it was taken
        # without the key could be anyone's, e.g. one naming an earlier head to hide a cut.
        return problem(
            " was taken without the audit key, which is set: anyone could have written it "
            "(take checkpoints with the key)"
        )
    if not hmac.compare_digest(checkpoint_mac(secret, point.signed()), point.mac):
        return problem(": its MAC does not hold (the file was edited, or made with another key)")
    if point.seq > last:
        return [
            Problem(
                "truncated",
                last + 1,
                None,
                None,
                f"the chain ends at seq {last}, but {where} recorded seq {point.seq}: "
                f"entries {last + 1}..{point.seq} were cut off",
                last=point.seq,
            )
        ]
    if point.seq == 0:
        return []
    stored = store.hash_at(conn, point.seq)
    if stored is None:
        return problem(": the entry is missing")
    if not hmac.compare_digest(stored.encode(), point.hash.encode()):
        return problem(": the entry's hash is not the one recorded (the chain was rewritten)")
    return []
