"""``cstp serve``: apply pending migrations, check what the server process would refuse, then
start the server (uvicorn). Registered on ``cstp`` by app.cli."""

from __future__ import annotations

import copy
import logging
import logging.config
from pathlib import Path
from typing import Any

import click

from ..config import ConfigError, Settings
from .failures import Failure, redact
from .runner import debugging, failure_line, load_settings, run
from .schema import ensure_schema

log = logging.getLogger("cstp.serve")

# The server's own lines in a text log (uvicorn's keep uvicorn's look).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """The server's logging as a ``logging.config.dictConfig`` dictionary: uvicorn's own
    (its loggers, formatters and handlers) plus the root logger, which every other logger of
    the process (ours, Alembic's, the libraries') writes through, at ``level``. uvicorn
    applies it in every worker process it starts (``log_config``), where nothing else sets
    logging up. ``json``: every formatter writes one JSON object per line
    (app/observability/logs.py)."""
    import uvicorn.config

    config: dict[str, Any] = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["formatters"]["cstp"] = {"format": TEXT_FORMAT}
    config["handlers"]["cstp"] = {
        "class": "logging.StreamHandler",
        "formatter": "cstp",
        "stream": "ext://sys.stderr",
    }
    config["root"] = {"level": level, "handlers": ["cstp"]}
    if level != "DEBUG":  # one line per Alembic plugin at every start says nothing to an operator
        config["loggers"]["alembic.runtime.plugins"] = {"level": "WARNING"}
    if log_format == "json":
        for name in config["formatters"]:
            config["formatters"][name] = {"()": "app.observability.logs.JsonFormatter"}
    return config


def _setup_logging(level: str, log_format: str) -> None:
    """The server's logging (replacing the one-line logging of the other commands). JSON:
    Python's warnings become log records too, so that no line of the process is plain text."""
    logging.config.dictConfig(logging_config(level, log_format))
    if log_format == "json":
        logging.captureWarnings(True)


@click.command()
@click.option("--host", default=None, help="Bind address (default CSTP_HOST or 127.0.0.1).")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Port (default CSTP_PORT or 9991).",
)
@click.option(
    "--workers", default=1, type=click.IntRange(min=1), show_default=True, help="Server processes."
)
def serve(host: str | None, port: int | None, workers: int) -> None:
    """Apply pending migrations, then serve JSON-RPC on /cstp."""
    settings = load_settings()
    level = "DEBUG" if debugging() else settings.log_level
    _setup_logging(level, settings.log_format)
    if settings.log_format != "json":
        _serve(settings, host, port, workers, level)
        return
    # A JSON log is read by a machine: a failure to start is a JSON line too, not the
    # "Error: ..." text the other commands print.
    try:
        _serve(settings, host, port, workers, level)
    except (click.exceptions.Exit, click.Abort):
        raise
    except click.ClickException as exc:
        log.error(exc.format_message())
        raise click.exceptions.Exit(exc.exit_code) from None
    except Exception as exc:
        if debugging():
            log.exception("the server stopped")
        else:
            log.error(failure_line(exc))
        raise click.exceptions.Exit(1) from None


def _serve(
    settings: Settings, host: str | None, port: int | None, workers: int, level: str
) -> None:
    import uvicorn

    from ..auth import LOCAL_AGENT, ensure_local_token, load_tokens
    from ..guardrails.rules import RuleFileError

    host = host or settings.host
    port = port or settings.port
    try:
        tokens = load_tokens(settings)
        _preflight(settings)
    except (ConfigError, RuleFileError) as exc:
        # Shown whole, even with --debug: a YAML syntax error's lines point at the mistake.
        raise click.ClickException(str(exc)) from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    run(
        lambda: ensure_schema(
            settings.database_url,
            upgrade_older=True,
            tell=lambda text: _tell(settings, logging.INFO, text),
        )
    )
    if not tokens:
        _token, created = ensure_local_token(settings.data_dir)
        path = (settings.data_dir / "local-token").absolute()
        _tell(
            settings,
            logging.WARNING,
            f"No CSTP_AUTH_TOKENS set: {'created' if created else 'using'} a token for agent "
            f"'{LOCAL_AGENT}' in {path}\n"
            f"  export CSTP_TOKEN=$(cat {path})\n"
            f'  curl -H "Authorization: Bearer $CSTP_TOKEN" http://{host}:{port}/cstp ...',
        )
    _tell(
        settings,
        logging.INFO,
        f"database: {redact(settings.database_url)}\n"
        f"decisions: {settings.decisions_dir.absolute()}\n"
        f"vector index: {settings.chroma_url or (settings.data_dir / 'chroma').absolute()}\n"
        f"listening on http://{host}:{port}",
    )
    if workers > 1 and not settings.chroma_url:
        raise Failure(
            "several workers need a Chroma server (CSTP_CHROMA_URL): the embedded index is "
            "not safe across processes"
        )
    _share_metrics(settings.data_dir / "metrics" / f"port-{port}")
    uvicorn.run(
        "app.asgi:serving_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
        log_config=logging_config(level, settings.log_format),
        access_log=False,
    )


def _share_metrics(folder: Path) -> None:
    """Give this run's server processes ``folder`` for their metrics' values, emptied of an
    earlier run's, so that a scrape answered by any worker counts them all
    (app.observability.metrics). One per port: two servers sharing a data dir must not add
    up each other's counts. Set just before the workers start, which import the metrics
    library afresh (a value of ``PROMETHEUS_MULTIPROC_DIR`` in the environment is replaced);
    one process alone keeps its values in memory as before."""
    from ..observability import shared_dir

    try:
        shared_dir.prepare(folder)
    except OSError as exc:
        raise Failure(f"the metrics directory {folder} cannot be set up: {exc}") from None


def _tell(settings: Settings, level: int, text: str) -> None:
    """Tell the operator something at start-up: on stderr as it is (text), or as a log record
    of ``level`` (json), so that every line of a JSON log is JSON."""
    if settings.log_format == "json":
        log.log(level, text)
    else:
        click.echo(text, err=True)


def _preflight(settings: Settings) -> None:
    """What the server process checks when it starts, checked here before it is started, so a
    mistake is one line on stderr instead of a traceback after "listening on"."""
    from ..asgi import build_registry, check_rate_limits
    from ..guardrails.rule_files import load_rules, rule_dirs
    from ..observability import tracing

    check_rate_limits(settings, build_registry())
    load_rules(rule_dirs(settings.guardrails_dir))
    tracing.from_env(settings.trace_content)  # OTEL_* asking for traces it cannot send
