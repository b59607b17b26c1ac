"""The console (SPEC.md, section 10): server-rendered pages for the people around the
agents, on the same server, tokens and scopes (app.console.routes builds them)."""
