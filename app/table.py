"""The operation table of this server: every context's operations, in one registry that the
JSON-RPC face, the MCP face and the agent card all read."""

from __future__ import annotations

from .approvals import ops as approvals_ops
from .calibration import ops as calibration_ops
from .decisions import ops as decisions_ops
from .guardrails import ops as guardrails_ops
from .intents import ops as intents_ops
from .learning import ops as learning_ops
from .operations.registry import Registry
from .search import ops as search_ops


def build_registry() -> Registry:
    registry = Registry()
    contexts = (
        decisions_ops,
        calibration_ops,
        guardrails_ops,
        search_ops,
        intents_ops,
        approvals_ops,
        learning_ops,
    )
    for context in contexts:
        context.register(registry)
    return registry
