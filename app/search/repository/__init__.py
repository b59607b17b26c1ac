"""Every statement app.search runs: the search filters in SQL (``filter_sql``), keyword
search over the full-text index (``keyword``) and the reads of ``cstp reindex``
(``reindex``). The search modules call them on the connection or session of a read they
opened; none builds a query of its own."""
