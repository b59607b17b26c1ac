"""What a token request must be, checked before anything is written, and the forms of a
token's secret and public id.

- workspace: ``[a-z0-9][a-z0-9-]{0,62}`` (SPEC.md, section 7; app.scopes.WORKSPACE_ID);
- agent: 1 to 128 characters, a letter or digit first, then letters, digits and ``. _ - : @ +
  /``: the name a decision's ``recordedBy`` will show, so nothing a terminal or a log line
  would act on, and no blank;
- role: one of app.scopes.ROLES; scopes, when given: one or more of app.scopes.SCOPES, and
  the token has exactly those instead of its role's;
- lifetime: ``N`` followed by ``s``, ``h`` or ``d`` (seconds, hours, days), at most ten
  years.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

from app.scopes import DEFAULT_ROLE, DEFAULT_WORKSPACE, ROLES, SCOPES, workspace_problem

AGENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,127}")
LIFETIME = re.compile(r"([0-9]{1,10})([shd])")
UNITS = {"s": 1, "h": 3600, "d": 86400}
MAX_LIFETIME = timedelta(days=3650)

SECRET_PREFIX = "cstp_"  # recognisable in a leaked file or a secret scanner's hits
ID_PREFIX = "tok_"
ID = re.compile(r"tok_[0-9a-f]{16}")


class BadRequest(ValueError):
    """A token request that is not valid; the message says which part and why, in one line
    (it never holds a secret: none exists yet)."""


@dataclass(frozen=True)
class TokenRequest:
    """A valid request for a new token."""

    agent: str
    workspace: str = DEFAULT_WORKSPACE
    role: str = DEFAULT_ROLE
    scopes: tuple[str, ...] = ()  # in SCOPES order
    lifetime: timedelta | None = None


def _shown(value: str) -> str:
    """A rejected value, short and printable, for the message."""
    return repr(value[:40] + ("…" if len(value) > 40 else ""))


def workspace(value: str) -> str:
    problem = workspace_problem(value)
    if problem is not None:
        raise BadRequest(f"workspace {_shown(value)} is not a workspace id: {problem}")
    return value


def agent(value: str) -> str:
    if not AGENT.fullmatch(value):
        raise BadRequest(
            f"agent {_shown(value)} is not an agent name: 1 to 128 letters, digits and "
            "'._:@+/-', a letter or digit first"
        )
    return value


def role(value: str) -> str:
    if value not in ROLES:
        raise BadRequest(f"role {_shown(value)} is not one of: {', '.join(ROLES)}")
    return value


def scopes(value: str) -> tuple[str, ...]:
    """``read,announce`` -> the scopes in SCOPES order; an unknown or empty one is refused."""
    given = [s.strip() for s in value.split(",")]
    if not any(given):
        raise BadRequest(f"--scopes names no scope: give one or more of {', '.join(SCOPES)}")
    unknown = [s for s in given if s not in SCOPES]
    if unknown:
        raise BadRequest(f"scope {_shown(unknown[0])} is not one of: {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in given)


def lifetime(value: str) -> timedelta:
    """``90s``, ``12h``, ``30d`` -> the time; at least one second, at most ten years."""
    match = LIFETIME.fullmatch(value.strip())
    if match is None:
        raise BadRequest(
            f"--expires-in {_shown(value)} must be a whole number and a unit: s, h or d "
            "(e.g. 3600s, 12h, 30d)"
        )
    seconds = int(match.group(1)) * UNITS[match.group(2)]
    if seconds < 1 or seconds > MAX_LIFETIME.total_seconds():
        raise BadRequest(f"--expires-in {_shown(value)} must be between 1s and 3650d")
    return timedelta(seconds=seconds)


def token_request(
    agent_name: str,
    workspace_id: str = DEFAULT_WORKSPACE,
    role_name: str = DEFAULT_ROLE,
    scope_list: str | None = None,
    expires_in: str | None = None,
) -> TokenRequest:
    """A request checked part by part (``BadRequest`` names the first part that is wrong)."""
    return TokenRequest(
        agent=agent(agent_name),
        workspace=workspace(workspace_id),
        role=role(role_name),
        scopes=scopes(scope_list) if scope_list is not None else (),
        lifetime=lifetime(expires_in) if expires_in is not None else None,
    )


def effective_scopes(request: TokenRequest) -> list[str]:
    """The scopes the token gets: those given, else its role's (in SCOPES order)."""
    if request.scopes:
        return list(request.scopes)
    return [s for s in SCOPES if s in ROLES[request.role]]


def new_secret() -> str:
    """A new token's secret: 256 random bits, URL-safe, after the recognisable prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    """A token's public id: what ``list`` shows and ``revoke`` takes (64 random bits)."""
    return ID_PREFIX + secrets.token_hex(8)


def secret_digest(secret: str) -> bytes:
    """The SHA-256 of a presented secret, as app.auth computes it for every bearer token."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()
