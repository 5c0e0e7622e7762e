"""The receive side that every incremental decoder of a byte stream shares: bytes kept until a
whole packet or frame is there, and a failure that sticks once the stream cannot be framed."""

from __future__ import annotations

from mypy_extensions import mypyc_attr

__all__ = ["ReceiveBuffer"]


# A compiled build compiles this class (`mop.compiled`); decoders that are not compiled subclass
# it too, which a compiled class allows only when it says so.
@mypyc_attr(allow_interpreted_subclasses=True)
class ReceiveBuffer:
    """Bytes received and not yet decoded, for a decoder that subclasses it.

    The decoder reads `_buf` from offset `_pos` and moves `_pos` past each unit it decodes; the
    bytes before `_pos` are dropped once per `feed`, not per unit, since many small units arrive
    in one read and deleting from the front of a bytearray is cheap. After `_fail(error)` the
    decoder raises `_error` on every call, and fed bytes are dropped.
    """

    __slots__ = ("_buf", "_error", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # start of the first undecoded byte in _buf
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Number of bytes received but not yet decoded."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray) -> None:
        if self._error is not None:
            return
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def _fail(self, error: Exception) -> None:
        self._error = error
        # A fresh buffer: the traceback may still hold views of the old one.
        self._buf = bytearray()
        self._pos = 0
