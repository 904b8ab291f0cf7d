"""Record formats, one module per format, side by side (pure functions, no I/O):

- ``v2``: record format version 2, the batch the producer builds and the commit log stores as
  it is: its byte layout, ``BatchBuilder`` and the broker's ``fill``;
- ``v2_read``: reading a v2 batch: ``split``, ``validate`` (strict for a client's batch,
  integrity for a stored one), ``decode_record``;
- ``stored``: stored-form pull answers (groups of stored v2 records), ``decode_stored``;
- ``events``: the transaction event body in ``TIDE_SYS_TRANS_EVENTS``.

Format version 1 (records the broker wrote before v2) is read only by the broker:
``tidemq_server.broker.store.records`` holds it beside the broker's other record code.
"""
