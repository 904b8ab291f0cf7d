"""``OneWrite``: a lean answer's head goes out with its body in one transport write; a
``100 Continue`` and later chunks are not held; a close sends a held head first."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq_server.common.door_http import OneWrite


@dataclass
class Transport:
    writes: list[bytes] = field(default_factory=list)
    closed: bool = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


@dataclass
class Cycle:
    response_started: bool = False


def test_head_and_body_are_one_write() -> None:
    t, cycle = Transport(), Cycle()
    w = OneWrite(t, cycle)
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response: straight through
    cycle.response_started = True
    w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert t.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    w.write(b"{}")
    assert t.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    w.write(b"more")  # a later chunk is not held
    assert t.writes[2:] == [b"more"] and not w.is_closing()


def test_a_close_sends_the_held_head_first() -> None:
    t, cycle = Transport(), Cycle(response_started=True)
    w = OneWrite(t, cycle)
    w.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    w.close()
    assert t.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"] and t.closed
