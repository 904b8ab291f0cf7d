"""The transaction checker: finds half messages nobody ended and asks their producers.

One asyncio process per deployment (``python -m tidemq_server.checker``), talking to its broker only
over the broker's ``/internal/v1/transactions/*`` endpoints; its only state is its progress in
Redis, so it can be killed and restarted at any moment.
"""
