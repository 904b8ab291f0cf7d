"""The broker's one write path: every record or batch it stores goes through ``Ingest``
(``writes.py``). Beside it: the outcome table (``outcome.py``), idempotent sends (``dedup.py``)
and the pure checks of a batch request (``checks.py``, ``halves.py``)."""
