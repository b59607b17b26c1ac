"""What the standard ``OTEL_*`` variables ask of the server's traces: whether they are on
(``wanted``), the resource that names the service, and the span exporters, each imported
only when asked for (the ``otel`` extra). app.observability.tracing makes the tracer of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.config import ConfigError
from app.version import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

DEFAULT_SERVICE = "cstp-server"
INSTALL_HINT = "pip install 'cstp-server[otel]'"


def exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    return [n.strip().lower() for n in raw.split(",") if n.strip() and n.strip() != "none"]


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard variables turn traces on: an OTLP endpoint or an exporter is
    named (and the SDK is not disabled, nor the exporter ``none``)."""
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    named = any(
        env.get(name)
        for name in (
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )
    return named and bool(exporter_names(env))


def missing(what: str) -> str:
    return (
        f"OTEL_* variables ask for traces but {what}: {INSTALL_HINT}, or set "
        "OTEL_SDK_DISABLED=true to run without traces"
    )


def service_resource(env: Mapping[str, str]) -> Any:
    """The SDK's resource from OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, named
    ``cstp-server`` when neither names the service."""
    try:
        from opentelemetry.sdk.resources import (  # noqa: PLC0415  (the otel extra, on only)
            SERVICE_NAME,
            SERVICE_VERSION,
            Resource,
        )
    except ImportError:
        raise ConfigError(missing("the OpenTelemetry SDK is not installed")) from None
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE}))
    return resource


def exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    """The span exporter OTEL_TRACES_EXPORTER names; ``otlp`` speaks the protocol that
    OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL names (``http/protobuf`` unless set). It reads its
    endpoint, headers, timeout and compression from the environment itself."""
    if name == "console":
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415  (on only)
            ConsoleSpanExporter,
        )

        return ConsoleSpanExporter(service_name=DEFAULT_SERVICE)
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,  # (the otel extra, on only)
            )
        except ImportError:
            raise ConfigError(missing("the OTLP/HTTP exporter is not installed")) from None
        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter as GrpcSpanExporter,  # (on only; chromadb brings it)
            )
        except ImportError:
            raise ConfigError(missing("the OTLP/gRPC exporter is not installed")) from None
        return GrpcSpanExporter()
    raise ConfigError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf or grpc)"
    )
