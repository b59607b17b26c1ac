"""The tamper-evident audit trail: one hash chain over every audited row (docs/AUDIT.md).

- ``canonical``: what an entry's digest is the digest of (a row's canonical form).
- ``chain``: appending entries in the transaction of the rows they cover, serialized.
- ``verify``: recomputing digests and links, checkpoints.
- ``repository``: their SQL: the chain's own table (``entries``) and the audited rows
  (``rows``).
"""
