"""Guardrail rules: loaded from YAML (``rules``), evaluated against facts (``evaluate``)."""
