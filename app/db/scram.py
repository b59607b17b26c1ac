"""A role's password as PostgreSQL stores it: the SCRAM-SHA-256 verifier, computed here so
that ``cstp db auditor-role`` never sends the plaintext (app.db.readers)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

SCRAM_ITERATIONS = 4096  # PostgreSQL's own default (scram_iterations)


def scram_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802, RFC 7677):
    given as the role's password, it is stored as it is and the plaintext is never sent."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("ascii"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
