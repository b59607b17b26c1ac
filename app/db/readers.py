"""Auditors' SQL sessions on PostgreSQL: database roles that read one workspace's audit rows.

Revision 0012 installs row-level security on every audit table: a role listed in
``audit_readers`` sees the rows of its workspace only; ``cstp db auditor-role`` lists a role
there and grants it SELECT on the audit tables (docs/AUDIT.md). SQLite has no roles: the
table exists only on Postgres, and no model describes it.
"""

from __future__ import annotations

TABLE = "audit_readers"
