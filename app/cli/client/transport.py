"""The one HTTP call of a client command, and every way it can fail as one line.

``CSTP_URL`` is accepted with or without a scheme and with or without ``/cstp``; the bearer
token is checked for characters a header cannot carry before anything is sent. Whatever goes
wrong (server unreachable, token refused, HTTP error, JSON-RPC error) becomes a
:class:`ClientError`: exactly one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import json
import socket
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click
import httpx

from .render import echo, one_line

DEFAULT_URL = "http://127.0.0.1:9991"
TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class ClientError(click.ClickException):
    """A failure shown as exactly one line on stderr, exit code 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: Any = None) -> None:
        echo(self.message, err=True)


def fail(message: str) -> NoReturn:
    raise ClientError(message)


def endpoint(url: str) -> str:
    """``CSTP_URL`` as given (with or without ``/cstp``, with or without a scheme) -> the
    JSON-RPC endpoint."""
    url = given = url.strip()
    if not url:
        fail("CSTP_URL is empty: set it to the server, e.g. http://127.0.0.1:9991")
    if "://" not in url:
        url = f"http://{url}"
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        fail(f"CSTP_URL must be an http:// or https:// address, got {url!r}")
    url = url.rstrip("/")
    if not urlsplit(url).netloc:
        fail(f"CSTP_URL has no host: {given!r}, e.g. http://127.0.0.1:9991")
    if not url.endswith("/cstp"):
        url = f"{url}/cstp"
    return url


def _connect_reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, socket.gaierror):
            return "host name not found"
        if isinstance(seen, TimeoutError):
            return "connection timed out"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "host name not found"
    return one_line(str(exc)) or type(exc).__name__


class Caller:
    """One JSON-RPC call per command, with the connection options of that command."""

    def __init__(self, url: str, token: str | None, as_json: bool) -> None:
        self.url = url
        self.token = token
        self.as_json = as_json

    def call(self, method: str, params: dict[str, Any]) -> Any:
        url = endpoint(self.url)
        token = (self.token or "").strip()
        if not token:
            fail("no token: set CSTP_TOKEN (or pass --token) to a token the server knows")
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            fail("CSTP_TOKEN holds characters a bearer token cannot have (spaces, non-ASCII)")
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        try:
            with httpx.Client(timeout=TIMEOUT, follow_redirects=False) as client:
                response = client.post(url, json=body, headers=headers)
        except httpx.ConnectTimeout:
            fail(f"cannot reach the CSTP server at {url}: connection timed out")
        except httpx.TimeoutException:
            fail(f"the CSTP server at {url} did not answer within {TIMEOUT.read:g} s")
        except httpx.ConnectError as exc:
            fail(f"cannot reach the CSTP server at {url}: {_connect_reason(exc)}")
        except httpx.HTTPError as exc:
            fail(f"cannot talk to the CSTP server at {url}: {_connect_reason(exc)}")
        except httpx.InvalidURL as exc:
            fail(f"CSTP_URL is not a usable address ({url}): {exc}")
        return self._result(url, response)

    @staticmethod
    def _result(url: str, response: httpx.Response) -> Any:
        status = response.status_code
        if status == 401:
            fail(
                "the server refused the token: set CSTP_TOKEN (or --token) to a token "
                f"the server knows ({_http_detail(response) or 'HTTP 401'})"
            )
        if status == 404:
            fail(f"no CSTP endpoint at {url} (HTTP 404): check CSTP_URL")
        if status == 413:
            fail(f"the request is too large for the server at {url} (HTTP 413)")
        if status != 200:
            detail = _http_detail(response)
            fail(
                f"the CSTP server at {url} answered HTTP {status}"
                + (f": {detail}" if detail else "")
            )
        try:
            answer = response.json()
        except ValueError:
            fail(f"the server at {url} did not answer with JSON: is CSTP_URL a CSTP server?")
        if not isinstance(answer, dict) or not ("result" in answer or "error" in answer):
            fail(f"the server at {url} did not answer with a JSON-RPC response")
        if "error" in answer:
            fail(rpc_error_line(answer["error"]))
        return answer["result"]


def _http_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return one_line(response.reason_phrase or "")
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return one_line(body[key])[:200]
    return one_line(response.reason_phrase or "")


def rpc_error_line(error: Any) -> str:
    """``error -32602 Invalid params: confidence must be between 0.0 and 1.0``."""
    if not isinstance(error, dict):
        return f"error: {one_line(json.dumps(error, ensure_ascii=False))}"
    code = error.get("code")
    message = error.get("message") or "error"
    detail = _error_detail(error.get("data"))
    line = f"error {code} {message}"
    if detail and detail not in message:
        line += f": {detail}"
    return one_line(line)


def _error_detail(data: Any) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        if "field" in data or "error" in data:
            return " ".join(str(p) for p in (data.get("field"), data.get("error")) if p)
        if isinstance(data.get("errors"), list):
            return "; ".join(_error_detail(item) for item in data["errors"])
        if "retryAfterMs" in data:
            return f"retry in {float(data['retryAfterMs']) / 1000:g} s"
        if set(data) == {"id"}:
            return f"no decision {data['id']}"
        if set(data) == {"method"}:
            return str(data["method"])
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
