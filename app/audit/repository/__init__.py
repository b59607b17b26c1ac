"""The SQL of the audit context: ``entries`` holds the statements on the chain's own table
(appending, and the reads of verification and checkpoints); ``rows`` holds the reads of the
audited rows and of what coverage checks join them with. Functions take the connection they
run in; the callers own the transactions."""
