"""The learning loop (SPEC.md, section 9): what an agent should attend to next (ready)."""
