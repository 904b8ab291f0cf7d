"""The tidemq broker: the store, the REST API over it, consumer state in Redis.

``python -m tidemq_server.broker`` runs one broker (settings from ``TIDEMQ_BROKER_*``). Layout:
``store/`` (commit log, consume queues, index), ``service.py`` (the parts of a running broker),
one module per concern (``sending``, ``pulling``, ``query``, ``retry``, ``consumers``,
``internal``, ``topics``), ``routes/`` (thin FastAPI routers) and ``app.py`` (the app factory).
"""
