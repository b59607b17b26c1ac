"""What an operator's monitoring reads of the server (SPEC.md, section 11): the low-level
instruments every layer may use, importing no context of the domain.

- ``metrics``: the instruments updated as the server works (the runner's calls, the
  guardrail evaluations, the chain verification), in one process or across ``cstp serve``'s
  worker processes (``shared_dir``);
- ``tracing``: OpenTelemetry spans, off unless the ``OTEL_*`` variables ask for them;
- ``logs``: the JSON log lines of ``CSTP_LOG_FORMAT=json``.

What reads the domain lives with the other operators' routes in app/system/: ``metrics``
(``GET /metrics``), ``scrape`` (the series read from the database and the dependencies at
each scrape), ``dependencies`` (also /ready's) and ``chain_verification`` (the periodic
verification of the audit chain, ``CSTP_AUDIT_VERIFY_INTERVAL``).

The series (labels in braces; every label value comes from a bounded set: the server's
methods, faces and error codes, the operator's rule files, fixed statuses):

- ``cstp_calls_total{method,face,code}``: calls run; ``code`` is ``ok`` or the JSON-RPC error
  number (``-32602``); ``face`` is ``jsonrpc``, ``mcp`` or ``console``.
- ``cstp_call_duration_seconds{method}``: a histogram of their durations (buckets from a
  millisecond to two seconds).
- ``cstp_rate_limit_refusals_total{method}``: calls refused by the rate limit.
- ``cstp_guardrail_verdicts_total{rule,mode,verdict}``: rules that fired in an evaluation
  (``mode`` enforce or shadow, ``verdict`` block, warn or escalate).
- ``cstp_outbox_events{kind,status}``, ``cstp_webhook_deliveries{status}``,
  ``cstp_approvals{status}``, ``cstp_dependency_up{dependency}``,
  ``cstp_audit_chain_head_seq``: read at each scrape.
- ``cstp_audit_chain_problems``, ``cstp_audit_chain_verified_timestamp_seconds``: the last
  periodic verification's result; absent until a process has verified once.
"""
