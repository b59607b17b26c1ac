"""CSTP_LOG_FORMAT=json as a log pipeline reads it: one JSON object per line, the runner's
call fields as keys of that object, the trace ids while a span is current, a traceback as a
value; and the text format as it always read."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvicorn.config

from app.cli.serve import TEXT_FORMAT, logging_config
from app.config import ConfigError, Settings
from app.observability import logs
from app.observability.logs import Fields, JsonFormatter

CALL = {
    "event": "rpc",
    "face": "jsonrpc",
    "workspace": "default",
    "agent": "alice",
    "method": "cstp.queryDecisions",
    "id": 7,
    "outcome": "-32602",
    "durationMs": 1.25,
}


def record(
    msg: Any, *args: Any, name: str = "cstp.test", level: int = logging.INFO, exc_info: Any = None
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or None, exc_info)


def line(rec: logging.LogRecord) -> dict[str, Any]:
    text = JsonFormatter().format(rec)
    assert "\n" not in text, text
    parsed = json.loads(text)
    assert isinstance(parsed, dict)
    return parsed


def test_a_record_is_one_json_object_with_time_level_logger_and_message() -> None:
    before = datetime.now(UTC)
    got = line(record("outbox: %s events wait for %s", 3, "the index", level=logging.WARNING))
    assert got["level"] == "WARNING" and got["logger"] == "cstp.test"
    assert got["message"] == "outbox: 3 events wait for the index"
    assert got["time"].endswith("Z")  # UTC, written as such
    stamp = datetime.fromisoformat(got["time"])
    assert stamp.utcoffset() == timedelta(0)
    assert before - timedelta(milliseconds=2) <= stamp <= datetime.now(UTC)
    assert "trace_id" not in got and "exception" not in got


def test_the_fields_of_a_call_are_keys_of_the_line() -> None:
    got = line(record(Fields("cstp.queryDecisions -32602", CALL), name="cstp.rpc"))
    assert got["message"] == "cstp.queryDecisions -32602"
    assert {k: got[k] for k in CALL} == CALL
    assert got["logger"] == "cstp.rpc" and got["level"] == "INFO"


def test_a_text_log_shows_the_fields_of_a_call_as_the_json_object_it_always_was() -> None:
    rec = record(Fields("cstp.queryDecisions -32602", CALL), name="cstp.rpc")
    assert rec.getMessage() == json.dumps(CALL)
    text = logging.Formatter(TEXT_FORMAT).format(rec)
    assert text.endswith(" INFO cstp.rpc " + json.dumps(CALL)), text


def test_a_field_never_replaces_a_key_of_the_line_itself() -> None:
    got = line(record(Fields("summary", {"level": "forged", "message": "forged", "x": 1})))
    assert got["level"] == "INFO" and got["message"] == "summary" and got["x"] == 1


def test_the_trace_and_span_ids_while_a_span_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    monkeypatch.setattr(logs, "current_ids", lambda: (trace_id, span_id))
    got = line(record(Fields("m ok", CALL), name="cstp.rpc"))
    assert (got["trace_id"], got["span_id"]) == (trace_id, span_id)
    monkeypatch.setattr(logs, "current_ids", lambda: None)
    assert "trace_id" not in line(record("no span"))


def test_an_exception_is_its_traceback_under_one_key() -> None:
    try:
        raise ValueError("a bug\nwith a second line")
    except ValueError:
        rec = record("unexpected error in %s", "cstp.recordDecision", exc_info=sys.exc_info())
    got = line(rec)
    assert got["message"] == "unexpected error in cstp.recordDecision"
    assert got["exception"].startswith("Traceback (most recent call last):")
    assert got["exception"].endswith("ValueError: a bug\nwith a second line")


def test_a_line_is_ascii_and_any_value_is_written() -> None:
    values = {"path": "/srv/décisions", "when": datetime(2026, 1, 2, tzinfo=UTC)}
    text = JsonFormatter().format(record(Fields("s", values)))
    assert text.isascii(), text
    got = json.loads(text)
    assert got["path"] == "/srv/décisions" and got["when"] == "2026-01-02 00:00:00+00:00"


def test_uvicorns_access_line_names_its_request() -> None:
    args = ("127.0.0.1:50000", "POST", "/cstp", "1.1", 200)
    rec = record('%s - "%s %s HTTP/%s" %d', *args, name="uvicorn.access")
    got = line(rec)
    assert got["message"] == '127.0.0.1:50000 - "POST /cstp HTTP/1.1" 200'
    assert (got["http_method"], got["path"], got["status"]) == ("POST", "/cstp", 200)


# ---- the server's logging configuration --------------------------------------------------


def test_text_logging_keeps_uvicorns_lines_and_the_servers_format() -> None:
    config = logging_config("INFO", "text")
    for name, formatter in uvicorn.config.LOGGING_CONFIG["formatters"].items():
        assert config["formatters"][name] == formatter
    root = config["root"]
    assert root["level"] == "INFO"
    assert config["formatters"][config["handlers"][root["handlers"][0]]["formatter"]] == {
        "format": TEXT_FORMAT
    }
    assert config["loggers"]["alembic.runtime.plugins"] == {"level": "WARNING"}
    assert "alembic.runtime.plugins" not in logging_config("DEBUG", "text")["loggers"]


def test_json_logging_formats_every_handler_as_json() -> None:
    config = logging_config("WARNING", "json")
    assert config["root"]["level"] == "WARNING"
    used = {handler["formatter"] for handler in config["handlers"].values()}
    assert used >= {"default", "access", "cstp"}
    for name in used:
        assert config["formatters"][name] == {"()": "app.observability.logs.JsonFormatter"}
    # the dictionary is uvicorn's to copy into each worker process: nothing of ours mutated
    assert uvicorn.config.LOGGING_CONFIG["formatters"]["default"]["()"].startswith("uvicorn.")


# ---- the setting -----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(None, "text"), ("", "text"), (" JSON ", "json")])
def test_the_log_format_setting(value: str | None, expected: str) -> None:
    env = {} if value is None else {"CSTP_LOG_FORMAT": value}
    assert Settings.from_env(env).log_format == expected


def test_an_unknown_log_format_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"CSTP_LOG_FORMAT must be text or json, got 'yaml'"):
        Settings.from_env({"CSTP_LOG_FORMAT": "yaml"})
