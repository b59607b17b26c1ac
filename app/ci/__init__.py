"""Outcomes observed by CI (SPEC.md, section 9; docs/OPERATIONS.md, "Outcomes observed by CI").

A CI pipeline posts ``{"pr", "status", "url"?, "commit"?}`` to ``/hooks/ci/<workspace>``,
signed as the Standard Webhooks specification says with the workspace's CI secret; every
decision of that workspace with that ``pr`` and no outcome yet gets a review with source
``ci``.

- ``hook``: the verification (signature, timestamp, replay) and the reviews, in one
  transaction with the report's id.
- ``admin``: ``cstp webhooks ci-secret``, which sets (or rotates) a workspace's secret.
- ``repository``: every statement on ``ci_secrets`` and ``ci_deliveries``.
"""
