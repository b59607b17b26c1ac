"""The operations every face serves: one table of them (name, params and result types,
handler), the unit of work of one call, params validation, rate limits, and the runner that
gives each call its own transaction. Nothing here knows JSON-RPC or MCP."""
