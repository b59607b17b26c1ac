"""Signing secrets, protected at rest.

The server must sign with a subscription's secret, so the secret cannot be kept as a hash
like a token's: it is stored sealed with AES-256-GCM under a key that is never in the
database. The key is ``CSTP_WEBHOOK_KEY`` (32 bytes in base64), or else the file
``webhook.key`` in the data directory, made (mode 0600) the first time a key is needed. Several
server hosts sharing a database must share the key: set CSTP_WEBHOOK_KEY on each, as the
file is per host (docs/OPERATIONS.md, "Webhooks").

Each sealed secret carries its own random 12-byte nonce, and the subscription's id as
associated data, so a sealed secret copied onto another subscription's row does not open.
``key_id`` is a fingerprint of the key (a hash that does not reveal it) stored beside each
sealed secret: a server holding another key says so instead of failing obscurely.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.config import WEBHOOK_KEY_BYTES, Settings, decode_webhook_key

log = logging.getLogger("cstp.webhooks")

KEY_FILE = "webhook.key"
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks: between 24 and 64 bytes
_NONCE_BYTES = 12


class KeyUnavailable(Exception):
    """No sealing key could be had (the key file unreadable, unwritable or malformed)."""


class SecretUnavailable(Exception):
    """A sealed secret cannot be opened: sealed under another key, or damaged."""


def key_id(key: bytes) -> str:
    """The fingerprint of ``key`` stored beside what it sealed (16 hex characters)."""
    return hashlib.sha256(b"cstp webhook key\x00" + key).hexdigest()[:16]


def load_key(settings: Settings, *, create: bool = True) -> bytes:
    """The sealing key: CSTP_WEBHOOK_KEY, else the key file in the data directory, made now
    (mode 0600) when there is none and ``create``. Raises KeyUnavailable."""
    if settings.webhook_key is not None:
        return settings.webhook_key
    path = settings.data_dir / KEY_FILE
    if path.exists():
        return _read_key(path)
    if not create:
        raise KeyUnavailable(f"no webhook key: CSTP_WEBHOOK_KEY is unset and {path} is missing")
    key = os.urandom(WEBHOOK_KEY_BYTES)
    # Written whole under a name of its own, then linked into place: the link fails when
    # another process made the file first (its key is then the one used), and no process
    # ever reads a file half written.
    draft = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(base64.b64encode(key).decode("ascii") + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.link(draft, path)
    except FileExistsError:
        return _read_key(path)
    except OSError as exc:
        raise KeyUnavailable(f"cannot create the webhook key file {path}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            draft.unlink()
    log.warning(
        "webhook signing secrets are sealed with the new key file %s: keep it with the "
        "database, and give every server host sharing the database the same key "
        "(CSTP_WEBHOOK_KEY)",
        path,
    )
    return key


def _read_key(path: Path) -> bytes:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise KeyUnavailable(f"cannot read the webhook key file {path}: {exc.strerror}") from None
    key = decode_webhook_key(text)
    if key is None:
        raise KeyUnavailable(
            f"the webhook key file {path} does not hold {WEBHOOK_KEY_BYTES} bytes in base64"
        )
    return key


def new_secret() -> str:
    """A fresh signing secret in the Standard Webhooks form, ``whsec_<base64>``."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def seal(key: bytes, subscription_id: str, secret: str) -> str:
    """``secret`` sealed for the subscription ``subscription_id``: base64 of nonce and
    ciphertext."""
    nonce = os.urandom(_NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, secret.encode("ascii"), subscription_id.encode())
    return base64.b64encode(nonce + sealed).decode("ascii")


def unseal(key: bytes, subscription_id: str, sealed: str, sealed_with: str) -> str:
    """The secret ``seal`` sealed. Raises SecretUnavailable, naming the key it needs when
    it was sealed under another one than ``key``."""
    if key_id(key) != sealed_with:
        raise SecretUnavailable(
            f"its signing secret was sealed with the webhook key {sealed_with}, and this "
            f"server has the key {key_id(key)}: give it the same CSTP_WEBHOOK_KEY as the "
            "`cstp webhooks add` that made it (or add the subscription again)"
        )
    try:
        raw = base64.b64decode(sealed, validate=True)
        secret = AESGCM(key).decrypt(
            raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], subscription_id.encode()
        )
    except (ValueError, InvalidTag):
        raise SecretUnavailable(
            "its sealed signing secret does not open with the webhook key (damaged, or "
            "copied from another subscription): add the subscription again"
        ) from None
    return secret.decode("ascii")
