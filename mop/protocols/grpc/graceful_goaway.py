"""Takes a client's graceful GOAWAY (NO_ERROR) out of the bytes it sends, before h2 reads them.

A client's GOAWAY NO_ERROR only says that it opens no more streams: its running calls go on.
h2, though, closes its whole connection state on any GOAWAY it reads and refuses to send
anything after it, so the calls running could not even send their trailers. The server state
machine (`connection`) therefore reads these GOAWAY frames itself and hands h2 the rest. A
GOAWAY with an error code, or one that breaks the framing rules, still goes to h2, which ends
the connection.
"""

from __future__ import annotations

from typing import Final

__all__ = ["GracefulGoawayFilter"]

# The client's connection preface (RFC 9113 3.4), which comes before the first frame.
_PREFACE_SIZE: Final = 24
_HEADER_SIZE: Final = 9
_GOAWAY: Final = 0x7
# Last-Stream-ID and Error Code, before any debug data.
_GOAWAY_FIXED: Final = 8
_NO_ERROR: Final = 0


class GracefulGoawayFilter:
    """Splits the client's byte stream into frames (headers only, bodies pass through as they
    come) and drops the graceful GOAWAY frames from it."""

    def __init__(self, max_frame_size: int) -> None:
        self._max_frame_size = max_frame_size
        self._preface_left = _PREFACE_SIZE
        # Bytes of the current frame's body still to pass through.
        self._body_left = 0
        # A frame header, or a whole GOAWAY frame, not complete yet.
        self._held = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What of `data` to give h2, and whether it held a graceful GOAWAY."""
        buffer = self._held + data if self._held else data
        self._held = b""
        kept: list[bytes] = []
        graceful = False
        position = 0
        if self._preface_left:
            taken = min(self._preface_left, len(buffer))
            kept.append(buffer[:taken])
            self._preface_left -= taken
            position = taken
        end = len(buffer)
        while position < end:
            if self._body_left:
                taken = min(self._body_left, end - position)
                kept.append(buffer[position : position + taken])
                self._body_left -= taken
                position += taken
                continue
            if end - position < _HEADER_SIZE:
                self._held = buffer[position:]
                break
            length = int.from_bytes(buffer[position : position + 3], "big")
            if self._is_goaway(buffer, position, length):
                if end - position < _HEADER_SIZE + length:
                    self._held = buffer[position:]
                    break
                code_at = position + _HEADER_SIZE + 4
                if int.from_bytes(buffer[code_at : code_at + 4], "big") == _NO_ERROR:
                    graceful = True
                    position += _HEADER_SIZE + length
                    continue
            kept.append(buffer[position : position + _HEADER_SIZE])
            position += _HEADER_SIZE
            self._body_left = length
        return b"".join(kept), graceful

    def _is_goaway(self, buffer: bytes, position: int, length: int) -> bool:
        """A well-formed GOAWAY (on stream 0, of a size h2 takes); h2 judges any other."""
        if buffer[position + 3] != _GOAWAY:
            return False
        stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
        return stream_id == 0 and _GOAWAY_FIXED <= length <= self._max_frame_size
