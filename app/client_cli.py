"""The terminal client: ``cstp query``, ``record``, ``review``, ``get``, ``list``, ``check``,
``announce``, ``calibration`` and ``guardrails`` talk to a running CSTP server over JSON-RPC.

Each command makes one synchronous HTTP request to ``CSTP_URL`` (default
``http://127.0.0.1:9991``; the ``/cstp`` path is added when missing) with the bearer token
``CSTP_TOKEN`` (``--url`` / ``--token`` override them). By default the answer is printed for
people (aligned columns, ``key: value`` lines); ``--json`` prints the JSON-RPC ``result``
as pretty UTF-8 JSON for scripts.

Every failure (server unreachable, token refused, HTTP error, JSON-RPC error) is one line on
stderr and exit code 1, never a traceback. Params are validated by the server, not here, so
the client never disagrees with it: a bad value comes back as the server's -32602 naming the
field.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click
import httpx

DEFAULT_URL = "http://127.0.0.1:9991"
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
TITLE_WIDTH = 50

STAKES = ("low", "medium", "high", "critical")
STATUSES = ("pending", "reviewed")
OUTCOMES = ("success", "partial", "failure", "abandoned")


# --------------------------------------------------------------------------- errors


class ClientError(click.ClickException):
    """A failure shown as exactly one line on stderr, exit code 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))

    def show(self, file: Any = None) -> None:
        _echo(self.message, err=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str) -> NoReturn:
    raise ClientError(message)


# --------------------------------------------------------------------------- transport


def endpoint(url: str) -> str:
    """``CSTP_URL`` as given (with or without ``/cstp``, with or without a scheme) -> the
    JSON-RPC endpoint."""
    url = given = url.strip()
    if not url:
        _fail("CSTP_URL is empty: set it to the server, e.g. http://127.0.0.1:9991")
    if "://" not in url:
        url = f"http://{url}"
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        _fail(f"CSTP_URL must be an http:// or https:// address, got {url!r}")
    url = url.rstrip("/")
    if not urlsplit(url).netloc:
        _fail(f"CSTP_URL has no host: {given!r}, e.g. http://127.0.0.1:9991")
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
    return _one_line(str(exc)) or type(exc).__name__


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
            _fail("no token: set CSTP_TOKEN (or pass --token) to a token the server knows")
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            _fail("CSTP_TOKEN holds characters a bearer token cannot have (spaces, non-ASCII)")
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        try:
            with httpx.Client(timeout=TIMEOUT, follow_redirects=False) as client:
                response = client.post(url, json=body, headers=headers)
        except httpx.ConnectTimeout:
            _fail(f"cannot reach the CSTP server at {url}: connection timed out")
        except httpx.TimeoutException:
            _fail(f"the CSTP server at {url} did not answer within {TIMEOUT.read:g} s")
        except httpx.ConnectError as exc:
            _fail(f"cannot reach the CSTP server at {url}: {_connect_reason(exc)}")
        except httpx.HTTPError as exc:
            _fail(f"cannot talk to the CSTP server at {url}: {_connect_reason(exc)}")
        except httpx.InvalidURL as exc:
            _fail(f"CSTP_URL is not a usable address ({url}): {exc}")
        return self._result(url, response)

    @staticmethod
    def _result(url: str, response: httpx.Response) -> Any:
        status = response.status_code
        if status == 401:
            _fail(
                "the server refused the token: set CSTP_TOKEN (or --token) to a token "
                f"the server knows ({_http_detail(response) or 'HTTP 401'})"
            )
        if status == 404:
            _fail(f"no CSTP endpoint at {url} (HTTP 404): check CSTP_URL")
        if status == 413:
            _fail(f"the request is too large for the server at {url} (HTTP 413)")
        if status != 200:
            detail = _http_detail(response)
            _fail(f"the CSTP server at {url} answered HTTP {status}"
                  + (f": {detail}" if detail else ""))
        try:
            answer = response.json()
        except ValueError:
            _fail(f"the server at {url} did not answer with JSON: is CSTP_URL a CSTP server?")
        if not isinstance(answer, dict) or not ("result" in answer or "error" in answer):
            _fail(f"the server at {url} did not answer with a JSON-RPC response")
        if "error" in answer:
            _fail(rpc_error_line(answer["error"]))
        return answer["result"]


