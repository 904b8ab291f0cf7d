"""Transactional messages: the model, the state table, producer requests, the check channel,
and the internal API the checker uses."""
