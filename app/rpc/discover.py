"""``rpc.discover``: the OpenRPC 1.x document of this server, built from the method registry.

Each method's params and result schemas are generated from the same msgspec types the
dispatcher decodes params with and the handlers answer, so the document cannot drift from
the code. Params are by name (a JSON object); each param is one content descriptor.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from app import scopes
from app.errors import COMMON, MESSAGES
from app.operations.context import CallContext
from app.operations.registry import Operation, Registry
from app.operations.schema import resolved, schemas
from app.version import __version__

OPENRPC_VERSION = "1.3.2"
REF_TEMPLATE = "#/components/schemas/{name}"


class DiscoverParams(msgspec.Struct):
    """rpc.discover takes no params."""


# Its docstring would be the result schema's description: none, as before it was a struct.
class OpenRpcDocument(msgspec.Struct):
    openrpc: str
    info: dict[str, Any]
    servers: list[dict[str, Any]]
    methods: list[dict[str, Any]]
    components: dict[str, Any]


def build_document(registry: Registry) -> OpenRpcDocument:
    methods = registry.operations()
    pairs, components = schemas(methods, REF_TEMPLATE)
    described = [
        _method(m, params, result, components)
        for m, (params, result) in zip(methods, pairs, strict=True)
    ]
    return OpenRpcDocument(
        openrpc=OPENRPC_VERSION,
        info={
            "title": "CSTP server",
            "version": __version__,
            "description": (
                "Decision memory and guardrails for AI agents: JSON-RPC 2.0 over HTTP POST "
                "/cstp with a bearer token. Params are by name; unknown params are ignored; "
                "an optional param sent as null counts as absent."
            ),
        },
        servers=[{"name": "cstp", "url": "/cstp"}],
        methods=described,
        components={"schemas": components},
    )


def _method(
    method: Operation[Any, Any],
    params: dict[str, Any],
    result: dict[str, Any],
    components: dict[str, Any],
) -> dict[str, Any]:
    struct = resolved(params, components)
    required = set(struct.get("required", ()))
    codes = sorted({*method.errors, *COMMON}, reverse=True)
    return {
        "name": method.name,
        "summary": method.summary,
        **({"description": method.description} if method.description else {}),
        "paramStructure": "by-name",
        "params": [
            {"name": name, "schema": schema, "required": name in required}
            for name, schema in struct.get("properties", {}).items()
        ],
        "result": {"name": "result", "schema": result},
        "errors": [{"code": code, "message": MESSAGES[code]} for code in codes],
    }


def register(registry: Registry) -> None:
    """Add ``rpc.discover``; register it last, so that the document lists every method."""

    @functools.cache
    def document() -> OpenRpcDocument:
        return build_document(registry)

    async def discover(ctx: CallContext, params: DiscoverParams) -> OpenRpcDocument:
        return document()

    registry.add(
        Operation(
            "rpc.discover",
            DiscoverParams,
            OpenRpcDocument,
            discover,
            "This document: every method with the JSON Schema of its params and result, and the "
            "errors it can answer (OpenRPC 1.x).",
            writes=False,
            scopes=(scopes.READ,),
        )
    )