def _http_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.reason_phrase or "")
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return _one_line(body[key])[:200]
    return _one_line(response.reason_phrase or "")


def rpc_error_line(error: Any) -> str:
    """``error -32602 Invalid params: confidence must be between 0.0 and 1.0``."""
    if not isinstance(error, dict):
        return f"error: {_one_line(json.dumps(error, ensure_ascii=False))}"
    code = error.get("code")
    message = error.get("message") or "error"
    detail = _error_detail(error.get("data"))
    line = f"error {code} {message}"
    if detail and detail not in message:
        line += f": {detail}"
    return _one_line(line)


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


# --------------------------------------------------------------------------- output


def _echo(text: str = "", err: bool = False) -> None:
    try:
        click.echo(text, err=err)
    except UnicodeEncodeError:
        click.echo(text.encode("utf-8"), err=err)


def print_json(result: Any) -> None:
    text = json.dumps(result, indent=2, ensure_ascii=False)
    click.echo(text.encode("utf-8"))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return _one_line(str(value))


def _num(value: Any, places: int = 3, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:+.{places}f}" if signed else f"{value:.{places}f}"
    return str(value)


def _clip(text: str, width: int) -> str:
    text = _one_line(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    """Aligned columns, two spaces apart; the last column is not padded."""
    rows = [list(map(str, row)) for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(widths[i]) for i, c in enumerate(cells[:-1])] + [cells[-1]]
        return (indent + "  ".join(padded)).rstrip()

    return [line(list(headers))] + [line(row) for row in rows]


def kv(pairs: Iterable[tuple[str, Any]], skip_empty: bool = True) -> None:
    items = [(k, v) for k, v in pairs if not (skip_empty and v in (None, "", [], {}))]
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        _echo(f"{(key + ':').ljust(width + 1)} {_fmt(value)}")


def _state(item: dict[str, Any]) -> str:
    outcome = item.get("outcome")
    return str(outcome) if outcome else str(item.get("status") or "-")


def decision_rows(
    decisions: list[dict[str, Any]], with_distance: bool = False
) -> list[str]:
    headers = ["ID", "TITLE", "CATEGORY", "CONF", "STAKES", "STATUS"]
    if with_distance:
        headers.append("DISTANCE")
    rows = []
    for d in decisions:
        row = [
            str(d.get("id", "-")),
            _clip(str(d.get("title") or d.get("decision") or "-"), TITLE_WIDTH),
            str(d.get("category") or "-"),
            _num(d.get("confidence"), 2),
            str(d.get("stakes") or "-"),
            _state(d),
        ]
        if with_distance:
            row.append(_num(d.get("distance"), 3))
        rows.append(row)
    return table(headers, rows)


def _rule_items(label: str, items: list[dict[str, Any]]) -> None:
    _echo(f"{label}: {len(items)}")
    for item in items:
        name = item.get("guardrailId") or item.get("name") or "?"
        severity = item.get("severity")
        prefix = f"[{severity}] " if severity else ""
        _echo(f"  - {prefix}{name}: {_one_line(item.get('message') or item.get('name') or '')}")
        if item.get("suggestion"):
            _echo(f"    suggestion: {_one_line(item['suggestion'])}")


def _guardrail_verdict(status: dict[str, Any]) -> None:
    kv([("allowed", bool(status.get("allowed"))),
        ("evaluated", f"{status.get('evaluated', 0)} rule(s)")])
    _rule_items("violations", list(status.get("violations") or []))
    _rule_items("warnings", list(status.get("warnings") or []))


# --------------------------------------------------------------------------- params


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
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in params.items() if v is not None and v != ()}


