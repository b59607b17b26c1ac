"""Observability: what operators watch the server with (traces, metrics, logs)."""
