"""The operation table as MCP tools, on the official SDK's low-level server.

Each operation with a tool name is a tool: its description is written for a model deciding
when to call it, its input schema is the params schema rpc.discover publishes (the same
msgspec types; without the params an operation keeps from tools, such as announceIntent's
informational ``agent``), its output schema the result's. A call answers structured content (the
result) and a short text of it; a failure is a tool error carrying the same code, message
and data as on /cstp, never exception text. How a call is carried out (in this process, or
forwarded to a server) is the ``Call`` given.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from app.errors import CstpError
from app.operations.registry import Operation, Registry
from app.operations.schema import resolved, schemas
from app.version import __version__

# Carries out one call of ``operation`` with the tool's arguments; raises CstpError.
Call = Callable[[Operation[Any, Any], dict[str, Any], ServerRequestContext], Awaitable[Any]]

INSTRUCTIONS = (
    "Decision memory and guardrails. Before acting on anything that matters, call "
    "announce_intent: it answers similar past decisions and their outcomes, whether the "
    "guardrails allow the action, and suggestions. After deciding, call record_decision "
    "(with the announcement's correlationId); once the outcome is known, review_decision."
)
TEXT_LIMIT = 4000  # characters of the text rendering; the structured content has it all


def tool_list(registry: Registry) -> list[types.Tool]:
    """The tools, with self-contained input and output schemas (their refs in ``$defs``)."""
    operations = registry.tools()
    pairs, components = schemas(operations, "#/$defs/{name}")
    tools = []
    for op, (params, result) in zip(operations, pairs, strict=True):
        assert op.tool is not None
        tools.append(
            types.Tool(
                name=op.tool,
                description=op.description or op.summary,
                input_schema=_standalone(
                    _without(resolved(params, components), op.not_tool_arguments), components
                ),
                output_schema=_standalone(resolved(result, components), components),
            )
        )
    return tools


def _without(schema: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """An object schema without the properties ``names``."""
    if not names:
        return schema
    kept = {k: v for k, v in schema.get("properties", {}).items() if k not in names}
    required = [r for r in schema.get("required", []) if r not in names]
    trimmed = {**schema, "properties": kept}
    if "required" in schema:
        trimmed["required"] = required
    return trimmed


def _standalone(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the named schemas it refers to (directly or not) under ``$defs``."""
    needed: dict[str, Any] = {}
    stack = [schema]
    while stack:
        item = stack.pop()
        text = json.dumps(item)
        for name, component in components.items():
            if name not in needed and f'"#/$defs/{name}"' in text:
                needed[name] = component
                stack.append(component)
    return {**schema, "$defs": needed} if needed else dict(schema)


def build_server(
    registry: Registry,
    call: Call,
    scopes: Callable[[ServerRequestContext], frozenset[str] | None] = lambda _: None,
) -> Server:
    """The MCP server of the operation table. ``scopes`` gives a request's token scopes: a
    token sees only the tools it may call (None: every tool, where the caller's server
    decides, as behind ``cstp mcp``)."""
    tools = tool_list(registry)
    by_tool = {op.tool: op for op in registry.tools()}
    needs = {tool.name: by_tool[tool.name].scopes for tool in tools}

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        held = scopes(ctx)
        if held is None:
            return types.ListToolsResult(tools=tools)
        return types.ListToolsResult(tools=[t for t in tools if held & set(needs[t.name])])

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        operation = by_tool.get(params.name)
        if operation is None:
            raise MCPError(code=types.METHOD_NOT_FOUND, message=f"no tool named {params.name}")
        try:
            result = await call(operation, dict(params.arguments or {}), ctx)
        except CstpError as exc:
            return tool_error(exc)
        content: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(result))
        return types.CallToolResult(
            content=[types.TextContent(text=_text(content))], structured_content=content
        )

    brief = registry.get(BRIEF_OPERATION)

    async def list_prompts(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        held = scopes(ctx)
        if brief is None or (held is not None and not held & set(brief.scopes)):
            return types.ListPromptsResult(prompts=[])
        return types.ListPromptsResult(prompts=[SESSION_BRIEF])

    async def get_prompt(
        ctx: ServerRequestContext, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if brief is None or params.name != SESSION_BRIEF.name:
            raise MCPError(code=types.INVALID_PARAMS, message=f"no prompt named {params.name}")
        arguments = dict(params.arguments or {})
        args: dict[str, Any] = {"format": "markdown"}
        if arguments.get("task"):
            args["task"] = arguments["task"]
        if arguments.get("maxTokens"):
            try:
                args["maxTokens"] = int(arguments["maxTokens"])
            except ValueError:
                raise MCPError(
                    code=types.INVALID_PARAMS, message="maxTokens must be a whole number"
                ) from None
        try:
            result = await call(brief, args, ctx)
        except CstpError as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=error_line(exc)) from None
        # a result struct in the server; the forwarded JSON result behind ``cstp mcp``
        text = result["context"] if isinstance(result, dict) else getattr(result, "context", "")
        return types.GetPromptResult(
            description=SESSION_BRIEF.description,
            messages=[types.PromptMessage(role="user", content=types.TextContent(text=str(text)))],
        )

    return Server(
        "cstp",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


# The prompt that opens a session with the agent's brief (cstp.getSessionContext, markdown).
BRIEF_OPERATION = "cstp.getSessionContext"
SESSION_BRIEF = types.Prompt(
    name="session_brief",
    description=(
        "What you should know before you start: your calibration by category, the past "
        "decisions most relevant to your task, what needs your attention, your recent "
        "failures and the guardrails in force (cstp.getSessionContext)."
    ),
    arguments=[
        types.PromptArgument(name="task", description="What this session is about."),
        types.PromptArgument(
            name="maxTokens", description="The brief's budget in tokens (200-8000; 1500)."
        ),
    ],
)


def tool_error(error: CstpError) -> types.CallToolResult:
    """A failure a model can act on: the code, message and data of the protocol's error table
    in the structured content, and one line of text saying it."""
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return types.CallToolResult(
        is_error=True,
        content=[types.TextContent(text=error_line(error))],
        structured_content={"error": body},
    )


def error_line(error: CstpError) -> str:
    """``Error -32602 Invalid params: confidence must be between 0.0 and 1.0``."""
    line = f"Error {error.code} {error.message}"
    data = error.data if isinstance(error.data, dict) else {}
    if "field" in data:
        line += f": {data['field']} {data.get('error', '')}".rstrip()
    elif "retryAfterMs" in data:
        line += f": retry in {data['retryAfterMs']} ms"
    elif "id" in data:
        line += f": no decision {data['id']}"
    elif error.data is not None:
        line += f": {json.dumps(error.data, separators=(',', ':'))}"
    return line


def _text(content: dict[str, Any]) -> str:
    """The result as compact JSON for a model to read, cut at TEXT_LIMIT characters."""
    text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…(cut; see structuredContent)"
