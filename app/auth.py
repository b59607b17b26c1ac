"""Bearer tokens → principals (agent, workspace, scopes).

Two kinds of token: the configuration's (``CSTP_AUTH_TOKENS``, the tokens file, the local
token), held in memory as SHA-256 digests and compared in constant time, all of workspace
``default`` and role ``agent``; and the database's (``cstp tokens create``), looked up by the
same digest when no configured token matches, behind a cache of at most a second
(app.access.lookup, which says how it is invalidated). The configured tokens stay the fast
path: a call with one never reaches the database.

With no tokens configured the server does not run open: ``ensure_local_token`` creates one
for agent ``local`` and keeps it in the data dir (mode 0600) so it survives restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from .config import ConfigError, Settings, add_token, parse_tokens
from .scopes import Principal

if TYPE_CHECKING:
    from .access.lookup import TokenLookup

LOCAL_AGENT = "local"
LOCAL_TOKEN_FILE = "local-token"


class TokenTable:
    """Looks a presented token up against every known token, without early exit."""

    def __init__(self) -> None:
        self._entries: list[tuple[bytes, Principal]] = []
        self._database: TokenLookup | None = None

    def use_database(self, lookup: TokenLookup) -> None:
        """Look a token no configured one matches up in the database too."""
        self._database = lookup

    def add(self, token: str, principal: Principal) -> None:
        """Let ``token`` in as ``principal``; only its SHA-256 is kept."""
        self._entries.append((token_digest(token), principal))

    def __len__(self) -> int:
        return len(self._entries)

    async def principal_for(self, authorization: str | None) -> Principal | None:
        """Who the bearer token of ``authorization`` lets in; None: no one (a revoked or
        expired database token included). Raises app.access.lookup.TokenStoreUnavailable
        when the token could only be in the database and the database cannot be read."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        return await self.principal_of(token_digest(token))

    async def principal_of(self, presented: bytes) -> Principal | None:
        """Who the token whose SHA-256 is ``presented`` lets in (a console session keeps the
        digest, never the token); None and TokenStoreUnavailable as ``principal_for``."""
        found: Principal | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is not None or self._database is None:
            return found
        return await self._database.principal(presented)


def token_digest(token: str) -> bytes:
    """The SHA-256 a token is known by (never the token itself)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def load_tokens(settings: Settings) -> dict[str, str]:
    """Tokens from CSTP_AUTH_TOKENS and the tokens file (token -> agent)."""
    tokens = dict(settings.auth_tokens)
    if settings.tokens_file is not None:
        try:
            raw = settings.tokens_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"CSTP_TOKENS_FILE cannot be read: {exc.strerror}") from None
        for token, agent in parse_tokens(raw, "CSTP_TOKENS_FILE").items():
            add_token(tokens, token, agent, "CSTP_AUTH_TOKENS and CSTP_TOKENS_FILE")
    return tokens


def ensure_local_token(data_dir: Path) -> tuple[str, bool]:
    """The persisted token of agent ``local``: (token, created_now)."""
    path = data_dir / LOCAL_TOKEN_FILE
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, False
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)
    return token, True
