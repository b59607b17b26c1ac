"""The MCP face: the operation table as MCP tools, over Streamable HTTP at ``/mcp`` and over
stdio (``cstp mcp``, forwarding to a running server)."""