# --------------------------------------------------------------------------- commands


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--url``, ``--token`` and ``--json`` on every client command; the command gets a
    ready :class:`Caller` as its first argument."""

    @click.option("--json", "as_json", is_flag=True,
                  help="Print the JSON-RPC result as JSON (for scripts).")
    @click.option("--token", envvar="CSTP_TOKEN", show_envvar=True, default=None,
                  help="Bearer token.")
    @click.option("--url", envvar="CSTP_URL", show_envvar=True, default=DEFAULT_URL,
                  show_default=True, help="Server address (with or without /cstp).")
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


def register_client_commands(group: click.Group) -> None:
    """Add the client subcommands to the ``cstp`` group."""
    for command in COMMANDS:
        group.add_command(command)


@click.command("query")
@click.argument("text")
@click.option("--limit", type=int, default=None, help="How many (1-50, default 10).")
@click.option("--category")
@click.option("--stakes", multiple=True, type=click.Choice(STAKES), help="Repeatable.")
@click.option("--status", multiple=True, type=click.Choice(STATUSES), help="Repeatable.")
@click.option("--min-confidence", type=float)
@click.option("--max-confidence", type=float)
@click.option("--after", "date_after", metavar="DATE", help="On or after (ISO date).")
@click.option("--before", "date_before", metavar="DATE", help="Before (ISO date).")
@click.option("--agent")
@click.option("--tag", "tags", multiple=True, help="Every tag must be present; repeatable.")
@click.option("--project")
@click.option("--feature")
@click.option("--pr", type=int)
@click.option("--has-outcome/--no-outcome", "has_outcome", default=None,
              help="Only reviewed / only unreviewed decisions.")
@click.option("--reasons", "include_reasons", is_flag=True, help="Show each decision's reasons.")
@client_options
def query_cmd(cstp: Caller, text: str, limit: int | None, include_reasons: bool,
              **filters: Any) -> None:
    """Find past decisions similar in meaning to TEXT.

    Calls cstp.queryDecisions; every filter given is applied."""
    wire = compact({
        "category": filters["category"], "stakes": filters["stakes"],
        "status": filters["status"], "minConfidence": filters["min_confidence"],
        "maxConfidence": filters["max_confidence"], "dateAfter": filters["date_after"],
        "dateBefore": filters["date_before"], "agent": filters["agent"],
        "tags": filters["tags"], "project": filters["project"],
        "feature": filters["feature"], "pr": filters["pr"],
        "hasOutcome": filters["has_outcome"],
    })
    params = compact({"query": text, "limit": limit, "filters": wire or None})
    if include_reasons:
        params["includeReasons"] = True
    result = cstp.call("cstp.queryDecisions", params)
    if cstp.as_json:
        return print_json(result)
    decisions = list(result.get("decisions") or [])
    if not decisions:
        _echo(f"no decisions match {text!r}")
        return
    lines = decision_rows(decisions, with_distance=True)
    _echo(lines[0])
    for line, d in zip(lines[1:], decisions, strict=True):
        _echo(line)
        if include_reasons:
            for reason in d.get("reasons") or []:
                _echo(f"    - {reason.get('type')} ({_fmt(reason.get('strength'))}): "
                      f"{_one_line(reason.get('text') or '')}")
    took = result.get("queryTimeMs")
    _echo(f"{len(decisions)} decision(s), nearest first"
          + (f" ({took:.0f} ms)" if isinstance(took, (int, float)) else ""))


@click.command("check")
@click.argument("description")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--confidence", type=float)
@click.option("--project")
@click.option("--context", "context", multiple=True, metavar="KEY=VALUE",
              help="A fact the rules read, e.g. affects_production=true; repeatable.")
@client_options
def check_cmd(cstp: Caller, description: str, category: str | None, stakes: str | None,
              confidence: float | None, project: str | None, context: tuple[str, ...]) -> None:
    """Ask whether the guardrails allow an action.

    Calls cstp.checkGuardrails."""
    action = compact({"description": description, "category": category, "stakes": stakes,
                      "confidence": confidence, "project": project})
    facts = parse_pairs(context, "--context")
    if facts:
        action["context"] = facts
    result = cstp.call("cstp.checkGuardrails", {"action": action})
    if cstp.as_json:
        return print_json(result)
    _guardrail_verdict(result)
    kv([("evaluatedAt", result.get("evaluatedAt")), ("evaluationId", result.get("evaluationId")),
        ("agent", result.get("agent"))])


@click.command("announce")
@click.argument("intent")
@click.option("--context", help="Free text: what led to this intent.")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--confidence", type=float)
@click.option("--project")
@click.option("--correlation-id", help="Your id for this intent (a retry returns the answer).")
@click.option("--meta", "meta", multiple=True, metavar="KEY=VALUE",
              help="Metadata the guardrails read, e.g. affects_production=true; repeatable.")
@client_options
def announce_cmd(cstp: Caller, intent: str, context: str | None, category: str | None,
                 stakes: str | None, confidence: float | None, project: str | None,
                 correlation_id: str | None, meta: tuple[str, ...]) -> None:
    """Announce an intent: similar decisions, verdict, suggestions.

    Calls cstp.announceIntent."""
    params = compact({"intent": intent, "context": context, "category": category,
                      "stakes": stakes, "confidence": confidence, "project": project,
                      "correlationId": correlation_id})
    metadata = parse_pairs(meta, "--meta")
    if metadata:
        params["metadata"] = metadata
    result = cstp.call("cstp.announceIntent", params)
    if cstp.as_json:
        return print_json(result)
    kv([("correlationId", result.get("correlationId")),
        ("receivedAt", result.get("receivedAt"))])
    _guardrail_verdict(result.get("guardrailStatus") or {})
    similar = list(result.get("similarDecisions") or [])
    _echo(f"similar decisions: {len(similar)}")
    if similar:
        rows = [[str(d.get("id", "-")), _clip(str(d.get("title") or "-"), TITLE_WIDTH),
                 _state(d), _num(d.get("distance"), 3),
                 _clip(str(d.get("notes") or "-"), 60)] for d in similar]
        for line in table(["ID", "TITLE", "STATUS", "DISTANCE", "NOTES"], rows, indent="  "):
            _echo(line)
    suggestions = list(result.get("suggestions") or [])
    _echo(f"suggestions: {len(suggestions)}")
    for suggestion in suggestions:
        _echo(f"  - {_one_line(str(suggestion))}")
    kv([("respondingAgent", result.get("respondingAgent"))])


@click.command("record")
@click.argument("decision")
@click.option("--confidence", type=float, required=True, help="0.0 to 1.0.")
@click.option("--category", required=True)
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--context", help="Free text: the situation the decision was made in.")
@click.option("--reason", "reasons", multiple=True, metavar="TYPE:TEXT",
              help="e.g. analysis:ACID compliance needed; repeatable.")
@click.option("--tag", "tags", multiple=True, help="Repeatable.")
@click.option("--kpi", "kpis", multiple=True, help="A KPI this should move; repeatable.")
@click.option("--mental-state")
@click.option("--review-in", metavar="PERIOD", help="When to review: 30d, 2w, 3m.")
@click.option("--project")
@click.option("--feature")
@click.option("--pr", type=int)
@click.option("--correlation-id", help="The id of an intent you announced for this.")
@client_options
def record_cmd(cstp: Caller, decision: str, reasons: tuple[str, ...], tags: tuple[str, ...],
               kpis: tuple[str, ...], **options: Any) -> None:
    """Record a decision.

    Calls cstp.recordDecision."""
    params = compact({
        "decision": decision, "confidence": options["confidence"],
        "category": options["category"], "stakes": options["stakes"],
        "context": options["context"], "tags": tags, "kpiIndicators": kpis,
        "mentalState": options["mental_state"], "reviewIn": options["review_in"],
        "project": options["project"], "feature": options["feature"], "pr": options["pr"],
        "correlationId": options["correlation_id"],
    })
    if reasons:
        params["reasons"] = parse_reasons(reasons)
    result = cstp.call("cstp.recordDecision", params)
    if cstp.as_json:
        return print_json(result)
    kv([("recorded", result.get("id")), ("path", result.get("path")),
        ("indexed", result.get("indexed")), ("timestamp", result.get("timestamp"))],
       skip_empty=False)


@click.command("review")
@click.argument("decision_id", metavar="ID")
@click.argument("outcome", type=click.Choice(OUTCOMES))
@click.option("--result", "actual_result", help="What actually happened.")
@click.option("--lessons")
@click.option("--notes")
@click.option("--kpi", "kpis", multiple=True, metavar="KEY=VALUE",
              help="An affected KPI, e.g. latency=+40%; repeatable.")
@client_options
def review_cmd(cstp: Caller, decision_id: str, outcome: str, actual_result: str | None,
               lessons: str | None, notes: str | None, kpis: tuple[str, ...]) -> None:
    """Record the OUTCOME of decision ID.

    Calls cstp.reviewDecision."""
    params = compact({"id": decision_id, "outcome": outcome, "actualResult": actual_result,
                      "lessons": lessons, "notes": notes})
    affected = parse_pairs(kpis, "--kpi")
    if affected:
        params["affectedKpis"] = affected
    result = cstp.call("cstp.reviewDecision", params)
    if cstp.as_json:
        return print_json(result)
    kv([("reviewed", result.get("id")), ("outcome", outcome), ("status", result.get("status")),
        ("reviewedAt", result.get("reviewedAt")), ("path", result.get("path")),
        ("reindexed", result.get("reindexed"))])


_FIRST = ("id", "title", "category", "confidence", "stakes", "status", "outcome", "date",
          "recordedBy", "context")
_HIDDEN = {"reasons", "reviews", "summary", "decision", "createdAt"}


@click.command("get")
@click.argument("decision_id", metavar="ID")
@client_options
def get_cmd(cstp: Caller, decision_id: str) -> None:
    """Show decision ID with every stored field and its reviews.

    Calls cstp.getDecision."""
    result = cstp.call("cstp.getDecision", {"id": decision_id})
    if cstp.as_json:
        return print_json(result)
    decision: dict[str, Any] = result.get("decision") or {}
    pairs = [(k, decision.get(k)) for k in _FIRST]
    pairs += [(k, v) for k, v in decision.items() if k not in _FIRST and k not in _HIDDEN]
    pairs = [(k, v) for k, v in pairs
             if not (isinstance(v, dict) and all(x is None for x in v.values()))]
    kv(pairs)
    reasons = list(decision.get("reasons") or [])
    if reasons:
        _echo(f"reasons: {len(reasons)}")
        for reason in reasons:
            _echo(f"  - {reason.get('type')} ({_fmt(reason.get('strength'))}): "
                  f"{_one_line(reason.get('text') or '')}")
    reviews = list(decision.get("reviews") or [])
    _echo(f"reviews: {len(reviews)}")
    for review in reviews:
        _echo(f"  - {review.get('reviewedAt')} {review.get('outcome')} "
              f"by {review.get('reviewedBy') or '-'}")
        for key in ("actualResult", "lessons", "notes", "affectedKpis"):
            if review.get(key) not in (None, "", {}):
                _echo(f"    {key}: {_fmt(review[key])}")


@click.command("list")
@click.option("--limit", type=int, default=None, help="Page size (1-500, default 20).")
@click.option("--offset", type=int, default=None)
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--agent")
@click.option("--tag", "tags", multiple=True, help="Repeatable.")
@click.option("--from", "date_from", metavar="DATE", help="Recorded on or after.")
@click.option("--to", "date_to", metavar="DATE", help="Recorded on or before.")
@click.option("--search", help="Text contained in the decision.")
@click.option("--sort", type=click.Choice(["createdAt", "confidence", "category", "stakes",
                                           "status"]))
@click.option("--order", type=click.Choice(["asc", "desc"]))
@client_options
def list_cmd(cstp: Caller, tags: tuple[str, ...], date_from: str | None,
             date_to: str | None, **options: Any) -> None:
    """List decisions, newest first by default.

    Calls cstp.listDecisions."""
    params = compact({**options, "tags": tags, "dateFrom": date_from, "dateTo": date_to})
    result = cstp.call("cstp.listDecisions", params)
    if cstp.as_json:
        return print_json(result)
    decisions = list(result.get("decisions") or [])
    total = result.get("total", len(decisions))
    if not decisions:
        _echo(f"no decisions (total {total})")
        return
    for line in decision_rows(decisions):
        _echo(line)
    offset = int(result.get("offset") or 0)
    _echo(f"{offset + 1}-{offset + len(decisions)} of {total} decision(s)")


@click.command("calibration")
@click.option("--agent")
@click.option("--category")
@click.option("--stakes", type=click.Choice(STAKES))
@click.option("--since", metavar="DATE")
@click.option("--until", metavar="DATE")
@click.option("--min-decisions", type=int, help="Scored decisions needed (default 5).")
@click.option("--group-by", type=click.Choice(["category", "stakes", "agent",
                                               "confidenceBucket"]))
@client_options
def calibration_cmd(cstp: Caller, group_by: str | None, agent: str | None,
                    category: str | None, stakes: str | None, since: str | None,
                    until: str | None, min_decisions: int | None) -> None:
    """How well stated confidence matches outcomes.

    Calls cstp.getCalibration."""
    filters = compact({"agent": agent, "category": category, "stakes": stakes,
                       "since": since, "until": until, "minDecisions": min_decisions})
    params = compact({"filters": filters or None, "groupBy": group_by})
    result = cstp.call("cstp.getCalibration", params)
    if cstp.as_json:
        return print_json(result)
    overall = result.get("overall") or result
    kv([("agent", result.get("agent")),
        ("brierScore", _num(overall.get("brierScore"))),
        ("accuracy", _num(overall.get("accuracy"))),
        ("calibrationGap", _num(overall.get("calibrationGap"), signed=True)),
        ("interpretation", overall.get("interpretation")),
        ("meanConfidence", _num(overall.get("meanConfidence"))),
        ("decisions", f"{overall.get('totalDecisions', 0)} scored, "
                      f"{overall.get('reviewedDecisions', 0)} reviewed, "
                      f"{overall.get('pendingDecisions', 0)} pending")])
    buckets = list(result.get("buckets") or [])
    if buckets:
        _echo("buckets:")
        rows = [[str(b.get("bucket")), str(b.get("count", 0)), _num(b.get("meanConfidence")),
                 _num(b.get("accuracy")), _num(b.get("gap"), signed=True),
                 _num(b.get("brierScore"))] for b in buckets]
        for line in table(["BUCKET", "COUNT", "CONF", "ACCURACY", "GAP", "BRIER"], rows, "  "):
            _echo(line)
    groups = list(result.get("groups") or [])
    if groups:
        _echo(f"by {result.get('groupBy') or group_by}:")
        rows = [[str(g.get("key")), str(g.get("totalDecisions", 0)), _num(g.get("brierScore")),
                 _num(g.get("accuracy")), _num(g.get("calibrationGap"), signed=True),
                 str(g.get("interpretation") or "-")] for g in groups]
        for line in table(["KEY", "SCORED", "BRIER", "ACCURACY", "GAP", "INTERPRETATION"],
                          rows, "  "):
            _echo(line)
    recommendations = list(result.get("recommendations") or [])
    if recommendations:
        _echo("recommendations:")
        for item in recommendations:
            _echo(f"  - {_one_line(str(item))}")


@click.command("guardrails")
@click.option("--scope", help="Only rules that apply to this scope (e.g. a project).")
@client_options
def guardrails_cmd(cstp: Caller, scope: str | None) -> None:
    """List the guardrail rules in force.

    Calls cstp.listGuardrails."""
    result = cstp.call("cstp.listGuardrails", compact({"scope": scope}))
    if cstp.as_json:
        return print_json(result)
    rules = list(result.get("guardrails") or [])
    if not rules:
        _echo("no guardrails" + (f" for scope {scope!r}" if scope else ""))
        return
    rows = [[str(r.get("id")), str(r.get("action") or "-"),
             ", ".join(map(str, r.get("scope") or [])) or "all",
             _one_line(str(r.get("description") or "-"))] for r in rules]
    for line in table(["ID", "ACTION", "SCOPE", "DESCRIPTION"], rows):
        _echo(line)
    _echo(f"{result.get('count', len(rules))} guardrail(s)")


COMMANDS = (query_cmd, check_cmd, announce_cmd, record_cmd, review_cmd, get_cmd, list_cmd,
            calibration_cmd, guardrails_cmd)
