"""The broker's side of the record formats (the shared ones: ``tidemq.protocol.records``):

- ``v1``: record format version 1, encoded and decoded (segments written before v2);
- ``v2_own``: the broker's own records (sends in JSON or msgpack, commit copies, op and event
  records, retries, delays) encoded as v2 batches;
- ``entry``: log entries of either format, for the readers that meet both in one log;
- ``stored``: stored-form pull answers built from the log's bytes.
"""
