"""What an operator's tools read from the server: logs, metrics and traces (SPEC.md, section 11)."""
