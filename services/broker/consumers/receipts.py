"""Receipt handles of the simple consumer: pure encode/decode, validated strictly.

A handle names one delivery of one message to one group. It is opaque to clients and url-safe:
base64url (no padding) of the bytes below. A new delivery (or a change of invisibility) draws a
new nonce, so an older handle of the same message no longer matches and is refused.

    offset  size  field
    0       1     version (1)
    1       4     queue id (u32)
    5       8     queue offset (u64)
    13      8     nonce (u64): this delivery
    21      4     crc32 of the group name: a handle used with another group is refused
    25      n     topic (utf-8, 1-127 bytes)
    25+n    4     crc32 of every byte before it
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

from tidemq.protocol import ErrorCode, ProtocolError
from tidemq.protocol.topics import TOPIC_NAME_RE

VERSION = 1
HEAD = struct.Struct(">BIQQI")  # version, queue id, offset, nonce, group crc
TAIL = struct.Struct(">I")  # crc32 of head + topic
MAX_TOPIC_BYTES = 127
MAX_HANDLE_CHARS = ((HEAD.size + MAX_TOPIC_BYTES + TAIL.size) * 4 + 2) // 3


@dataclass(frozen=True, slots=True)
class Receipt:
    """The decoded content of a receipt handle."""

    topic: str
    queue_id: int
    offset: int
    nonce: int
    group_crc: int

    def belongs_to(self, group: str) -> bool:
        return self.group_crc == group_crc(group)


def group_crc(group: str) -> int:
    return zlib.crc32(group.encode("utf-8"))


def encode_receipt(group: str, topic: str, queue_id: int, offset: int, nonce: int) -> str:
    head = HEAD.pack(VERSION, queue_id, offset, nonce, group_crc(group))
    body = head + topic.encode("utf-8")
    raw = body + TAIL.pack(zlib.crc32(body))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_receipt(handle: object) -> Receipt:
    """Parse a handle; anything but a handle this module produced → INVALID_RECEIPT_HANDLE."""
    if not isinstance(handle, str) or not handle or len(handle) > MAX_HANDLE_CHARS:
        raise _invalid(handle, "not a receipt handle string")
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise _invalid(handle, "not base64url") from exc
    canonical = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if canonical != handle:
        raise _invalid(handle, "not canonical base64url")
    if len(raw) < HEAD.size + 1 + TAIL.size:
        raise _invalid(handle, "too short")
    body, (crc,) = raw[: -TAIL.size], TAIL.unpack(raw[-TAIL.size :])
    if zlib.crc32(body) != crc:
        raise _invalid(handle, "checksum mismatch")
    version, queue_id, offset, nonce, gcrc = HEAD.unpack(body[: HEAD.size])
    if version != VERSION:
        raise _invalid(handle, f"unknown version {version}")
    try:
        topic = body[HEAD.size :].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(handle, "topic is not utf-8") from exc
    if not TOPIC_NAME_RE.match(topic):
        raise _invalid(handle, "bad topic name")
    return Receipt(topic=topic, queue_id=queue_id, offset=offset, nonce=nonce, group_crc=gcrc)


def _invalid(handle: object, why: str) -> ProtocolError:
    shown = handle[:24] + "..." if isinstance(handle, str) and len(handle) > 24 else handle
    return ProtocolError(ErrorCode.INVALID_RECEIPT_HANDLE,
                         f"receipt handle {shown!r} is malformed ({why}); "
                         "use a receipt_handle exactly as returned by receive")
