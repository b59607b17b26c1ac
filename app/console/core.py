"""What every console page shares: who is signed in, the calls it makes, and how a refused
call is shown.

A page's reads and every action run through the operation runner (app.operations.runner)
with face ``console``: scoped, rate limited, audited and chained exactly as the same call
over JSON-RPC, as the signed-in token's agent. A ``CstpError`` becomes a page with the
error's own message (safe to show, as on the wire) and the matching HTTP status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response
from litestar.response import Redirect, Template
from sqlalchemy.exc import SQLAlchemyError

from app.access.lookup import TokenStoreUnavailable
from app.errors import (
    CONFLICT,
    DECISION_NOT_FOUND,
    FORBIDDEN,
    INVALID_PARAMS,
    RATE_LIMITED,
    STORAGE_ERROR,
    UNAVAILABLE,
    CstpError,
)
from app.operations.context import CONSOLE
from app.scopes import APPROVE, AUDIT, READ

from .sessions import SESSION_COOKIE, Person, SessionStore, same

if TYPE_CHECKING:
    from app.auth import TokenTable
    from app.operations.registry import Registry
    from app.operations.runner import Runner
    from app.services import Services

log = logging.getLogger("cstp.console")

LOGIN = "/console/login"

#: The pages of the navigation, each with the scope that shows it.
PAGES = (
    ("decisions", "Decisions", READ),
    ("ready", "Ready", READ),
    ("calibration", "Calibration", READ),
    ("guardrails", "Guardrails", READ),
    ("approvals", "Approvals", APPROVE),
    ("audit", "Audit", AUDIT),
)

#: How a refused call shows: its HTTP status and the page's title, by error code.
SHOWN = {
    FORBIDDEN: (403, "Not allowed"),
    DECISION_NOT_FOUND: (404, "Not found"),
    INVALID_PARAMS: (400, "Not accepted"),
    CONFLICT: (409, "Already settled"),
    RATE_LIMITED: (429, "Too many requests"),
    STORAGE_ERROR: (503, "Unavailable"),
    UNAVAILABLE: (503, "Unavailable"),
}


class NotSignedIn(Exception):
    """No live session: the page answers with a redirect to the sign-in page."""


class Refused(Exception):
    """A page or action that cannot be done: shown as an error page with ``status``."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


@dataclass
class Console:
    registry: Registry
    runner: Runner
    tokens: TokenTable
    services: Services
    sessions: SessionStore

    async def person(self, request: Request[Any, Any, Any]) -> Person:
        """Who is signed in, or NotSignedIn. The token is looked up on every request: a
        revoked or expired one ends the session at once."""
        now = self.services.runtime.now()
        try:
            found = await self.sessions.find(request.cookies.get(SESSION_COOKIE), now)
            if found is None:
                raise NotSignedIn
            principal = await self.tokens.principal_of(found.token_digest)
        except (TokenStoreUnavailable, SQLAlchemyError, OSError):
            # OSError: asyncpg's refused connection, as the runner says (a database down)
            log.exception("console: the session or its token cannot be read")
            why = "The session store cannot be read; try again shortly."
            raise Refused(503, "Unavailable", why) from None
        if principal is None:
            await self.sessions.end(found.id, now)
            raise NotSignedIn
        person = Person(principal, found.csrf, found.id)
        request.state.console_person = person  # for an error page's navigation
        return person

    async def acting(self, request: Request[Any, Any, Any]) -> tuple[Person, dict[str, str]]:
        """The person and the form of an action (POST), once its CSRF token holds: a form
        without it, or from another session, changes nothing."""
        person = await self.person(request)
        form = await request.form()
        fields = {key: value for key, value in form.items() if isinstance(value, str)}
        if not same(fields.get("csrf"), person.csrf):
            raise Refused(
                403,
                "Form refused",
                "This form did not come from your current session. Reload the page and try again.",
            )
        return person, fields

    async def call(self, person: Person, method: str, params: dict[str, Any]) -> Any:
        """The result of ``method`` as the wire shows it (camelCase builtins), run as the
        signed-in token's agent; a CstpError becomes a Refused page."""
        operation = self.registry.get(method)
        assert operation is not None, method
        try:
            result = await self.runner.run(operation, params, person.principal, face=CONSOLE)
        except CstpError as exc:
            raise refused(exc) from None
        return msgspec.to_builtins(result)

    def require(self, person: Person, scope: str) -> None:
        if not person.principal.may(scope):
            raise Refused(403, "Not allowed", f"Your token does not have the scope '{scope}'.")


def refused(error: CstpError) -> Refused:
    """The page of a refused call: its message, as safe to show as on the wire, and for
    invalid params the field and why."""
    status, title = SHOWN.get(error.code, (500, "Something went wrong"))
    message = error.message
    if error.code == INVALID_PARAMS and isinstance(error.data, dict):
        field, why = error.data.get("field"), error.data.get("error")
        if field and why:
            message = f"{field}: {why}"
    return Refused(status, title, message)


def page(person: Person | None, name: str, context: dict[str, Any], status: int = 200) -> Template:
    """A page of the signed-in person: its navigation shows what their scopes allow."""
    nav = []
    if person is not None:
        nav = [(slug, label) for slug, label, scope in PAGES if person.principal.may(scope)]
    base = {"person": person, "nav": nav, "csrf": person.csrf if person else ""}
    return Template(template_name=name, context={**base, **context}, status_code=status)


def see_other(path: str) -> Redirect:
    return Redirect(path=path, status_code=303)


def not_signed_in(_: Request[Any, Any, Any], __: NotSignedIn) -> Response[Any]:
    return see_other(LOGIN)


def show_refusal(request: Request[Any, Any, Any], exc: Refused) -> Response[Any]:
    person = request.state.get("console_person")
    context = {"title": exc.title, "message": exc.message}
    return page(person, "error.html", context, exc.status)
