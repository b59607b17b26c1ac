"""Approvals: a person's answer to an escalated guardrail evaluation (SPEC.md, section 8)."""
