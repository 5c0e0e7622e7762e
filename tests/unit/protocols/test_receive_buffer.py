"""The receive buffer the MQTT and Pulsar decoders share (`mop.protocols.receive_buffer`)."""

from __future__ import annotations

import pytest

from mop.protocols.receive_buffer import ReceiveBuffer


class Lines(ReceiveBuffer):
    """A decoder of newline-terminated lines, enough to drive the buffer."""

    __slots__ = ()

    def next_line(self) -> bytes | None:
        if self._error is not None:
            raise self._error
        end = self._buf.find(b"\n", self._pos)
        if end < 0:
            return None
        line = bytes(self._buf[self._pos : end])
        if not line:
            self._fail(ValueError("empty line"))
            raise ValueError("empty line")
        self._pos = end + 1
        return line


def test_units_are_walked_by_offset_and_dropped_on_the_next_feed() -> None:
    lines = Lines()
    lines.feed(b"ab\ncd\nef")
    assert lines.buffered == 8
    assert [lines.next_line(), lines.next_line(), lines.next_line()] == [b"ab", b"cd", None]
    assert lines.buffered == 2
    lines.feed(bytearray(b"g\n"))
    assert lines._pos == 0 and lines._buf == b"efg\n"
    assert lines.next_line() == b"efg"
    assert lines.buffered == 0


def test_a_failure_sticks_and_later_bytes_are_dropped() -> None:
    lines = Lines()
    lines.feed(b"\nab\n")
    for _ in range(2):
        with pytest.raises(ValueError, match="empty line"):
            lines.next_line()
    lines.feed(b"more\n")
    assert lines.buffered == 0
