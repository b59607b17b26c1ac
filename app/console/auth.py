"""Sign-in and sign-out (SPEC.md, section 10)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template

from app.access.lookup import TokenStoreUnavailable
from app.auth import token_digest

from .core import LOGIN, Console, NotSignedIn, page, see_other
from .sessions import LOGIN_COOKIE, SESSION_COOKIE, SESSION_LIFETIME, new_secret, same

HOME = "/console/decisions"
# The sign-in form's own CSRF value lives this long (seconds): a form older than that is
# refused and shown again.
LOGIN_FORM_SECONDS = 3600


def _secure(request: Request[Any, Any, Any]) -> bool:
    """Secure cookies behind TLS (uvicorn takes the scheme from a trusted proxy's
    X-Forwarded-Proto); a plain-HTTP localhost server could not set them."""
    return request.url.scheme == "https"


def _login_page(request: Request[Any, Any, Any], error: str | None, status: int) -> Template:
    value = new_secret()
    response = page(None, "login.html", {"login_csrf": value, "error": error}, status)
    response.cookies.append(
        Cookie(
            key=LOGIN_COOKIE,
            value=value,
            path=LOGIN,
            max_age=LOGIN_FORM_SECONDS,
            httponly=True,
            samesite="strict",
            secure=_secure(request),
        )
    )
    return response


@get("/login")
async def login_form(request: Request[Any, Any, Any]) -> Template | Redirect:
    console: Console = request.app.state.console
    try:
        await console.person(request)
    except NotSignedIn:
        return _login_page(request, None, 200)
    return see_other(HOME)


@post("/login", status_code=303)
async def sign_in(request: Request[Any, Any, Any]) -> Template | Redirect:
    console: Console = request.app.state.console
    form = await request.form()
    token = form.get("token")
    if not same(form.get("csrf"), request.cookies.get(LOGIN_COOKIE) or ""):
        return _login_page(request, "The sign-in form expired. Please try again.", 403)
    if not isinstance(token, str) or not token.strip():
        return _login_page(request, "Enter a token.", 400)
    token = token.strip()
    try:
        principal = await console.tokens.principal_for(f"Bearer {token}")
    except TokenStoreUnavailable:
        return _login_page(request, "The token store cannot be read; try again shortly.", 503)
    if principal is None:
        return _login_page(request, "That token is not valid (unknown, revoked or expired).", 401)
    now = console.services.runtime.now()
    cookie = await console.sessions.start(principal, token_digest(token), now)
    response = see_other(HOME)
    response.cookies.append(
        Cookie(
            key=SESSION_COOKIE,
            value=cookie,
            path="/console",
            max_age=int(SESSION_LIFETIME.total_seconds()),
            httponly=True,
            samesite="strict",
            secure=_secure(request),
        )
    )
    response.cookies.append(Cookie(key=LOGIN_COOKIE, value="", path=LOGIN, max_age=0))
    return response


@post("/logout", status_code=303)
async def sign_out(request: Request[Any, Any, Any]) -> Redirect:
    console: Console = request.app.state.console
    person, _ = await console.acting(request)
    await console.sessions.end(person.session_id, console.services.runtime.now())
    response = see_other(LOGIN)
    response.cookies.append(Cookie(key=SESSION_COOKIE, value="", path="/console", max_age=0))
    return response


@get("/")
async def home() -> Redirect:
    return see_other(HOME)
