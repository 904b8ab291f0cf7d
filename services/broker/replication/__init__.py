"""Replication inside a broker group: log shipping, quorum acknowledgement, the role seam.

- ``role``: who this broker is (primary or replica, epoch, primary address), promote/demote and
  the write fence; the seam a failover controller (etcd) drives.
- ``epochs``: the epoch history file and where two histories diverge.
- ``quorum``: the primary's view of its replicas, the in-sync set and the high-water mark.
- ``gate``: every store write passes here (role, in-sync count, quorum wait, fence).
- ``follower``: a replica's fetch loop, writing the primary's bytes at the same offsets.
- ``source``: the primary's side of a fetch (raw log bytes from an offset, long-polled).
"""
