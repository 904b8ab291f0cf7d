"""Messaging: topics, send (validation, dedup, queue choice), pull with long polling, query."""
