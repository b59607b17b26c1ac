"""What every client command shares on the way in: the connection options and the parsing of
repeatable ``KEY=VALUE`` / ``TYPE:TEXT`` options into JSON-RPC params.

Values are not validated here but by the server, so the client never disagrees with it: a bad
value comes back as the server's -32602 naming the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from .transport import DEFAULT_URL, Caller, ClientError

STAKES = ("low", "medium", "high", "critical")
STATUSES = ("pending", "reviewed")
OUTCOMES = ("success", "partial", "failure", "abandoned")


def parse_value(raw: str) -> Any:
    """``true`` -> True, ``42`` -> 42, ``{"a": 1}`` -> dict; anything else stays a string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_pairs(values: Sequence[str], option: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} must look like key=value", param_hint=option)
        out[key.strip()] = parse_value(raw)
    return out


def add_pairs(
    params: dict[str, Any], key: str, values: Sequence[str], option: str
) -> dict[str, Any]:
    """Set ``params[key]`` to the ``KEY=VALUE`` items of ``option``, if any were given."""
    pairs = parse_pairs(values, option)
    if pairs:
        params[key] = pairs
    return params


def parse_reasons(values: Sequence[str]) -> list[dict[str, Any]]:
    reasons = []
    for item in values:
        kind, sep, text = item.partition(":")
        if not sep or not kind.strip() or not text.strip():
            raise click.BadParameter(
                f"{item!r} must look like type:text, e.g. analysis:ACID needed",
                param_hint="--reason",
            )
        reasons.append({"type": kind.strip(), "text": text.strip()})
    return reasons


def compact(params: dict[str, Any]) -> dict[str, Any]:
    """Leave out options that were not given (None, empty tuples)."""
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in params.items()
        if v is not None and v != ()
    }


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--url``, ``--token`` and ``--json`` on every client command; the command gets a
    ready :class:`Caller` as its first argument."""

    @click.option(
        "--json", "as_json", is_flag=True, help="Print the JSON-RPC result as JSON (for scripts)."
    )
    @click.option(
        "--token", envvar="CSTP_TOKEN", show_envvar=True, default=None, help="Bearer token."
    )
    @click.option(
        "--url",
        envvar="CSTP_URL",
        show_envvar=True,
        default=DEFAULT_URL,
        show_default=True,
        help="Server address (with or without /cstp).",
    )
    @functools.wraps(fn)
    def wrapper(url: str, token: str | None, as_json: bool, **kwargs: Any) -> Any:
        try:
            return fn(Caller(url, token, as_json), **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # an answer of an unexpected shape: one line, no traceback
            raise ClientError(
                f"unexpected answer from the CSTP server: {type(exc).__name__}: {exc}"
            ) from None

    return wrapper
